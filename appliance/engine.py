"""The engine thread: owns the llama context, runs admit -> schedule -> decode -> sample in
a loop, keeps finished conversations' KV in the session cache, and hands text to the
waiting HTTP streams on the asyncio loop.

The HTTP side only calls `prepare`, `submit`, `cancel`, the session calls and reads
`stats`; it never touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from itertools import count
from typing import Any, AsyncIterator, Callable, Protocol

from .cache import SessionCache
from .kvstore import CachePolicy, KVStore
from .errors import ApplianceError, EngineFailure, KVCacheFull, QueueFull, Unavailable
from .prompt import ChatTemplate, Prompt, build_prompt
from .sampling import SamplingParams
from .scheduler import Limits, Scheduler, Step
from .sequence import Delta, Done, Failed, Sequence, State
from .textstream import TextStream

log = logging.getLogger(__name__)
Events = list[tuple[Callable[[Any], None], Any]]


class Model(Protocol):
    """What the engine needs from llm.LLM; unit tests supply a fake."""

    tokenizer: Any
    fingerprint: str  # model + llama.cpp version + KV type: what saved state must match

    def decode(self, tokens: list[int], pos: list[int], seq: list[int], logits: list[bool]) -> None: ...
    def sample_all(self, picks: list[tuple[Any, int]]) -> list[int]: ...
    def new_sampler(self, params: SamplingParams) -> Any: ...
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_pos_max(self, seq: int) -> int: ...
    def seq_state(self, seq: int) -> bytes: ...
    def set_seq_state(self, seq: int, data: bytes) -> bool: ...
    def close(self) -> None: ...


class EngineState(Enum):
    LOADING = "loading"
    READY = "ok"
    DRAINING = "draining"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(slots=True)
class Stats:
    steps: int = 0
    peak_seqs_per_step: int = 0
    prompt_tokens_received: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    # Recent steps as (decode seqs, prefill seqs, prefill tokens): shows that a long
    # prefill never stalls the streams already generating.
    step_log: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=4096))


class Handle:
    """The HTTP side of one request: an async stream of Delta, then Done or Failed."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self.seq = seq
        self._queue: asyncio.Queue[Delta | Done | Failed] = asyncio.Queue()
        seq.sink = self._queue.put_nowait  # called on the loop thread only

    async def events(self) -> AsyncIterator[Delta | Done | Failed]:
        while True:
            ev = await self._queue.get()
            yield ev
            if not isinstance(ev, Delta):
                return

    async def next(self, timeout: float) -> Delta | Done | Failed | None:
        """The next event, or None after `timeout` seconds (cancelling a queue get is safe)."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    @property
    def position(self) -> int:
        return self._engine.queue_position(self.seq)

    def cancel(self) -> None:
        self._engine.cancel(self.seq)


class Engine:
    def __init__(
        self,
        model_factory: Callable[[], Model],
        limits: Limits,
        cache: CachePolicy | None = None,
        *,
        request_timeout_s: float = 600.0,
        pin: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
        on_fatal: Callable[[], None] = lambda: None,
    ) -> None:
        self._factory = model_factory
        self._pin = pin
        self.metrics = metrics  # metrics.Metrics or None; observed from this thread
        self.on_fatal = on_fatal
        self.limits = limits
        self.policy = cache or CachePolicy(n_seq=limits.slots + 1)
        assert self.policy.n_seq > limits.slots, "need more sequence ids than slots"
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.sched = Scheduler(limits, clock)
        self.cache = SessionCache(range(self.policy.n_seq), clock, self.policy.ttl_s,
                                  self.policy.share_all, self.policy.park_bytes)
        self.stats = Stats()
        self.state = EngineState.LOADING
        self.load_error = ""
        self.model: Model | None = None
        self.template: ChatTemplate | None = None
        self.kv: KVStore | None = None  # made with the model, in the engine thread
        self.ready = threading.Event()
        self._cv = threading.Condition()
        self._inbox: deque[Sequence | Callable[[], None]] = deque()
        self._n_queued = 0  # inbox + waiting, checked against max_queue at submit
        self._per_client: dict[str, int] = {}  # running + queued, under _cv
        self._stop = False
        self._closed = False  # set under _cv when the engine stops taking requests
        self._ids = count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    # -- lifecycle (loop thread) ---------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread.start()

    def drain(self) -> None:
        """Stop admitting new requests; running and queued ones carry on."""
        if self.state is EngineState.READY:
            self.state = EngineState.DRAINING

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def n_active(self) -> int:
        return len(self.sched.running) + self._n_queued

    # -- requests (loop thread) ----------------------------------------------------------
    def prompt_limit(self, max_tokens: int) -> int:
        """Prompt tokens allowed so that some room is left for the answer."""
        ctx = self.limits.ctx_limit
        return ctx - min(max_tokens, ctx // 4)

    async def prepare(self, messages: list[dict[str, Any]], max_tokens: int) -> Prompt:
        self._check_accepting()
        assert self.template is not None and self.model is not None
        tok = self.model.tokenizer
        # Templating and tokenizing a long paste takes milliseconds: off the event loop.
        return await asyncio.to_thread(
            build_prompt, messages, self.template, tok.tokenize, self.prompt_limit(max_tokens))

    def submit(self, prompt: list[int] | Prompt, params: SamplingParams, client: str = "",
               session: str = "", named: bool = True) -> Handle:
        self._check_accepting()
        if isinstance(prompt, Prompt):
            tokens, shared = prompt.tokens, prompt.shared_len
        else:
            tokens, shared = prompt, 0
        rid = next(self._ids)
        seq = Sequence(rid=rid, prompt=tokens, params=params, arrival=self.clock(),
                       client=client, session=session or f"anon-{rid}", shared_len=shared,
                       named=named and bool(session))
        handle = Handle(self, seq)
        with self._cv:
            if self._closed:
                raise Unavailable("the server is shutting down", retry_after=10)
            if self._n_queued >= self.limits.max_queue:
                if self.metrics:
                    self.metrics.rejected.labels("queue_full").inc()
                raise QueueFull(f"the server is busy: {self._n_queued} requests are queued", retry_after=2)
            cap = self.limits.max_per_client
            if cap and self._per_client.get(client, 0) >= cap:
                if self.metrics:
                    self.metrics.rejected.labels("client_cap").inc()
                raise QueueFull(f"at most {cap} requests at once per client", retry_after=2)
            self._per_client[client] = self._per_client.get(client, 0) + 1
            self._n_queued += 1
            self._inbox.append(seq)
            self._cv.notify()
        return handle

    def cancel(self, seq: Sequence) -> None:
        # A flag read by the engine at its next step; no lock needed for a bool.
        if seq.state is not State.FINISHED:
            seq.cancelled = True
            with self._cv:
                self._cv.notify()

    def queue_position(self, seq: Sequence) -> int:
        """1-based place in the queue (0 once admitted); a racy read, for `: queued N`."""
        if seq.state is not State.WAITING:
            return 0
        for i, s in enumerate(list(self.sched.waiting)):  # list(): a C-level copy, atomic
            if s is seq:
                return i + 1
        return len(self.sched.waiting) + 1  # still in the inbox

    def session_info(self, session: str) -> dict[str, Any] | None:
        """A snapshot for GET /v1/sessions/{id} (a racy read is fine for a report)."""
        e = self.cache.entries.get(session)
        if e is None:
            return None
        parked = e.parked  # read once: the engine may restore it meanwhile
        state = ("active" if e.busy else "parked" if parked is not None else "saved" if e.disk is not None
                 else "cached")
        return {"id": session, "state": state, "cached_tokens": e.n_tokens,
                "parked_bytes": len(parked) if parked is not None else 0,
                "idle_s": round(max(0.0, self.clock() - e.last_used), 3)}

    def delete_session(self, session: str) -> bool:
        """Forget a session's cache, including what its turns in flight would leave."""
        with self._cv:
            in_flight = any(isinstance(s, Sequence) and s.session == session for s in self._inbox)
        in_flight = in_flight or any(s.session == session
                                     for s in (*list(self.sched.running), *list(self.sched.waiting)))
        existed = session in self.cache.entries or in_flight
        self._command(lambda: self.kv.drop_session(session))
        return existed

    def _command(self, fn: Callable[[], None]) -> None:
        with self._cv:
            self._inbox.append(fn)
            self._cv.notify()

    def _check_accepting(self) -> None:
        if self.state is EngineState.LOADING:
            raise Unavailable("the model is still loading", retry_after=5)
        if self.state is EngineState.DRAINING:
            raise Unavailable("the server is shutting down", retry_after=10)
        if self.state is not EngineState.READY:
            raise Unavailable(f"the engine is not running: {self.load_error or self.state.value}")

    # -- the engine thread ---------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._pin()  # before the context exists, so llama.cpp's workers inherit it
            self.model = self._factory()
            tok = self.model.tokenizer
            self.template = ChatTemplate(tok.chat_template, tok.bos_text, tok.eos_text)
            self._warm_up()
            self.kv = KVStore(self.model, self.cache, self.policy, self.sched, self.limits.kv_tokens, self.clock)
            self.kv.load_sessions()
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            log.error("engine failed to start: %s", e)  # one line for the user...
            log.debug("engine start failure", exc_info=True)  # ...the traceback for us
            self.load_error = str(e)
            self.state = EngineState.FAILED
            self.ready.set()
            self.on_fatal()
            return
        self.state = EngineState.READY
        self.ready.set()
        log.info("engine ready: %d slots, %d KV tokens, %d sequence ids",
                 self.limits.slots, self.limits.kv_tokens, self.policy.n_seq)
        try:
            self._loop_forever()
        except Exception as e:  # noqa: BLE001
            # Must never happen; if it does, fail every stream rather than hang them.
            log.exception("engine loop crashed")
            self.load_error = f"engine crashed: {e}"
            self.state = EngineState.FAILED
            self._fail_all(EngineFailure("the engine stopped unexpectedly"))
            self.on_fatal()  # let the process exit non-zero so a supervisor restarts it
        finally:
            if self.state is not EngineState.FAILED:
                self._fail_all(Unavailable("the server is shutting down"))
                if self.kv is not None:
                    self.kv.save_sessions()
                self.state = EngineState.STOPPED
            self.model.close()

    def _warm_up(self) -> None:
        # The first decode allocates compute buffers and starts the thread pool; do it
        # before reporting ready so the first user does not pay for it.
        assert self.model is not None
        self.model.decode([0], [0], [0], [True])
        self.model.seq_rm(0)

    def _loop_forever(self) -> None:
        while True:
            commands: list[Callable[[], None]] = []
            with self._cv:
                if self._stop:
                    return
                while self._inbox:
                    item = self._inbox.popleft()
                    if isinstance(item, Sequence):
                        item.continuing = item.session in self.cache.entries
                        self.sched.waiting.append(item)
                    else:
                        commands.append(item)
            for command in commands:
                command()
            events: Events = []
            self.kv.expire()
            for seq, err, was_waiting in self.sched.expired():
                if was_waiting:
                    with self._cv:
                        self._n_queued -= 1
                self._finished(seq, events, "queue_timeout" if err else "cancelled", err)
            admitted = self.sched.admit()
            if admitted:
                # Room first (their reservations now count), so a restore finds free cells.
                self.kv.make_room()
            for seq in admitted:
                with self._cv:
                    self._n_queued -= 1
                if self.metrics:
                    self.metrics.queue_wait.observe(seq.admitted_at - seq.arrival)
                try:
                    self.kv.attach(seq)
                    seq.sampler = self.model.new_sampler(seq.params)
                except Exception as e:  # noqa: BLE001 - fail this request, keep serving
                    log.exception("could not start request %d", seq.rid)
                    self._finished(seq, events, "error", EngineFailure(f"could not start the request: {e}"))
                    continue
                seq.text = TextStream(seq.params.stop)
                self.stats.prompt_tokens_received += seq.n_prompt
            self.kv.resolve_followers()
            step = self.sched.schedule()
            if step.n_seqs:
                self._run_step(step, events)
            self._emit(events)
            if not step.n_seqs:
                self._idle_wait()

    def _idle_wait(self) -> None:
        closes = self.sched.window_open_until()
        timeout = max(0.0, closes - self.clock()) if closes is not None else 1.0
        with self._cv:
            if not self._inbox and not self._stop and not self._any_cancelled():
                self._cv.wait(timeout)

    def _any_cancelled(self) -> bool:
        return any(s.cancelled for s in self.sched.waiting) or any(s.cancelled for s in self.sched.running)

    # -- the step ------------------------------------------------------------------------
    def _run_step(self, step: Step, events: Events) -> None:
        model = self.model
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        want: list[bool] = []
        rows: list[tuple[Sequence, int]] = []
        for s in step.decode:
            rows.append((s, len(tokens)))
            tokens.append(s.last_token)
            pos.append(s.n_cached)
            seqs.append(s.seq_id)
            want.append(True)
        for s, n in step.prefill:
            start = s.n_cached
            tokens.extend(s.prompt[start:start + n])
            pos.extend(range(start, start + n))
            seqs.extend([s.seq_id] * n)
            want.extend([False] * n)
            if start + n == s.n_prompt:  # prompt complete: sample its first token
                want[-1] = True
                rows.append((s, len(tokens) - 1))
        t0 = time.monotonic()
        try:
            while True:
                try:
                    model.decode(tokens, pos, seqs, want)
                    break
                except KVCacheFull:
                    if not self.kv.evict_lru():
                        raise  # make room, then try the same batch again
        except Exception as e:  # noqa: BLE001 - fail this step's sequences, keep serving
            log.error("decode of %d tokens failed: %s", len(tokens), e)
            err = (Unavailable("the KV cache is full; try again shortly", retry_after=5)
                   if isinstance(e, KVCacheFull) else EngineFailure(f"decoding failed: {e}"))
            involved = [*step.decode, *(s for s, _ in step.prefill)]
            # If only some sequences are inconsistent with the cache, fail just those: the
            # others go again next step instead of every user losing their answer.
            broken = [s for s in involved if self.model.seq_pos_max(s.seq_id) != s.n_cached - 1]
            for s in broken or involved:
                self._finished(s, events, "error", err)
            return
        st = self.stats
        st.steps += 1
        st.peak_seqs_per_step = max(st.peak_seqs_per_step, step.n_seqs)
        n_prefill = len(tokens) - len(step.decode)
        st.prompt_tokens_computed += n_prefill
        st.step_log.append((len(step.decode), len(step.prefill), n_prefill))
        if self.metrics:
            self.metrics.seqs_per_step.observe(step.n_seqs)
            self.metrics.step_seconds.observe(time.monotonic() - t0)
        for s in step.decode:
            s.n_cached += 1
        for s, n in step.prefill:
            s.n_cached += n
        now = self.clock()
        sampled = model.sample_all([(s.sampler, row) for s, row in rows])
        for (s, _), tok in zip(rows, sampled):
            self._accept(s, tok, now, events)

    def _accept(self, s: Sequence, tok: int, now: float, events: Events) -> None:
        s.state = State.DECODE
        tokenizer = self.model.tokenizer
        if tokenizer.is_eog(tok):
            self._finished(s, events, "stop")
            return
        s.output.append(tok)
        self.stats.generated_tokens += 1
        text = s.text.push(tokenizer.piece(tok))
        if text:
            if self.metrics:
                if s.first_token_at:
                    self.metrics.itl.observe(now - s.last_emit_at)
                else:
                    self.metrics.ttft.observe(now - s.arrival)
            if not s.first_token_at:
                s.first_token_at = now
            s.last_emit_at = now
            events.append((s.sink, Delta(text)))
        if s.text.stopped:
            self._finished(s, events, "stop")
        elif (len(s.output) >= s.params.max_tokens
              or s.n_cached + 1 >= self.limits.ctx_limit
              or now - s.arrival > self.request_timeout_s):
            self._finished(s, events, "length")

    def _finished(self, s: Sequence, events: Events, reason: str, error: ApplianceError | None = None) -> None:
        self.sched.release(s)
        with self._cv:
            left = self._per_client.get(s.client, 1) - 1
            if left > 0:
                self._per_client[s.client] = left
            else:
                self._per_client.pop(s.client, None)
        s.leader = None
        if s.seq_id >= 0:
            self.kv.keep_or_free(s, keep=error is None and s.n_cached > 0)
            s.seq_id = -1
        if s.sampler is not None:
            s.sampler.free()
            s.sampler = None
        s.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        if log.isEnabledFor(logging.INFO):
            # One line per request for the operator. The session id is a bearer secret:
            # log a short digest of it, enough to follow one conversation.
            now = self.clock()
            ttft = f"{(s.first_token_at - s.arrival) * 1000:.0f} ms" if s.first_token_at else "-"
            log.info("request %d session %s client %s: %s%s, prompt %d (reused %d), output %d, "
                     "first token %s, total %.1f s", s.rid, hashlib.sha256(s.session.encode()).hexdigest()[:8],
                     s.client or "-", reason, f" ({error.status})" if error else "", s.n_prompt, s.n_reused,
                     len(s.output), ttft, now - s.arrival)
        if error is not None:
            events.append((s.sink, Failed(error)))
            return
        tail = s.text.flush() if s.text is not None else ""
        if tail:
            events.append((s.sink, Delta(tail)))
        events.append((s.sink, Done(reason, s.n_prompt, len(s.output), s.n_reused)))

    def _fail_all(self, error: ApplianceError) -> None:
        events: Events = []
        with self._cv:
            self._closed = True  # submit() checks this under the same lock: nothing slips in
            pending = [s for s in self._inbox if isinstance(s, Sequence)]
            self._inbox.clear()
        for s in pending + list(self.sched.waiting) + list(self.sched.running):
            if s.state is not State.FINISHED:
                self.sched.release(s)
                s.state = State.FINISHED
                events.append((s.sink, Failed(error)))
        self.sched.waiting.clear()
        self._emit(events)

    def _emit(self, events: Events) -> None:
        # One hand-off per step, not per token: call_soon_threadsafe wakes the loop.
        if events and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, events)


def _deliver(events: Events) -> None:
    for sink, ev in events:
        sink(ev)
