"""The one request path every generating route takes: intake (the body read and parsed
under the parse gate), the job's choices submitted, then the answer streamed (queue notes,
exactly one error event on failure, cancelled when the client leaves) or collected whole (a
client that leaves gets 499), timed. The front-ends in api/ only parse a body into a Job
and supply a Shape that writes it in their API's format.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from appliance.engine.engine import Handle
from appliance.engine.events import Delta, Done, End, Event, Failed, Progress, Report
from appliance.engine.names import session_name
from appliance.errors import ApplianceError, EngineFailure, PayloadTooLarge
from appliance.http.guard import Caller, caller_of
from appliance.http.resolve import check_grammar
from appliance.http.state import App
from appliance.http.validate import MAX_BODY_BYTES, new_session_id, parse_json, precheck
from appliance.http.wire import prompt_note
from appliance.model.prompt import Prompt
from appliance.sampling import SamplingParams

log = logging.getLogger(__name__)
QUEUE_NOTE_S = 1.0  # how often a queued stream hears ": queued N"
THREAD_PARSE_BYTES = 64 * 1024  # larger bodies are parsed off the event loop
T = TypeVar("T")
Answer = list[tuple[list[Delta], Done]]  # each choice's deltas and how it ended


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


# -- intake ----------------------------------------------------------------------------------
@asynccontextmanager
async def intake(app: App, request: Request, parse: Callable[[dict[str, Any]], T]) -> AsyncIterator[tuple[Caller, T]]:
    """The caller and its body, read and parsed (`parse` validates the JSON object) under the
    parse gate; the gate stays held for the block, where the front-end tokenizes or
    templates. Refusals with a code are counted."""
    caller = caller_of(request.scope["state"])
    # Reading, parsing and tokenizing are bounded per client and in all before they start.
    async with app.gate.permit(caller.client):
        try:
            body = await read_body(request)
            precheck(body, app.bounds.max_messages)  # a few ms for 4 MiB, and no GIL held for long

            def parsed() -> T:
                return parse(parse_json(body))

            # A 4 MiB body takes tens of ms to parse and check: not on the event loop.
            yield caller, await asyncio.to_thread(parsed) if len(body) > THREAD_PARSE_BYTES else parsed()
        except ApplianceError as e:
            if e.code:
                app.refused(e.code)
            raise


async def read_body(request: Request) -> bytes:
    if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", code="body_too_large")
    body = bytearray()
    async for part in request.stream():  # bounded even without a Content-Length
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB",
                                  code="body_too_large")
    return bytes(body)


async def templated(app: App, messages: list[dict[str, Any]], params: SamplingParams,
                    tools: list[dict[str, Any]] | None, grammar_param: str | None = None) -> Prompt:
    """Messages through the chat template (cut to leave room for max_tokens), and the answer's
    grammar checked, before anything is queued."""
    prompt = await app.engine.prepare(messages, params.max_tokens, tools)
    await check_grammar(app, params.grammar, grammar_param)
    return prompt


# -- submitting ------------------------------------------------------------------------------
def submit(app: App, job: Job, progress: Report = Report.NONE) -> list[Handle]:
    """One engine request per choice. They are submitted together with one prompt, so the
    engine computes it once and the others copy its cells (kvstore's followers); only the
    first continues the session. A session the client did not name may still continue or
    share its own client's cached conversations by prefix, and nobody else's. With
    `progress`, the handles carry their prompt's Progress events (Report)."""
    handles: list[Handle] = []
    ns = job.caller.namespace
    try:
        for i, params in enumerate(job.params):
            # The engine's name for a session is a digest of the caller's key and the id, so
            # another key's sessions are out of reach and no raw id is held, logged or saved.
            key = session_name(ns, job.session if i == 0 else new_session_id())
            handles.append(app.engine.submit(job.prompt, params, job.caller.client, key, named=i == 0 and job.named,
                                             progress=progress))
    except ApplianceError:
        for h in handles:
            h.cancel()
        raise
    return handles


async def respond(app: App, request: Request, job: Job, shape: Shape) -> Response:
    """Submit the job, then stream its answer or collect it whole, as `shape` writes it."""
    timing = Timing()
    # Only a stream hears a prompt's progress, a long one's for its notes (a whole answer or
    # an NDJSON stream would have nothing to write it with), every one's if the job asked.
    report = max(job.report, Report.LONG if shape.notes else Report.NONE) if job.stream else Report.NONE
    handles = admit(app, job, progress=report)
    if job.stream:
        return StreamingResponse(guarded(stream(app, handles, shape, timing, job.caller), handles, shape.error),
                                 media_type=shape.media_type, headers=shape.headers(True))
    result = await collect(app, request, handles, timing, job.caller)
    if result is None:
        return Response(status_code=499)
    if isinstance(result, Failed):
        app.usage.refused(job.caller, result.error)
        return shape.failed(result.error)
    app.usage.ended(job.caller, [done for _, done in result], timing.ttft_s)
    return await shape.whole(result, timing)


def admit(app: App, job: Job, progress: Report = Report.NONE) -> list[Handle]:
    """The caller's daily quota checked, then the job submitted; a refusal (over quota, a
    full queue, loading) is counted in the caller's usage."""
    try:
        app.usage.check(job.caller)
        return submit(app, job, progress)
    except ApplianceError as e:
        if e.code == "quota_exceeded":
            app.refused(e.code)  # /metrics; the engine counts its own refusals
        app.usage.refused(job.caller, e)
        raise


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


async def stream(app: App, handles: list[Handle], shape: Shape, timing: Timing,
                 caller: Caller) -> AsyncGenerator[bytes, None]:
    ends: dict[int, Done] = {}
    failed = False
    reading: bytes | None = None  # the last prompt note, while the prompt is read
    try:
        for chunk in shape.start():
            yield chunk
        async for got in merged(handles, shape.notes):
            if got is None:
                # Waiting: a comment tells the user, and finds out if they left. A turn whose
                # prompt is being read is running, not queued: it hears its progress again.
                yield reading or app.queue_note(min((pos for h in handles if (pos := h.position)), default=0))
                continue
            i, ev = got
            if isinstance(ev, Failed):
                # The 200 is already sent: the error travels as one event, then we close.
                failed = True
                app.usage.refused(caller, ev.error)
                yield shape.error(ev.error)
                return
            if isinstance(ev, Progress):
                reading = prompt_note(ev.done, ev.total) if shape.notes and not timing.first else None
                chunks = [reading, *shape.progress(i, ev)] if reading else shape.progress(i, ev)
            elif isinstance(ev, Delta):
                timing.saw_text()
                reading = None
                chunks = shape.delta(i, ev)
            else:
                chunks = await _ended(app, handles, shape, timing, ends, i, ev, caller)
            for chunk in chunks:
                yield chunk
        for chunk in shape.close([ends[i] for i in sorted(ends)]):
            yield chunk
    finally:
        for h in handles:
            h.cancel()  # no-op after Done; frees the slot if the client went away
        if not failed and len(ends) < len(handles):
            settle(app, caller, [h for i, h in enumerate(handles) if i not in ends], list(ends.values()), timing)


async def _ended(app: App, handles: list[Handle], shape: Shape, timing: Timing, ends: dict[int, Done],
                 i: int, done: Done, caller: Caller) -> list[bytes]:
    """Choice i's end, as the shape writes it; the last one marks the request done (and
    counts it in the caller's usage)."""
    ends[i] = done
    if len(ends) == len(handles):
        timing.finish()
        app.usage.ended(caller, list(ends.values()), timing.ttft_s)
    return await shape.end(i, done, timing)


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
async def collect(app: App, request: Request, handles: list[Handle], timing: Timing,
                  caller: Caller) -> Answer | Failed | None:
    """Every choice's deltas and end, or the first failure; None if the client left first
    (its requests are then cancelled, so their slots are free at the next step)."""
    async def answer(h: Handle) -> tuple[list[Delta], Done] | Failed:
        parts: list[Delta] = []
        async for ev in h.events():
            if isinstance(ev, Delta):
                timing.saw_text()
                parts.append(ev)
                continue
            if isinstance(ev, Progress):
                continue  # not asked for (respond), and a whole answer has no place for one
            timing.finish()
            return (parts, ev) if isinstance(ev, Done) else ev
        raise EngineFailure("the engine ended the request without an answer")

    work = asyncio.ensure_future(asyncio.gather(*(answer(h) for h in handles)))
    gone = asyncio.ensure_future(disconnected(request))
    try:
        waiters: set[asyncio.Future[Any]] = {work, gone}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            for h in handles:
                h.cancel()  # the client left: free its slots at the next step
            work.cancel()
            # A cancelled gather() ends holding its children's CancelledError as its
            # exception: fetch it, or asyncio logs "exception was never retrieved".
            work.add_done_callback(lambda f: f.cancelled() or f.exception())
            settle(app, caller, handles, [], timing)
    if not work.done() or work.cancelled():
        return None
    results = work.result()
    failed = next((r for r in results if isinstance(r, Failed)), None)
    if failed is not None:
        return failed
    return [r for r in results if not isinstance(r, Failed)]


_settling: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)
SETTLE_S = 10.0  # a cancelled request's end arrives at the engine's next step


def settle(app: App, caller: Caller, handles: Sequence[Handle], ends: list[Done], timing: Timing) -> None:
    """A request the client left (cancelled): its remaining choices' ends are awaited in the
    background, so what the engine generated before the cancel is counted in usage, as
    /metrics counts it."""
    async def wait() -> None:
        got = list(ends)
        for h in handles:
            while (ev := await h.next(SETTLE_S)) is not None and isinstance(ev, Delta):
                pass
            if isinstance(ev, Done):
                got.append(ev)
        if got:
            app.usage.ended(caller, got, timing.ttft_s)

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
