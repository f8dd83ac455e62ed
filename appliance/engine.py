"""The engine thread: owns the llama context, runs admit -> schedule -> decode -> sample in
a loop, keeps finished conversations' KV in the session cache, and hands text to the
waiting HTTP streams on the asyncio loop.

The HTTP side only calls `prepare`, `submit`, `cancel`, the session calls and reads
`stats`; it never touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from pathlib import Path
from dataclasses import dataclass, field
from enum import Enum
from itertools import count
from typing import Any, AsyncIterator, Callable, Protocol

from . import persist
from .cache import Entry, SessionCache, common_prefix
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
    def sample(self, sampler: Any, row: int) -> int: ...
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


@dataclass(frozen=True, slots=True)
class CachePolicy:
    n_seq: int  # llama.cpp sequence ids: `slots` for running requests, the rest hold idle sessions
    ttl_s: float = 1800.0
    share_all: bool = False  # False: across sessions, reuse only the shared (system) prefix
    park_bytes: int = 0  # RAM for sessions evicted from the KV cache; 0 = no parking
    restore_min_tokens: int = 0  # shorter parked histories are cheaper to recompute
    min_shared: int = 8  # shortest prefix worth sharing between sequences
    state_dir: str = ""  # where sessions survive a restart; "" = they do not
    state_max_bytes: int = 1 << 30


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
        self.ready = threading.Event()
        self._cv = threading.Condition()
        self._inbox: deque[Sequence | Callable[[], None]] = deque()
        self._n_queued = 0  # inbox + waiting, checked against max_queue at submit
        self._per_client: dict[str, int] = {}  # running + queued, under _cv
        self._next_ttl_check = 0.0
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
               session: str = "") -> Handle:
        self._check_accepting()
        if isinstance(prompt, Prompt):
            tokens, shared = prompt.tokens, prompt.shared_len
        else:
            tokens, shared = prompt, 0
        rid = next(self._ids)
        seq = Sequence(rid=rid, prompt=tokens, params=params, arrival=self.clock(),
                       client=client, session=session or f"anon-{rid}", shared_len=shared)
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
        existed = session in self.cache.entries
        self._command(lambda: self._drop_session(session))
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
            self._load_sessions()
        except Exception as e:  # noqa: BLE001 - reported through /health and the log
            log.exception("engine failed to start")
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
                self._save_sessions()
                self.state = EngineState.STOPPED
            self.model.close()

    def _load_sessions(self) -> None:
        """Sessions saved by the previous run come back as 'saved' entries, read from disk
        only when their next turn arrives."""
        if not self.policy.state_dir:
            return
        now = self.clock()
        saved = persist.scan(Path(self.policy.state_dir), self.model.fingerprint)
        for sv in saved:
            e = Entry(sv.session, -1, sv.tokens, sv.shared_len, now - sv.last_used_age_s, disk=sv)
            self.cache.entries[sv.session] = e
        if saved:
            log.info("%d saved sessions found in %s", len(saved), self.policy.state_dir)

    def _save_sessions(self) -> None:
        if not self.policy.state_dir or self.model is None:
            return
        now = self.clock()
        records = []
        try:
            for e in list(self.cache.entries.values()):
                if e.busy:
                    continue
                if e.seq_id >= 0:
                    data = self.model.seq_state(e.seq_id)
                elif e.parked is not None:
                    data = e.parked
                elif e.disk is not None:
                    data = persist.load(e.disk)
                else:
                    data = None
                if data:
                    records.append((e.session, e.tokens, e.shared_len, now - e.last_used, data))
            n = persist.save_all(Path(self.policy.state_dir), self.model.fingerprint, records,
                                 self.policy.state_max_bytes)
            log.info("saved %d of %d sessions to %s", n, len(records), self.policy.state_dir)
        except OSError as e:
            log.error("could not save sessions to %s: %s", self.policy.state_dir, e)

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
            self._expire_sessions()
            for seq, err, was_waiting in self.sched.expired():
                if was_waiting:
                    with self._cv:
                        self._n_queued -= 1
                self._finished(seq, events, "queue_timeout" if err else "cancelled", err)
            admitted = self.sched.admit()
            if admitted:
                # Room first (their reservations now count), so a restore finds free cells.
                self._make_room()
            for seq in admitted:
                with self._cv:
                    self._n_queued -= 1
                if self.metrics:
                    self.metrics.queue_wait.observe(seq.admitted_at - seq.arrival)
                try:
                    self._attach(seq)
                    seq.sampler = self.model.new_sampler(seq.params)
                except Exception as e:  # noqa: BLE001 - fail this request, keep serving
                    log.exception("could not start request %d", seq.rid)
                    self._finished(seq, events, "error", EngineFailure(f"could not start the request: {e}"))
                    continue
                seq.text = TextStream(seq.params.stop)
                self.stats.prompt_tokens_received += seq.n_prompt
            self._resolve_followers()
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

    # -- the KV cache: reuse, sharing, eviction ------------------------------------------
    def _attach(self, seq: Sequence) -> None:
        """Give an admitted sequence its llama.cpp sequence id, reusing cached KV: the
        session's own history, else a shared system prompt computed by someone else."""
        model, cache = self.model, self.cache
        m = cache.match(seq.session, seq.prompt, seq.shared_len)
        if m.own and m.entry is not None:
            e = m.entry
            cache.take(e)
            model.seq_rm(e.seq_id, m.n_common, -1)  # an edited history keeps what still matches
            seq.seq_id, seq.n_cached, seq.n_reused = e.seq_id, m.n_common, m.n_common
            # Cells this entry shares with the sequence it copied from stay not-its-own.
            seq.copied = min(e.n_tokens - e.own_tokens, m.n_common)
            cache.stats.hits += 1
            return
        own = cache.entries.get(seq.session)
        if own is not None and own.stored:
            if self._restore(seq, own):
                return
            # Restoring may have evicted the donor found above: look again.
            m = cache.match(seq.session, seq.prompt, seq.shared_len)
        donor = m.entry if m.entry is not None and m.n_common >= self.policy.min_shared else None
        if donor is not None:
            donor.busy = True  # pinned: making room for our id must not evict the donor
        seq.seq_id = self._alloc_id()
        if donor is not None:
            donor.busy = False
            model.seq_cp(donor.seq_id, seq.seq_id, 0, m.n_common)
            seq.n_cached = seq.n_reused = seq.copied = m.n_common
            cache.stats.shared_hits += 1
            return
        # Nobody has the shared prefix yet: if a running sequence is computing it, wait for
        # it and copy, so eight users arriving together compute their system prompt once.
        best, best_n = None, 0
        for other in self.sched.running:
            if other is seq or other.leader is not None or other.seq_id < 0:
                continue
            cap = min(len(seq.prompt) - 1, len(other.prompt))
            if not self.policy.share_all:
                cap = min(cap, seq.shared_len, other.shared_len)
            n = min(common_prefix(other.prompt, seq.prompt), cap)
            if n > best_n:
                best, best_n = other, n
        if best is not None and best_n >= self.policy.min_shared:
            seq.leader, seq.lead_n = best, best_n

    def _restore(self, seq: Sequence, e: Entry) -> bool:
        """Bring a parked session back into the KV cache, when cheaper than recomputing."""
        n = min(common_prefix(e.tokens, seq.prompt), len(seq.prompt) - 1)
        data = e.parked
        if data is None and e.disk is not None and n >= max(1, self.policy.restore_min_tokens):
            data = persist.load(e.disk)  # checksummed: a damaged file gives None, not a crash
            e.disk = None
        if data is None or n < max(1, self.policy.restore_min_tokens):
            _forget(e.disk)
            self.cache.drop(e.session)
            self.cache.stats.recomputed += 1
            return False
        sid = self._alloc_id()
        while True:
            try:
                ok = self.model.set_seq_state(sid, data)
            except KVCacheFull:
                ok = False
            idle = self.cache.idle_lru()
            if ok or not idle:
                break
            self.model.seq_rm(sid)
            self._evict(idle[0])  # no free cells: make room and try again
        if not ok:
            log.warning("session %s: could not restore parked state; recomputing", e.session)
            self.model.seq_rm(sid)
            self.cache.release_id(sid)
            self.cache.drop(e.session)
            self.cache.stats.recomputed += 1
            return False
        e.parked, e.seq_id = None, sid
        self.cache.take(e)
        self.model.seq_rm(sid, n, -1)
        seq.seq_id, seq.n_cached, seq.n_reused = sid, n, n
        self.cache.stats.restored += 1
        return True

    def _resolve_followers(self) -> None:
        for s in self.sched.running:
            lead = s.leader
            if lead is None:
                continue
            if lead.state is State.FINISHED or lead.seq_id < 0:
                s.leader = None  # the leader is gone: compute the prefix ourselves
            elif lead.n_cached >= s.lead_n:
                self.model.seq_cp(lead.seq_id, s.seq_id, 0, s.lead_n)
                s.n_cached = s.n_reused = s.copied = s.lead_n
                s.leader = None
                self.cache.stats.shared_hits += 1

    def _alloc_id(self) -> int:
        sid = self.cache.alloc_id()
        while sid is None:
            # More sequence ids than slots, so an idle session always exists here.
            self._evict(self.cache.idle_lru()[0])
            sid = self.cache.alloc_id()
        return sid

    def _evict(self, e: Entry) -> None:
        """Take an idle session out of the KV cache, parking it in RAM when worth it."""
        sid = e.seq_id
        data = None
        if self.policy.park_bytes and e.n_tokens >= max(1, self.policy.restore_min_tokens):
            data = self.model.seq_state(sid)
        self.cache.evict(e, data)
        self.model.seq_rm(sid)

    def _make_room(self) -> bool:
        """Keep idle sessions + running reservations within the KV budget (LRU first)."""
        idle = self.cache.idle_lru()
        while idle and self.cache.cached_tokens + self.sched.reserved > self.limits.kv_tokens:
            self._evict(idle.pop(0))
        return bool(idle)

    def _expire_sessions(self) -> None:
        now = self.clock()
        if now < self._next_ttl_check:
            return
        self._next_ttl_check = now + 1.0
        for e in self.cache.expired():
            if e.seq_id >= 0:
                self.model.seq_rm(e.seq_id)
            _forget(e.disk)

    def _drop_session(self, session: str) -> None:
        e = self.cache.entries.get(session)
        if e is None:
            return
        # Turns of this session running now must not re-cache it when they finish.
        for s in self.sched.running:
            if s.session == session:
                s.no_cache = True
        if e.busy:
            del self.cache.entries[session]  # its running turn owns the sequence id
            return
        sid = e.seq_id
        self.cache.drop(session)
        if sid >= 0:
            self.model.seq_rm(sid)
        _forget(e.disk)

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
                    idle = self.cache.idle_lru()
                    if not idle:
                        raise
                    self._evict(idle[0])  # make room, then try the same batch again
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
        for s, row in rows:
            self._accept(s, model.sample(s.sampler, row), now, events)

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
            self._keep_or_free(s, keep=error is None and s.n_cached > 0)
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
        events.append((s.sink, Done(reason, s.n_prompt, len(s.output), s.n_reused)))

    def _keep_or_free(self, s: Sequence, keep: bool) -> None:
        """A finished turn's KV stays as its session's cache entry, unless it failed or the
        session was deleted meanwhile."""
        cache = self.cache
        if keep and not s.no_cache:
            tokens = (s.prompt + s.output)[:s.n_cached]
            replaced = cache.put(s.session, s.seq_id, tokens, s.shared_len, s.copied)
            if replaced is not None:
                self.model.seq_rm(replaced)
            self._make_room()
            return
        own = cache.entries.get(s.session)
        if own is not None and own.seq_id == s.seq_id:
            del cache.entries[s.session]
        self.model.seq_rm(s.seq_id)
        cache.release_id(s.seq_id)

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


def _forget(saved: persist.Saved | None) -> None:
    if saved is not None:
        try:
            saved.path.unlink(missing_ok=True)
        except OSError as e:  # a stale file is harmless; a crashed engine is not
            log.warning("could not remove %s: %s", saved.path, e)
