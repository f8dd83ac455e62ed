"""The one request path every generating route takes once its body is read (intake.py) and
its prompt built (prompting.py): the job's choices submitted, then the answer streamed
(queue notes, exactly one error event on failure, cancelled when the client leaves) or
collected whole (a client that leaves gets 499), timed, and its outcome recorded once
(outcome.py). The front-ends in api/ only parse a body into a Job and supply a Shape that
writes it in their API's format.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from appliance.engine.engine import Handle
from appliance.engine.events import Delta, Done, End, Event, Failed, Progress, Report
from appliance.engine.handle import answered
from appliance.engine.names import session_name
from appliance.engine.turn import Lane
from appliance.errors import ApplianceError, EngineFailure
from appliance.http.guard import Caller
from appliance.http.outcome import ran
from appliance.http.state import App
from appliance.http.validate import new_session_id
from appliance.http.wire import prompt_note
from appliance.model.prompt import Prompt
from appliance.sampling import SamplingParams

log = logging.getLogger(__name__)
QUEUE_NOTE_S = 1.0  # how often a queued stream hears ": queued N"
Answer = list[tuple[list[Delta], Done]]  # each choice's deltas and how it ended


class Review(Protocol):
    """What the server does to an answer besides passing it on (grounded.Check: a library
    chat's): answer itself instead of the model, add a note at the end of each choice's
    text once written whole, and give a whole answer's text as it is sent."""

    answer: str | None  # the server's own answer: nothing is queued, no slot is spent

    def note(self, i: int, text: str) -> str: ...
    def clean(self, i: int, text: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Job:
    """One request as the engine will run it: who asks, the prompt, one sampling set per
    choice (they share the prompt), the session the first choice continues, and whether the
    answer streams."""

    caller: Caller
    prompt: list[int] | Prompt
    params: tuple[SamplingParams, ...]
    stream: bool
    session: str = field(default_factory=new_session_id)
    named: bool = False  # the client named the session (it is kept and may be saved)
    report: Report = Report.NONE  # a stream's prompt reading it asked to hear of (llama-server's return_progress)
    lane: Lane = Lane.PEOPLE  # background work runs in the capacity people leave (http/lanes.py)
    review: Review | None = None  # a library chat's check of its answer (grounded.py)


def choices(params: SamplingParams, n: int) -> tuple[SamplingParams, ...]:
    """n sampling sets for n choices: with a seed, choice i samples with seed + i."""
    return tuple(dataclasses.replace(params, seed=params.seed + i) if i and params.seed is not None else params
                 for i in range(n))


class Shape(Protocol):
    """How one API writes an answer: the stream's media type and pieces, and a whole answer."""

    media_type: str
    notes: bool  # the stream can carry notes: queue places, a long prompt's progress (SSE comments; not NDJSON)

    def headers(self, stream: bool) -> dict[str, str]: ...
    def start(self) -> list[bytes]: ...
    def progress(self, i: int, ev: Progress) -> list[bytes]: ...  # what a stream asked to hear of its prompt
    def delta(self, i: int, ev: Delta) -> list[bytes]: ...
    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]: ...
    def close(self, ends: list[Done]) -> list[bytes]: ...
    def error(self, err: ApplianceError) -> bytes: ...
    def failed(self, err: ApplianceError) -> Response: ...
    async def whole(self, answer: Answer, timing: Timing) -> Response: ...


@dataclass(slots=True)
class Timing:
    """Wall-clock marks of one request (monotonic s): what Ollama's durations and
    llama-server's timings report. The first text marks the end of the prompt's work."""

    submitted: float = field(default_factory=time.monotonic)
    first: float = 0.0
    done: float = 0.0

    def saw_text(self) -> None:
        self.first = self.first or time.monotonic()

    def finish(self) -> None:
        self.done = time.monotonic()

    @property
    def prompt_s(self) -> float:
        return max(0.0, (self.first or self.done or time.monotonic()) - self.submitted)

    @property
    def predict_s(self) -> float:
        end = self.done or time.monotonic()
        return max(0.0, end - (self.first or end))

    @property
    def ttft_s(self) -> float | None:
        """Submitted to the first text (None if no text came)."""
        return self.first - self.submitted if self.first else None

    @property
    def total_s(self) -> float:
        return max(0.0, (self.done or time.monotonic()) - self.submitted)


# -- submitting ------------------------------------------------------------------------------
def submit(app: App, job: Job, progress: Report = Report.NONE) -> list[Handle]:
    """One engine request per choice. They are submitted together with one prompt, so the
    engine computes it once and the others copy its cells (kv/store.py's followers); only the
    first continues the session. A session the client did not name may still continue or
    share its own client's cached conversations by prefix, and nobody else's. With
    `progress`, the handles carry their prompt's Progress events (Report)."""
    if job.review is not None and job.review.answer is not None:
        return [answered(job.review.answer, job.lane) for _ in job.params]
    handles: list[Handle] = []
    ns = job.caller.namespace
    try:
        for i, params in enumerate(job.params):
            # The engine's name for a session is a digest of the caller's key and the id, so
            # another key's sessions are out of reach and no raw id is held, logged or saved.
            key = session_name(ns, job.session if i == 0 else new_session_id())
            handles.append(app.engine.submit(job.prompt, params, job.caller.client, key, named=i == 0 and job.named,
                                             progress=progress, lane=job.lane, front_end=job.caller.front_end))
    except ApplianceError:
        for h in handles:
            h.cancel()
        raise
    return handles


async def respond(app: App, request: Request, job: Job, shape: Shape) -> Response:
    """Submit the job, then stream its answer or collect it whole, as `shape` writes it. A
    refusal (over quota, a full queue, loading) is raised, counted where every route's
    refusals are (app.py: outcome.refused)."""
    timing = Timing()
    # Only a stream hears a prompt's progress, a long one's for its notes (a whole answer or
    # an NDJSON stream would have nothing to write it with), every one's if the job asked.
    report = max(job.report, Report.LONG if shape.notes else Report.NONE) if job.stream else Report.NONE
    app.usage.check(job.caller)  # the caller's daily quota
    job = dataclasses.replace(job, lane=request.scope.get("state", {}).get("lane", job.lane))  # intake decided it
    run = Run(app, job.caller, submit(app, job, report), timing, job.review)
    if job.stream:
        return StreamingResponse(guarded(stream(app, run, shape), run.handles, shape.error),
                                 media_type=shape.media_type, headers=shape.headers(True))
    result = await collect(request, run)
    if result is None:
        return Response(status_code=499)
    if isinstance(result, Failed):
        return shape.failed(result.error)
    return await shape.whole(result, timing)


class Run:
    """One request on the engine: its choices' events merged and followed (text, ends, a
    failure), and its end, which cancels what is left and records the outcome once."""

    def __init__(self, app: App, caller: Caller, handles: list[Handle], timing: Timing,
                 review: Review | None = None) -> None:
        self.app, self.caller, self.handles, self.timing = app, caller, handles, timing
        self.review = review
        self.texts: list[list[str]] = [[] for _ in handles]  # each choice's text, when reviewed
        self.ends: dict[int, Done] = {}
        self.failed: ApplianceError | None = None
        self._closed = False

    async def events(self, notes: bool) -> AsyncGenerator[tuple[int, Event] | None, None]:
        """merged(), followed: the first text and the last end mark the timing, and the
        last end feeds the queue notes' wait estimates."""
        async for got in merged(self.handles, notes):
            if self.review is None:  # every token of every chat that is not a library's: no list made
                if got is not None:
                    self._follow(*got)
                yield got
                continue
            for each in self._reviewed(got):
                if each is not None:
                    self._follow(*each)
                yield each

    def _follow(self, i: int, ev: Event) -> None:
        if isinstance(ev, Delta):
            self.timing.saw_text()
        elif isinstance(ev, Failed):
            self.failed = ev.error
        elif isinstance(ev, Done):
            self.ends[i] = ev
            if len(self.ends) == len(self.handles):
                self.timing.finish()

    def _reviewed(self, got: tuple[int, Event] | None) -> list[tuple[int, Event] | None]:
        """The event, and before a choice's end its review's note (a Delta of its own)."""
        if self.review is None or got is None:
            return [got]
        i, ev = got
        if isinstance(ev, Delta):
            self.texts[i].append(ev.text)
        elif isinstance(ev, Done) and ev.finish_reason != "cancelled":
            note = self.review.note(i, "".join(self.texts[i]))
            return [(i, Delta(note)), got] if note else [got]
        return [got]

    def close(self) -> None:
        """However the request ended (answered, failed, the client gone): every handle
        cancelled (a no-op after its end; a client that left frees its slots at the next
        step) and the outcome recorded, once."""
        if self._closed:
            return
        self._closed = True
        for h in self.handles:
            h.cancel()
        left = [] if self.failed else [h for i, h in enumerate(self.handles) if i not in self.ends]
        settle(self.app, self.caller, left, [self.ends[i] for i in sorted(self.ends)], self.timing, self.failed)


# -- streaming -------------------------------------------------------------------------------
async def merged(handles: Sequence[Handle], notes: bool) -> AsyncIterator[tuple[int, Event] | None]:
    """The choices' events as they come, tagged with the choice; with `notes`, None whenever
    nothing came for QUEUE_NOTE_S (the stream then says where it waits)."""
    events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    async def pump(i: int, h: Handle) -> None:
        async for ev in h.events():
            await events.put((i, ev))

    pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        ended = 0
        while ended < len(handles):
            try:
                got = await asyncio.wait_for(events.get(), QUEUE_NOTE_S if notes else None)
            except TimeoutError:
                yield None
                continue
            ended += isinstance(got[1], End)
            yield got
    finally:
        for task in pumps:
            task.cancel()


async def stream(app: App, run: Run, shape: Shape) -> AsyncGenerator[bytes, None]:
    reading: bytes | None = None  # the last prompt note, while the prompt is read
    try:
        for chunk in shape.start():
            yield chunk
        async with aclosing(run.events(shape.notes)) as events:
            async for got in events:
                if got is None:
                    # Waiting: a comment tells the user, and finds out if they left. A turn whose
                    # prompt is being read is running, not queued: it hears its progress again.
                    yield reading or app.queue_note(min((pos for h in run.handles if (pos := h.position)), default=0),
                                                    run.handles[0].lane is Lane.BACKGROUND)
                    continue
                i, ev = got
                if isinstance(ev, Failed):
                    # The 200 is already sent: the error travels as one event, then we close.
                    yield shape.error(ev.error)
                    return
                if isinstance(ev, Progress):
                    reading = prompt_note(ev.done, ev.total) if shape.notes and not run.timing.first else None
                    chunks = [reading, *shape.progress(i, ev)] if reading else shape.progress(i, ev)
                elif isinstance(ev, Delta):
                    reading = None
                    chunks = shape.delta(i, ev)
                else:
                    chunks = await shape.end(i, ev, run.timing)
                for chunk in chunks:
                    yield chunk
        run.close()  # before the stream's last bytes: a client that read them sees its usage
        for chunk in shape.close([run.ends[i] for i in sorted(run.ends)]):
            yield chunk
    finally:
        run.close()


async def guarded(chunks: AsyncGenerator[bytes, None], handles: Sequence[Handle],
                  error_event: Callable[[ApplianceError], bytes]) -> AsyncIterator[bytes]:
    """A response stream that ends in exactly one error event whatever goes wrong while it
    runs, as it does when the engine fails a request: the 200 is already sent, so the error
    can only travel in the stream (a cut connection would tell the client nothing). The
    requests are cancelled, so their slots are free at the next step."""
    async with aclosing(chunks):  # closed now, not whenever the collector gets to it
        try:
            async for chunk in chunks:
                yield chunk
            return
        except ApplianceError as e:
            log.warning("a response stream ended early: %s", e.message)
            err = e
        except Exception:
            log.exception("a response stream failed")
            err = EngineFailure("internal error; see the server log")
        for h in handles:
            h.cancel()  # no-op after Done
        yield error_event(err)


# -- collecting ------------------------------------------------------------------------------
async def collect(request: Request, run: Run) -> Answer | Failed | None:
    """Every choice's deltas and end, or the first failure; None if the client left first
    (its requests are then cancelled, so their slots are free at the next step)."""
    parts: list[list[Delta]] = [[] for _ in run.handles]

    async def read() -> Failed | None:
        async with aclosing(run.events(False)) as events:
            async for got in events:
                assert got is not None  # no notes asked for
                i, ev = got
                if isinstance(ev, Delta):
                    parts[i].append(ev)
                elif isinstance(ev, Failed):
                    return ev
                # Progress: not asked for (respond), and a whole answer has no place for one
        return None

    work = asyncio.ensure_future(read())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        waiters: set[asyncio.Future[Any]] = {work, gone}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()  # the client left
        run.close()
    if not work.done() or work.cancelled():
        return None
    return work.result() or [(cleaned(run.review, i, parts[i]), run.ends[i]) for i in range(len(run.handles))]


def cleaned(review: Review | None, i: int, deltas: list[Delta]) -> list[Delta]:
    """A whole answer's deltas as sent: one, of the text its review gives (grounded.Check:
    without the [n] its sources do not support), with every token and logprob."""
    if review is None:
        return deltas
    text = "".join(d.text for d in deltas)
    return [Delta(review.clean(i, text), [lp for d in deltas for lp in d.logprobs], [t for d in deltas for t in d.tokens])]


_settling: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)
SETTLE_S = 10.0  # a cancelled request's end arrives at the engine's next step


def settle(app: App, caller: Caller, handles: Sequence[Handle], ends: list[Done], timing: Timing,
           failed: ApplianceError | None = None) -> None:
    """The request's outcome recorded (outcome.ran): at once, or, when the client left
    choices unfinished (cancelled), once their ends arrive, in the background, so what the
    engine generated before the cancel is counted in usage, as /metrics counts it."""
    def record(got: list[Done]) -> None:
        ran(app, caller, got, timing.ttft_s, failed)

    if not handles:
        record(ends)
        return

    async def wait() -> None:
        got = list(ends)
        for h in handles:
            while (ev := await h.next(SETTLE_S)) is not None and isinstance(ev, (Delta, Progress)):
                pass
            if isinstance(ev, Done):
                got.append(ev)
        record(got)

    waiting = wait()
    try:
        task = asyncio.ensure_future(waiting)
    except RuntimeError:  # no running loop: a stream finalized at shutdown; nothing left to count
        waiting.close()
        return
    _settling.add(task)
    task.add_done_callback(_settling.discard)


async def disconnected(request: Request) -> None:
    """Returns when a client waiting for a whole (non-streamed) answer goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
