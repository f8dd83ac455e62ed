"""The engine thread: owns the llama context, runs admit -> schedule -> decode -> sample in
a loop, and hands text to the waiting HTTP streams on the asyncio loop.

The HTTP side only calls `prepare`, `submit`, `cancel` and reads `stats`; it never touches
llama.cpp.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from itertools import count
from typing import Any, AsyncIterator, Callable, Protocol

from .errors import ApplianceError, EngineFailure, QueueFull, Unavailable
from .prompt import ChatTemplate, Prompt, build_prompt
from .sampling import SamplingParams
from .scheduler import Limits, Scheduler, Step
from .sequence import Delta, Done, Failed, Sequence, State
from .textstream import TextStream

log = logging.getLogger(__name__)


class Model(Protocol):
    """What the engine needs from llm.LLM; unit tests supply a fake."""

    tokenizer: Any

    def decode(self, tokens: list[int], pos: list[int], seq: list[int], logits: list[bool]) -> None: ...
    def sample(self, sampler: Any, row: int) -> int: ...
    def new_sampler(self, params: SamplingParams) -> Any: ...
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...
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

    def cancel(self) -> None:
        self._engine.cancel(self.seq)


class Engine:
    def __init__(
        self,
        model_factory: Callable[[], Model],
        limits: Limits,
        *,
        request_timeout_s: float = 600.0,
        pin: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = model_factory
        self._pin = pin
        self.limits = limits
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.sched = Scheduler(limits, clock)
        self.stats = Stats()
        self.state = EngineState.LOADING
        self.load_error = ""
        self.model: Model | None = None
        self.template: ChatTemplate | None = None
        self.ready = threading.Event()
        self._cv = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._n_queued = 0  # inbox + waiting, checked against max_queue at submit
        self._stop = False
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

    def submit(self, prompt: list[int], params: SamplingParams, client: str = "") -> Handle:
        self._check_accepting()
        seq = Sequence(rid=next(self._ids), prompt=prompt, params=params, arrival=self.clock(), client=client)
        handle = Handle(self, seq)
        with self._cv:
            if self._n_queued >= self.limits.max_queue:
                raise QueueFull(f"the server is busy: {self._n_queued} requests are queued", retry_after=2)
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
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            log.exception("engine failed to start")
            self.load_error = str(e)
            self.state = EngineState.FAILED
            self.ready.set()
            return
        self.state = EngineState.READY
        self.ready.set()
        log.info("engine ready: %d slots, %d KV tokens", self.limits.slots, self.limits.kv_tokens)
        try:
            self._loop_forever()
        except Exception as e:  # noqa: BLE001
            # Must never happen; if it does, fail every stream rather than hang them.
            log.exception("engine loop crashed")
            self.load_error = f"engine crashed: {e}"
            self.state = EngineState.FAILED
            self._fail_all(EngineFailure("the engine stopped unexpectedly"))
        finally:
            if self.state is not EngineState.FAILED:
                self._fail_all(Unavailable("the server is shutting down"))
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
            with self._cv:
                if self._stop:
                    return
                while self._inbox:
                    self.sched.waiting.append(self._inbox.popleft())
            events: list[tuple[Callable[[Any], None], Any]] = []
            for seq, err, was_waiting in self.sched.expired():
                if was_waiting:
                    with self._cv:
                        self._n_queued -= 1
                self._finished(seq, events, "cancelled", err)
            for seq in self.sched.admit():
                with self._cv:
                    self._n_queued -= 1
                seq.sampler = self.model.new_sampler(seq.params)
                seq.text = TextStream(seq.params.stop)
                self.stats.prompt_tokens_received += seq.n_prompt
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

    def _run_step(self, step: Step, events: list[tuple[Callable[[Any], None], Any]]) -> None:
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
        try:
            model.decode(tokens, pos, seqs, want)
        except Exception as e:  # noqa: BLE001 - fail this step's sequences, keep serving
            log.error("decode of %d tokens failed: %s", len(tokens), e)
            err = EngineFailure(f"decoding failed: {e}")
            for s in {*step.decode, *(s for s, _ in step.prefill)}:
                self._finished(s, events, "error", err)
            return
        st = self.stats
        st.steps += 1
        st.peak_seqs_per_step = max(st.peak_seqs_per_step, step.n_seqs)
        n_prefill = len(tokens) - len(step.decode)
        st.prompt_tokens_computed += n_prefill
        st.step_log.append((len(step.decode), len(step.prefill), n_prefill))
        for s in step.decode:
            s.n_cached += 1
        for s, n in step.prefill:
            s.n_cached += n
        now = self.clock()
        for s, row in rows:
            self._accept(s, model.sample(s.sampler, row), now, events)

    def _accept(self, s: Sequence, tok: int, now: float, events: list[tuple[Callable[[Any], None], Any]]) -> None:
        s.state = State.DECODE
        tokenizer = self.model.tokenizer
        if tokenizer.is_eog(tok):
            self._finished(s, events, "stop")
            return
        s.output.append(tok)
        self.stats.generated_tokens += 1
        text = s.text.push(tokenizer.piece(tok))
        if text:
            if not s.first_token_at:
                s.first_token_at = now
            events.append((s.sink, Delta(text)))
        if s.text.stopped:
            self._finished(s, events, "stop")
        elif (len(s.output) >= s.params.max_tokens
              or s.n_cached + 1 >= self.limits.ctx_limit
              or now - s.arrival > self.request_timeout_s):
            self._finished(s, events, "length")

    def _finished(self, s: Sequence, events: list[tuple[Callable[[Any], None], Any]], reason: str,
                  error: ApplianceError | None = None) -> None:
        self.sched.release(s)
        if s.seq_id >= 0 and self.model is not None:
            self.model.seq_rm(s.seq_id)  # the slot's cells go back to the pool
            s.seq_id = -1
        if s.sampler is not None:
            s.sampler.free()
            s.sampler = None
        s.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        if error is not None:
            events.append((s.sink, Failed(error)))
            return
        tail = s.text.flush() if s.text is not None else ""
        if tail:
            events.append((s.sink, Delta(tail)))
        events.append((s.sink, Done(reason, s.n_prompt, len(s.output))))

    def _fail_all(self, error: ApplianceError) -> None:
        events: list[tuple[Callable[[Any], None], Any]] = []
        with self._cv:
            pending = list(self._inbox)
            self._inbox.clear()
        for s in pending + list(self.sched.waiting) + list(self.sched.running):
            if s.state is not State.FINISHED:
                self.sched.release(s)
                s.state = State.FINISHED
                events.append((s.sink, Failed(error)))
        self.sched.waiting.clear()
        self._emit(events)

    def _emit(self, events: list[tuple[Callable[[Any], None], Any]]) -> None:
        # One hand-off per step, not per token: call_soon_threadsafe wakes the loop.
        if events and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, events)


def _deliver(events: list[tuple[Callable[[Any], None], Any]]) -> None:
    for sink, ev in events:
        sink(ev)
