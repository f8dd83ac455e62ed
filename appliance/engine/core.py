"""The engine core: everything the engine thread owns (model, scheduler, session cache, KV
store, counters) and what it does with it each loop iteration: take commands, expire,
admit, then one decode step read as its phases (build the batch (batch.py), decode,
advance, sample, emit). Built whole inside the engine thread, after the model has loaded;
nothing here is touched from another thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np

from appliance.engine import repeat
from appliance.engine.batch import FA_TILE_ROWS, Batch, build, split
from appliance.engine.events import Delta, Done, Event, Failed, Report, TokenLogprob
from appliance.engine.figures import Figures
from appliance.engine.inbox import Cancel, Command, DeleteSession, Inbox, Submit
from appliance.engine.kv.budget import KVBudget
from appliance.engine.kv.cache import SessionCache
from appliance.engine.kv.commons import Commons, CommonsPolicy
from appliance.engine.kv.store import CachePolicy, KVStore
from appliance.engine.model_api import Model
from appliance.engine.names import log_finished
from appliance.engine.pace import StepClock
from appliance.engine.scheduler import Limits, Scheduler, Step
from appliance.engine.snapshot import SessionView, Snapshot, Stats
from appliance.engine.spec import NgramIndex, TurnDrafts, accept_greedy, accept_sampled, sparse_row
from appliance.engine.textstream import TextStream
from appliance.engine.threads import CoreShare
from appliance.engine.turn import Sink, State, Turn
from appliance.errors import ApplianceError, EngineFailure, KVCacheFull, Unavailable

log = logging.getLogger(__name__)
Events = list[tuple[Sink, Event]]


class EngineCore:
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
        self.cache = SessionCache(range(policy.n_seq), clock, policy.ttl_s, policy.share_all, policy.park_bytes)
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

    @property
    def ctx_cap(self) -> int:
        """Most tokens a turn may hold (+ its Turn.allowance): the context limit, or the cells public prefixes leave."""
        return min(self.limits.ctx_limit, self.budget.total - self.budget.pinned)

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
            policy = CommonsPolicy(max_public=n, max_front_tokens=self.limits.ctx_limit + self.limits.tools_tokens)
            self.kv.commons = Commons(policy, range(first, first + n), self.model, self.cache, self.budget, self.sched,
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
        self.kv.expire()
        self._expire_turns()
        if self._admit() and self.publish is not None:
            self.publish()  # the admitted hear "busy", not a place, during the step
        t1 = time.perf_counter()
        self.kv.resolve_followers()
        step = self.sched.schedule()
        if not step.n_seqs:
            self.stats.spent(t0, t1, t1, t1, time.perf_counter())
            return False
        self._share_cores()
        self._run(split(step), t0, t1)
        return True

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
            batch = build(part, self.spec_budget, max(rows, part.n_tokens), self.ctx_cap, self.budget.total - self.budget.pinned)
            built = time.perf_counter()
            ok = self._decode(batch, part)
            decoded = time.perf_counter()
            if ok:
                self.pace.called(part, len(batch.tokens), decoded - built)
                self._advance(part, batch)
                self._sample(batch)
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
            log.info("%d llama.cpp threads: others used %.2f of our %d cores", n, self.cores.others, self.cores.n_cpus)
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
                turn.guard = repeat.CallGuard(frozenset(turn.params.answered)) if turn.params.answered else None
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

    def _advance(self, step: Step, batch: Batch) -> None:
        st = self.stats
        st.steps += 1
        st.peak_seqs_per_step = max(st.peak_seqs_per_step, step.n_seqs)
        n_prefill = len(batch.tokens) - len(step.decode) - batch.n_drafts
        st.prompt_tokens_computed += n_prefill
        st.step_log.append((len(step.decode), len(step.prefill), n_prefill, batch.n_drafts))
        st.decode_rows += len(step.decode)
        for t in step.decode:
            t.n_cached += 1
        for t, n in step.prefill:
            t.n_cached += n
            if t.front_end and self.kv.commons is not None and t.n_cached - n < t.system_len:
                self.kv.stats.promoted += self.kv.commons.computed(t)  # a front-end's block: public once read
            # One small object per step per prompt that asked (Turn.reports), before its
            # first Delta (sampled after this); nothing per token, nothing for the decode rows.
            if t.reports(self.limits.batch_tokens):
                self.events.append((t.sink, t.reading))

    def _sample(self, batch: Batch) -> None:
        now = self.clock()
        plain = [(t, row) for t, row, d in batch.picks if not d]
        sampled = self.model.sample_all([(t.sampler, row) for t, row in plain])
        for (t, row), token in zip(plain, sampled):
            if isinstance(token, Exception):  # what this turn's own parameters made fail
                self._sampling_failed(t, token)
                continue
            if t.drafts is not None and t.state is State.DECODE:
                t.drafts.state.observe(token)  # the lookup's guess, right or wrong
            self._accept(t, token, now, self._logprob(row, token, t.params.logprobs))
        for t, row, d in batch.picks:
            if d:
                try:
                    self._verify(t, row, d, now)
                except Exception as e:  # noqa: BLE001 - this turn's numerics, not the engine's
                    self._sampling_failed(t, e)

    def _sampling_failed(self, t: Turn, e: Exception) -> None:
        """What one turn's own parameters make fail (a grammar that allows no token here,
        the numerics of an odd temperature) ends that turn with an error, not the engine."""
        log.error("request %d: sampling failed: %s", t.rid, e)
        self._finish(t, "error", e if isinstance(e, ApplianceError) else EngineFailure(f"sampling failed: {e}"))

    def _verify(self, t: Turn, row: int, draft: list[int], now: float) -> None:
        """Keep the drafts the model agrees with plus one token of its own; the rejected
        drafts' cells leave the KV cache."""
        k, p = len(draft), t.params
        assert t.drafts is not None
        if p.greedy:
            out = accept_greedy(draft, self.model.greedy_rows(row, k + 1))
        else:
            logits = self.model.logits_rows(row, k + 1)
            rows = [sparse_row(logits[i], p.temperature, p.top_k, p.top_p, p.min_p) for i in range(k + 1)]
            out = accept_sampled(draft, rows, t.drafts.rng)
        n_ok = len(out) - 1
        t.drafts.state.record(k, n_ok)
        self.stats.draft_tokens += k
        self.stats.draft_accepted += n_ok
        t.n_cached += n_ok
        if n_ok < k:
            self.model.seq_rm(t.seq_id, t.n_cached, -1)
        for token in out:
            if not self._accept(t, token, now):
                break

    def _logprob(self, row: int, token: int, k: int | None) -> TokenLogprob | None:
        """Only for the rows that asked: the logits are still those of the last decode."""
        if k is None:
            return None
        lp, top = self.model.logprobs(row, token, k)
        piece = self.model.tokenizer.piece
        return TokenLogprob(piece(token), lp, [(piece(x), v) for x, v in top], token, tuple(x for x, _ in top))

    def _accept(self, t: Turn, token: int, now: float, lp: TokenLogprob | None = None) -> bool:
        """Take one sampled token; False once the turn has finished."""
        t.state = State.DECODE
        tokenizer = self.model.tokenizer
        if tokenizer.is_eog(token):
            self._finish(t, "stop")
            return False
        t.output.append(token)
        if lp is not None:
            t.logprobs.append(lp)
        if t.drafts is not None:
            t.drafts.index.extend((token,))
        self.stats.generated_tokens += 1
        if t.guard is None:  # every token but an answer's opening after a tool's result: no list, no join
            text = t.text.push(tokenizer.piece(token))
        elif (pieces := self._guarded(t, tokenizer.piece(token))) is None:
            return False  # rewound: it samples its first token again
        else:
            text = "".join(t.text.push(p) for p in pieces)
        if t.unban is not None:
            repeat.first_token_taken(t, self.model)
        if text:
            self._emit_text(t, text, now)
        if t.text.stopped:
            self._finish(t, "stop")
        elif (len(t.output) >= t.params.max_tokens
              # prompt + output, not n_cached: a verified run advances n_cached by all its
              # accepted drafts before their tokens are taken one by one here.
              or t.n_prompt + len(t.output) >= min(self.ctx_cap + t.allowance, self.budget.total - self.budget.pinned + t.shared)
              or now - t.arrival > self.request_timeout_s):
            self._finish(t, "length")
        return t.state is not State.FINISHED

    def _guarded(self, t: Turn, piece: bytes) -> list[bytes] | None:
        """repeat.py: what of the answer's opening goes out now; None: it repeated a call just
        answered, and the turn was rewound."""
        pieces = t.guard.feed(piece)
        if pieces is None:
            repeat.rewind(t, self.model)
        elif pieces:
            t.guard = None
        return pieces

    def _emit_text(self, t: Turn, text: str, now: float) -> None:
        if t.first_token_at:
            self.figures.itl.observe(now - t.last_emit_at)
        else:
            self.figures.ttft.observe(now - t.arrival)
        if not t.first_token_at:
            t.first_token_at = now
        t.last_emit_at = now
        last = self.events[-1] if self.events else None
        if last is not None and last[0] is t.sink and isinstance(last[1], Delta):
            # Tokens of one step (accepted drafts) go out as one chunk: one SSE event for
            # the HTTP side to write, not one per token, on a core llama.cpp wants back.
            last[1].text += text
            last[1].logprobs.extend(t.logprobs)
            last[1].tokens.extend(t.unsent())
        else:
            self.events.append((t.sink, Delta(text, t.logprobs, t.unsent())))
        t.logprobs = []

    # -- finishing -----------------------------------------------------------------------
    def _finish(self, t: Turn, reason: str, error: ApplianceError | None = None, keep: bool = False) -> None:
        """Give the slot back, keep or free the KV, and tell the stream how it ended. A turn
        cut by a stop (`keep`) ends with its error but keeps its KV, and what it had
        generated goes out first, so its conversation is saved and continues after a restart."""
        self.sched.release(t)
        self.inbox.finished(t)
        t.leader = None
        self._release_kv(t, keep=(error is None or keep) and t.n_cached > 0)
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        log_finished(t, reason, error, self.clock())
        if error is None or keep:
            held = t.guard.release() if t.guard is not None else []  # an opening held (repeat.py): text
            tail = "".join(t.text.push(p) for p in held) + t.text.flush() if t.text is not None else ""
            if tail or t.logprobs or t.n_sent < len(t.output):  # held-back text, or tokens a stop string swallowed
                self.events.append((t.sink, Delta(tail, t.logprobs, t.unsent())))
                t.logprobs = []
        if error is not None:
            self.events.append((t.sink, Failed(error)))
            return
        self.figures.answered(t.first_token_at, self.clock())
        self.events.append((t.sink, Done(reason, t.n_prompt, len(t.output), t.n_reused)))

    def _release_kv(self, t: Turn, keep: bool) -> None:
        if t.seq_id >= 0:
            # Cells past prompt + output (drafts verified after the last kept token) go.
            held = t.n_prompt + len(t.output)
            if t.n_cached > held:
                self.model.seq_rm(t.seq_id, held, -1)
                t.n_cached = held
            self.kv.keep_or_free(t, keep)
            t.seq_id = -1
        if t.sampler is not None:
            t.sampler.free()
            t.sampler = None

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
        sessions = {s: SessionView(e.state, e.n_tokens, len(e.parked) if e.parked is not None else 0, e.last_used)
                    for s, e in cache.entries.items()}
        events = {**_fields(cache.events), **_fields(self.kv.stats)}
        return Snapshot(
            taken_at=self.clock(), slots=self.limits.slots, running=len(self.sched.running),
            waiting=tuple(t.rid for t in self.sched.waiting), taken=self.taken,
            sessions=MappingProxyType(sessions), parked_bytes=cache.parked_bytes, threads=self.threads,
            cores_others=self.cores.others if self.cores else 0.0, counters=st.counters(),
            cache_events=MappingProxyType(events), step_log=st.step_log.view(),
            admissible=self.sched.admissible(), step_s=self.pace.step_s, step_ends=self.step_ends,
            park_budget=cache.park_budget, finished_at=tuple(self.figures.finished_at),
            served_s=tuple(self.figures.served_s), histograms=self.figures.histograms())


def _fields(obj: Any) -> dict[str, int]:
    return {name: getattr(obj, name) for name in obj.__slots__}
