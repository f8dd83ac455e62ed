"""The engine: one thread that owns the llama context and the engine core, and the small
API the HTTP side uses. Commands go in through the inbox (Submit, Cancel by request id,
DeleteSession); results come out as each request's events on its Handle and as the
snapshot published after every iteration. The HTTP side never holds a Turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from itertools import count
from typing import Any

from appliance.engine.core import EngineCore, Events
from appliance.engine.events import Event, Report
from appliance.engine.faults import Fault, inject
from appliance.engine.handle import Handle
from appliance.engine.inbox import DeleteSession, Inbox
from appliance.engine.kv.cache import SAVED
from appliance.engine.kv.store import CachePolicy
from appliance.engine.model_api import Model
from appliance.engine.names import saved_key
from appliance.engine.scheduler import Limits
from appliance.engine.snapshot import SessionView, Snapshot
from appliance.engine.text import Text, prompt_limit
from appliance.engine.threads import CoreShare
from appliance.engine.turn import Lane, Turn
from appliance.errors import ApplianceError, EngineFailure, Unavailable
from appliance.model.prompt import ChatTemplate, Prompt, Tokenize, public_prefixes
from appliance.sampling import SamplingParams

log = logging.getLogger(__name__)
__all__ = ["Engine", "EngineOptions", "EngineState", "Handle"]  # Handle lives in handle.py


class EngineState(Enum):
    LOADING = "loading"
    READY = "ok"
    DRAINING = "draining"
    FAILED = "failed"
    STOPPED = "stopped"


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How an engine runs, everything but the model it loads."""

    limits: Limits
    policy: CachePolicy | None = None  # None: one sequence id beyond the slots, no parking
    max_per_client: int = 0  # requests one client may have queued or running (0: no cap)
    presets: tuple[str, ...] = ()  # operator system prompts, shared by every client
    spec_budget: int = 0  # draft rows per step for speculation (0: off)
    cores: CoreShare | None = None  # None: a fixed thread count
    request_timeout_s: float = 600.0
    stall_s: float = 60.0  # a loop iteration (one step) longer than this is a hang
    fault: Fault | None = None  # faults.py, tests only: armed once the engine is ready
    pin: Callable[[], None] = _nothing  # pins the engine thread (cpu.py), before the model loads
    clock: Callable[[], float] = time.monotonic
    on_fatal: Callable[[], None] = _nothing  # the engine failed: let the process exit non-zero


class Engine:
    """The engine thread and its API. The section headers say which thread calls what;
    everything else here is the engine thread's."""

    def __init__(self, model_factory: Callable[[], Model], options: EngineOptions) -> None:
        self._factory = model_factory
        self._options = options
        self._limits = options.limits
        self._policy = options.policy or CachePolicy(n_seq=options.limits.slots + 1)
        assert self._policy.n_seq > self._limits.slots, "need more sequence ids than slots"
        self._clock = options.clock
        self._inbox = Inbox(self._limits.max_queue, options.max_per_client)
        self._progress_at = 0.0  # time.monotonic() when the engine loop last made progress
        self.state = EngineState.LOADING
        self.load_error = ""
        self.system_fingerprint = ""  # OpenAI's, set once the model has loaded
        self.ready = threading.Event()
        self.snapshot = Snapshot(slots=self._limits.slots)  # replaced whole by the engine thread
        self.core: EngineCore | None = None  # the engine thread's; tests may inspect it
        self._text: Text | None = None  # the tokenizer's front (text.py), built once the model has loaded
        self._stop = False
        self._ids = count(1)
        # Turns submitted without a session get one of their own. The HTTP side always names
        # one; this is for in-process callers. Unique to this run, since sessions are saved at
        # stop and claimed by id after a restart: a counter alone would hand the next run's
        # "anon-1" the last run's "anon-1" (another caller's conversation).
        self._anon = f"anon-{secrets.token_hex(8)}-"
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

    def stop(self, timeout: float | None = None) -> None:
        """Default wait: the time sessions may take to save, and some."""
        self._stop = True
        self._inbox.wake()
        if self._thread.is_alive():
            self._thread.join(timeout if timeout is not None else self._policy.save_timeout_s + 10)

    @property
    def n_active(self) -> int:
        """Requests queued or running."""
        return self._inbox.n_open

    # -- liveness (any thread) -----------------------------------------------------------
    @property
    def stalled_s(self) -> float:
        """How long the engine loop has been stuck in one iteration (a decode that hangs),
        once that exceeds stall_s; 0.0 otherwise, and while loading or stopped."""
        if self.state not in (EngineState.READY, EngineState.DRAINING):
            return 0.0
        idle = time.monotonic() - self._progress_at
        return idle if idle > self._options.stall_s else 0.0

    def now(self) -> float:
        """The engine's clock, which the snapshot's times are on."""
        return self._clock()

    @property
    def status(self) -> str:
        """What /health says: loading, ok, stalled, draining, failed or stopped."""
        return "stalled" if self.stalled_s else self.state.value

    # -- requests (loop thread) ----------------------------------------------------------
    # The tokenizer's front (text.py), refused while the engine is not accepting.
    def prompt_limit(self, max_tokens: int) -> int:
        return prompt_limit(self._limits.ctx_limit, max_tokens)

    async def prepare(self, messages: list[dict[str, Any]], max_tokens: int,
                      tools: list[dict[str, Any]] | None = None) -> Prompt:
        return await self._front().prepare(messages, max_tokens, tools)

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        return await self._front().tokenize(text, special)

    async def check_grammar(self, grammar: str | None) -> None:
        if grammar is not None:
            await self._front().check_grammar(grammar)

    def detokenize(self, tokens: list[int]) -> str:
        return self._front().detokenize(tokens)

    @property
    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) fill-in-the-middle tokens, or None if the model has none."""
        return self._text.tokenizer.fim if self._text is not None else None

    @property
    def n_vocab(self) -> int:
        return self._text.tokenizer.n_vocab if self._text is not None else 0

    async def eog_tokens(self) -> tuple[int, ...]:
        return await self._front().eog_tokens()

    def _front(self) -> Text:
        self._check_accepting()
        assert self._text is not None
        return self._text

    def submit(self, prompt: list[int] | Prompt, params: SamplingParams, client: str = "",
               session: str = "", named: bool = True, progress: Report | bool = Report.NONE,
               lane: Lane = Lane.PEOPLE, front_end: str = "") -> Handle:
        """Queue one request (or refuse it: QueueFull, Unavailable). Loop thread only: the
        ids are handed out in the order the inbox receives them (Snapshot.position). With
        `progress` (True: Report.LONG), its prompt's Progress events come before its first Delta."""
        self._check_accepting()
        p = prompt if isinstance(prompt, Prompt) else Prompt(prompt, 0)
        rid = next(self._ids)
        queue: asyncio.Queue[Event] = asyncio.Queue()
        # The turn goes to the engine thread through the inbox; the handle keeps only its id.
        turn = Turn(rid=rid, prompt=p.tokens, params=params, arrival=self._clock(), sink=queue.put_nowait,
                    client=client, session=session or f"{self._anon}{rid}", public_len=p.public_len,
                    system_len=p.system_len, allowance=p.allowance, front_end=front_end,
                    block_public=p.block_public, named=named and bool(session),
                    progress=Report(int(progress)), lane=lane)
        self._inbox.submit(turn)  # a refusal (QueueFull) is counted where every refusal is: http/
        return Handle(rid, queue, self._inbox, lambda: self.snapshot, lane)

    def session_info(self, session: str) -> dict[str, Any] | None:
        """GET /v1/sessions/{id}, rendered from the last snapshot."""
        snap = self.snapshot
        # A session saved by the last run is listed under its digest until its next turn.
        view: SessionView | None = snap.sessions.get(session) or snap.sessions.get(SAVED + saved_key(session))
        if view is None:
            return None
        idle_s = round(max(0.0, snap.taken_at - view.last_used), 3)
        return {"id": session, "state": view.state, "cached_tokens": view.cached_tokens,
                "parked_bytes": view.parked_bytes, "idle_s": idle_s}

    async def delete_session(self, session: str) -> bool:
        """Forget a session's cache, including what its turns in flight would leave; the
        engine answers whether there was anything to forget."""
        cmd = DeleteSession(session)
        self._inbox.put(cmd)
        return await asyncio.wrap_future(cmd.done)

    def _check_accepting(self) -> None:
        if self.state is EngineState.LOADING:
            raise Unavailable("the model is still loading", retry_after=5)
        if self.state is EngineState.DRAINING:
            raise Unavailable("the server is shutting down", code="shutting_down", retry_after=10)
        if self.state is not EngineState.READY:
            raise Unavailable(f"the engine is not running: {self.load_error or self.state.value}")

    # -- the engine thread ---------------------------------------------------------------
    def _main(self) -> None:
        try:
            core = self._build_core()
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            log.error("engine failed to start: %s", e)  # one line for the user...
            log.debug("engine start failure", exc_info=True)  # ...the traceback for us
            self.load_error = str(e)
            self.state = EngineState.FAILED
            self.ready.set()
            self._options.on_fatal()
            return
        self.core = core
        core.publish = lambda: setattr(self, "snapshot", core.snapshot())
        # Only when the step's end is forecast: a field of the last picture, not a new one.
        core.publish_step_end = lambda ends: setattr(
            self, "snapshot", dataclasses.replace(self.snapshot, step_ends=ends))
        # llama-server's form, b<build>-<hash>: one value per server, another whenever the
        # model, llama.cpp or the KV type changes (what may change an answer for a seed).
        digest = hashlib.sha256(core.model.fingerprint.encode()).hexdigest()[:8]
        self.system_fingerprint = f"b{core.model.build}-{digest}"
        self.snapshot = core.snapshot()
        self._progress_at = time.monotonic()
        self.state = EngineState.READY
        self.ready.set()
        log.info("engine ready: %d slots, %d KV tokens, %d sequence ids",
                 self._limits.slots, self._limits.kv_tokens, self._policy.n_seq)
        try:
            self._run(core)
        except Exception as e:  # noqa: BLE001
            # Must never happen; if it does, fail every stream rather than hang them.
            log.exception("engine loop crashed")
            self.load_error = f"engine crashed: {e}"
            self.state = EngineState.FAILED
            self._shut(core, EngineFailure("the engine stopped unexpectedly"))
            self._options.on_fatal()  # let the process exit non-zero so a supervisor restarts it
        else:
            # A stop with answers still running (past the drain's grace): each ends with the
            # documented error event, keeping its conversation for the next start.
            cut = Unavailable("the server is restarting: this answer was cut short; ask again in a "
                              "moment and the conversation continues", code="shutting_down", retry_after=10)
            self._shut(core, cut, keep=True)
            core.kv.save_sessions()
            self.state = EngineState.STOPPED
        finally:
            core.model.close()

    def _build_core(self) -> EngineCore:
        o = self._options
        o.pin()  # before the context exists, so llama.cpp's workers inherit it
        model = self._factory()
        tok = model.tokenizer
        template = ChatTemplate(tok.chat_template, tok.bos_text, tok.eos_text)
        core = EngineCore(model, self._limits, self._policy, self._inbox, clock=self._clock,
                          request_timeout_s=o.request_timeout_s, spec_budget=o.spec_budget, cores=o.cores)
        core.warm_up()
        # No BOS added per piece: a template that wants one writes it (Qwen's does not).
        tokenize: Tokenize = lambda text, special: tok.tokenize(text, False, special)
        for tokens in public_prefixes(o.presets, template, tokenize):
            core.add_public(tokens)
        core.open_commons()
        core.kv.load_sessions()
        # Tools beyond what the pool holds past one conversation could never run.
        lim = self._limits
        tools = min(lim.tools_tokens, max(0, lim.kv_tokens - lim.ctx_limit))
        self._text = Text(template, tokenize, tok, lim.ctx_limit, frozenset(o.presets), tools)
        if o.fault is not None:
            inject(model, o.fault)  # after start-up's own decodes
        return core

    def _run(self, core: EngineCore) -> None:
        stall_s = self._options.stall_s
        while not self._stop:
            self._progress_at = time.monotonic()  # the watchdog's sign of life (notify.py)
            for cmd in self._inbox.take():
                core.handle(cmd)
            busy = core.iterate()
            # Publish before handing out events: a client that sees its Done then reads
            # /health or its session already sees the state that Done reflects.
            self.snapshot = core.snapshot()
            self._emit(core)
            if not busy:
                closes = core.sched.window_open_until()
                # Idle waits are short enough to never look like a stall.
                waited = time.perf_counter()
                until = max(0.0, closes - self._clock()) if closes is not None else 1.0
                self._inbox.wait(min(until, stall_s / 4))
                core.stats.seconds["idle"] += time.perf_counter() - waited

    def _shut(self, core: EngineCore, error: ApplianceError, keep: bool = False) -> None:
        core.fail_all(error, self._inbox.close(), keep)
        self.snapshot = core.snapshot()
        self._emit(core)

    def _emit(self, core: EngineCore) -> None:
        # One hand-off per iteration, not per token: call_soon_threadsafe wakes the loop.
        events, core.events = core.events, []
        if events and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, events)


def _deliver(events: Events) -> None:
    for sink, ev in events:
        sink(ev)
