"""The engine core: everything the engine thread owns (model, scheduler, session cache, KV
store, counters) and what it does with it each loop iteration, read as its phases
(nano-vllm's step): take commands; prepare (expire, admit); schedule; run (build the batch
(batch.py), decode); postprocess (advance, sample, emit, finish: postprocess.py). Built
whole inside the engine thread, after the model has loaded; nothing here is touched from
another thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from appliance.engine import repeat
from appliance.engine.batch import FA_TILE_ROWS, Batch, build, split
from appliance.engine.events import Failed, Report
from appliance.engine.figures import Figures
from appliance.engine.inbox import Cancel, Command, DeleteSession, Inbox, Submit
from appliance.engine.kv.budget import KVBudget
from appliance.engine.kv.cache import SessionCache
from appliance.engine.kv.commons import Commons, CommonsPolicy
from appliance.engine.kv.store import CachePolicy, KVStore
from appliance.engine.model_api import Model
from appliance.engine.pace import StepClock
from appliance.engine.postprocess import Events, Postprocess
from appliance.engine.scheduler import Limits, Scheduler, Step
from appliance.engine.snapshot import SessionView, Snapshot, Stats
from appliance.engine.spec import NgramIndex, TurnDrafts
from appliance.engine.textstream import TextStream
from appliance.engine.threads import CoreShare
from appliance.engine.turn import State, Turn
from appliance.errors import ApplianceError, EngineFailure, KVCacheFull, Unavailable

log = logging.getLogger(__name__)
__all__ = ["EngineCore", "Events"]  # Events lives in postprocess.py; imported from here too


class EngineCore(Postprocess):
    def __init__(self, model: Model, limits: Limits, policy: CachePolicy, inbox: Inbox, *,
                 clock: Callable[[], float], request_timeout_s: float = 600.0,
                 spec_budget: int = 0, cores: CoreShare | None = None) -> None:
        self.model, self.limits, self.inbox, self.clock = model, limits, inbox, clock
        self.figures = Figures()  # distributions and recent answers, published in the snapshot
        self.request_timeout_s = request_timeout_s
        self.spec_budget = spec_budget  # draft rows per step (less one per stream); 0 = off
        self.cores = cores  # None: the thread count stays as the context was made
        self.threads = cores.threads if cores else 0
        self.budget = KVBudget(limits.kv_tokens)  # the scheduler reserves, the KV side pins (kv/budget.py)
        self.sched = Scheduler(limits, clock, self.budget)
        self.cache = SessionCache(range(policy.n_seq), clock, policy.ttl_s, policy.share_all,
                                  policy.park_bytes)
        self.kv = KVStore(model, self.cache, policy, self.budget, self.sched, clock)
        self.sched.shares = self.kv.expected_share  # a pinned prefix's cells counted once at admission
        self.stats = Stats()
        self.events: Events = []  # handed to the event loop after each iteration
        self._next_public_id = policy.n_seq  # public prefixes get ids beyond the sessions'
        self.taken = 0  # the highest request id taken from the inbox (queue positions)
        self.pace = StepClock()
        # When the step in progress should end (engine clock; 0: none). Read from the event
        # loop's thread for the queue notes: one float, written whole.
        self.step_ends = 0.0
        # Called by the engine thread once turns are admitted, before the step: a snapshot
        # published then keeps queue places true through a long step (Engine._run). And
        # once a step's end is forecast: the published snapshot learns when it should end.
        self.publish: Callable[[], None] | None = None
        self.publish_step_end: Callable[[float], None] | None = None
        # The snapshot's sessions view: (the session table's version it shows, view, bytes parked).
        self._sessions: tuple[int, Mapping[str, SessionView], int] = (-1, MappingProxyType({}), 0)

    # -- start-up ------------------------------------------------------------------------
    def warm_up(self) -> None:
        # The first decode allocates compute buffers and starts the thread pool; do it
        # before reporting ready so the first user does not pay for it.
        self.model.decode([0], [0], [0], [True])
        self.model.seq_rm(0)

    def add_public(self, tokens: list[int]) -> None:
        """Compute a public prefix once and pin it, so any client copies it for free and
        no client's timing depends on what another sent."""
        if len(tokens) < self.kv.policy.min_shared:
            return
        sid = self._next_public_id
        self._next_public_id += 1
        step = self.limits.batch_tokens
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            self.model.decode(chunk, list(range(start, start + len(chunk))), [sid] * len(chunk),
                              [False] * len(chunk))
        self.kv.add_public(sid, tokens)
        self.budget.pin(len(tokens))  # cells no reservation may count on

    def open_commons(self) -> None:
        """After the presets: system prompts that become public once common get the public
        sequence ids after theirs (the context was made with that many more)."""
        n = self.kv.policy.common_prompts
        if n and not self.kv.policy.share_all:  # sharing everything already shares these
            first = self._next_public_id
            front = self.limits.ctx_limit + self.limits.tools_tokens
            policy = CommonsPolicy(max_public=n, max_front_tokens=front)
            self.kv.commons = Commons(policy, range(first, first + n), self.model, self.cache, self.budget,
                                      self.sched,
                                      self.clock)

    # -- commands ------------------------------------------------------------------------
    def handle(self, cmd: Command) -> None:
        if isinstance(cmd, Submit):
            cmd.turn.continuing = cmd.turn.session in self.cache.entries
            self.sched.waiting.append(cmd.turn)
            self.taken = max(self.taken, cmd.turn.rid)
        elif isinstance(cmd, Cancel):
            turn = self.sched.find(cmd.rid)  # None: it has ended already
            if turn is not None:
                turn.cancelled = True  # scheduler.expired() removes it below
        elif isinstance(cmd, DeleteSession):
            try:
                cmd.done.set_result(self.kv.drop_session(cmd.session))
            except Exception as e:  # noqa: BLE001 - the caller must not wait forever
                cmd.done.set_exception(e)
                raise

    # -- one loop iteration --------------------------------------------------------------
    def iterate(self) -> bool:
        """Expire, admit and run one decode step; False when there was nothing to run."""
        t0 = time.perf_counter()
        self._prepare()
        t1 = time.perf_counter()
        step = self._schedule()
        if not step.n_seqs:
            self.stats.spent(t0, t1, t1, t1, time.perf_counter())
            return False
        self._share_cores()
        self._run(split(step), t0, t1)
        return True

    def _prepare(self) -> None:
        """Sessions past their TTL and turns cancelled or timed out go; waiting turns are admitted."""
        self.kv.expire()
        self._expire_turns()
        if self._admit() and self.publish is not None:
            self.publish()  # the admitted hear "busy", not a place, during the step

    def _schedule(self) -> Step:
        self.kv.resolve_followers()  # followers whose leader has their prefix copy it now
        return self.sched.schedule()

    def _run(self, parts: list[Step], t0: float, t1: float) -> None:
        """The step's llama_decode calls (one, or two: batch.split), each decoded, advanced
        and sampled; first the step's end is forecast, for the queue notes' wait estimate."""
        self.step_ends = self.clock() + self.pace.forecast(parts)
        if self.publish_step_end is not None:
            self.publish_step_end(self.step_ends)
        # A split step's streams draft only within the tile they keep to (FA_TILE_ROWS).
        rows = self.limits.batch_tokens if len(parts) == 1 else FA_TILE_ROWS - 1
        start, admitted = t0, t1
        for part in parts:
            batch = build(part, self.spec_budget, max(rows, part.n_tokens), self.ctx_cap,
                          self.budget.total - self.budget.pinned)
            built = time.perf_counter()
            ok = self._decode(batch, part)
            decoded = time.perf_counter()
            if ok:
                self.pace.called(part, len(batch.tokens), decoded - built)
                self._postprocess(part, batch)
            end = time.perf_counter()
            self.stats.spent(start, admitted, built, decoded, end)
            start = admitted = end
        self.pace.stepped(time.perf_counter() - t0)
        self.step_ends = 0.0

    def _share_cores(self) -> None:
        if self.cores is None:
            return
        n = self.cores.update()
        if n != self.threads:
            log.info("%d llama.cpp threads: others used %.2f of our %d cores",
                     n, self.cores.others, self.cores.n_cpus)
            self.model.set_threads(n)
            self.threads = n

    def _expire_turns(self) -> None:
        for turn, err, was_waiting in self.sched.expired():
            if was_waiting:
                self.inbox.dequeued()
            self._finish(turn, "queue_timeout" if err else "cancelled", err)

    def _admit(self) -> int:
        admitted = self.sched.admit()
        if not admitted:
            return 0
        self.inbox.dequeued(len(admitted))
        for turn in admitted:
            self.figures.queue_wait.observe(turn.admitted_at - turn.arrival)
            try:
                self.kv.attach(turn)
                turn.sampler = self.model.new_sampler(turn.params)
                turn.text = TextStream(turn.params.stop)
                answered = turn.params.answered
                turn.guard = repeat.CallGuard(frozenset(answered)) if answered else None
                turn.drafts = self._new_drafts(turn)
                if turn.progress is Report.EVERY:  # where its reading starts: what the cache held
                    self.events.append((turn.sink, turn.reading))
            except Exception as e:  # noqa: BLE001 - fail this request, keep serving
                log.exception("could not start request %d", turn.rid)
                self._finish(turn, "error", EngineFailure(f"could not start the request: {e}"))
                continue
            self.stats.prompt_tokens_received += turn.n_prompt
        # Room for the new reservations only now: a conversation a turn continues is its
        # turn's (busy) from attach on, not idle cells counted twice and evicted for nothing.
        # A restore that finds no free cells makes its own room (kv/store.KVStore._set_state).
        self.kv.make_room()
        return len(admitted)

    def _new_drafts(self, turn: Turn) -> TurnDrafts | None:
        p = turn.params
        # Penalties, a grammar or logprobs would have to see each draft: such turns get none.
        if not self.spec_budget or p.has_penalties or p.grammar is not None or p.logprobs is not None:
            return None
        # Any integer is a seed, as for llama.cpp's chain (which masks it too); numpy wants >= 0.
        seed = None if p.seed is None else p.seed & 0xFFFFFFFF
        return TurnDrafts(NgramIndex(turn.prompt), rng=np.random.default_rng(seed))

    # -- the step's phases ---------------------------------------------------------------
    def _decode(self, batch: Batch, step: Step) -> bool:
        """One llama_decode; "KV cache full" evicts idle sessions and retries. On failure
        only this step's turns fail (only the inconsistent ones, when some are fine)."""
        t0 = time.monotonic()
        try:
            while True:
                try:
                    self.model.decode(batch.tokens, batch.pos, batch.seq_ids, batch.want)
                    break
                except KVCacheFull:
                    if not self.kv.evict_lru():
                        raise
        except Exception as e:  # noqa: BLE001 - fail this step's turns, keep serving
            log.error("decode of %d tokens failed: %s", len(batch.tokens), e)
            err = (Unavailable("the KV cache is full; try again shortly", retry_after=5)
                   if isinstance(e, KVCacheFull) else EngineFailure(f"decoding failed: {e}"))
            involved = [*step.decode, *(t for t, _ in step.prefill)]
            broken = [t for t in involved if self.model.seq_pos_max(t.seq_id) != t.n_cached - 1]
            for t in broken or involved:
                self._finish(t, "error", err)
            return False
        self.figures.step_seqs.observe(step.n_seqs)
        self.figures.step_seconds.observe(time.monotonic() - t0)
        return True

    def fail_all(self, error: ApplianceError, pending: list[Command], keep: bool = False) -> None:
        """Shutting down or crashed: every queued and running request ends with `error`. On
        a stop (`keep`) the running ones keep their KV, to be saved with the sessions."""
        turns = [c.turn for c in pending if isinstance(c, Submit)]
        for c in pending:
            if isinstance(c, DeleteSession) and not c.done.done():
                c.done.set_result(False)
        if keep:
            for t in list(self.sched.running):
                self._finish(t, "shutdown", error, keep=True)
        for t in turns + list(self.sched.waiting) + list(self.sched.running):
            if t.state is not State.FINISHED:
                self.sched.release(t)
                self.inbox.finished(t)
                t.state = State.FINISHED
                self.events.append((t.sink, Failed(error)))
        self.sched.waiting.clear()

    # -- what others may read ------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        st, cache = self.stats, self.cache
        sessions, parked_bytes = self._sessions_view()
        events = {**_fields(cache.events), **_fields(self.kv.stats)}
        return Snapshot(
            taken_at=self.clock(), slots=self.limits.slots, running=len(self.sched.running),
            waiting=tuple(t.rid for t in self.sched.waiting), taken=self.taken,
            sessions=sessions, parked_bytes=parked_bytes, threads=self.threads,
            cores_others=self.cores.others if self.cores else 0.0, counters=st.counters(),
            cache_events=MappingProxyType(events), step_log=st.step_log.view(),
            admissible=self.sched.admissible(), step_s=self.pace.step_s, step_ends=self.step_ends,
            park_budget=cache.park_budget, finished_at=tuple(self.figures.finished_at),
            served_s=tuple(self.figures.served_s), histograms=self.figures.histograms())

    def _sessions_view(self) -> tuple[Mapping[str, SessionView], int]:
        """The sessions as the snapshot shows them, and the bytes parked: rebuilt only when
        the session table's version has moved (kv/cache.SessionTable), since a snapshot is
        published every loop iteration and most iterations change no session. The mapping
        handed out is never changed afterwards: a new one replaces it."""
        entries = self.cache.entries
        if self._sessions[0] != entries.version:
            view = {s: SessionView(e.state, e.n_tokens, len(e.parked) if e.parked is not None else 0,
                                   e.last_used)
                    for s, e in entries.items()}
            self._sessions = (entries.version, MappingProxyType(view), self.cache.parked_bytes)
        return self._sessions[1], self._sessions[2]


def _fields(obj: Any) -> dict[str, int]:
    return {name: getattr(obj, name) for name in obj.__slots__}
