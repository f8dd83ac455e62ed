"""The engine's KV cache management: which llama.cpp sequence a turn uses and what it can
reuse (its session's history, a parked or saved copy of it, another session's system
prompt), and what gives way when the cache is full. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from appliance.engine.kv import followers, persist, saving
from appliance.engine.kv.budget import InFlight, KVBudget
from appliance.engine.kv.cache import Entry, SessionCache
from appliance.engine.kv.commons import Commons
from appliance.engine.kv.parking import IDLE_PARK_AFTER_S, PARK_RESERVE_MIN, MemoryFit, park_budget
from appliance.engine.kv.policy import CachePolicy
from appliance.engine.kv.saving import discard
from appliance.engine.names import log_name
from appliance.engine.turn import Turn
from appliance.errors import EngineFailure, KVCacheFull
from appliance.model.prompt import common_prefix

# CachePolicy, park_budget and the parking constants live in policy.py and parking.py;
# ops/serve.py and the tests import them from here too.
__all__ = ["IDLE_PARK_AFTER_S", "PARK_RESERVE_MIN", "CachePolicy", "KVStore", "ReuseStats", "park_budget"]
log = logging.getLogger(__name__)


class SequenceOps(Protocol):
    """The KV-cache side of llm.LLM."""

    fingerprint: str  # model + llama.cpp version + KV type: what saved state must match

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_state(self, seq_id: int) -> bytes: ...
    def set_seq_state(self, seq_id: int, data: bytes) -> bool: ...


@dataclass(slots=True)
class ReuseStats:
    hits: int = 0  # turns that took over a cached conversation of their own
    shared_hits: int = 0  # turns that copied a prefix (public, or their client's own)
    restored: int = 0  # parked or saved conversations brought back
    recomputed: int = 0  # parked, but recomputing was cheaper (or the park was dropped)
    promoted: int = 0  # system prompts made public (kv/commons.py)


class KVStore:
    def __init__(self, model: SequenceOps, cache: SessionCache, policy: CachePolicy, budget: KVBudget,
                 turns: InFlight, clock: Callable[[], float]) -> None:
        self.model = model
        self.cache = cache
        self.policy = policy
        self.budget = budget
        self.turns = turns  # the turns in flight (the scheduler), read, never changed here
        self.clock = clock
        self.stats = ReuseStats()
        self.commons: Commons | None = None  # set by the core once the preset ids are known
        self._next_ttl_check = 0.0
        self.memory = MemoryFit(policy, cache)

    def evict_lru(self) -> bool:
        """Make room after a "KV cache full" decode; False when nothing idle is left."""
        idle = self.cache.idle_lru()
        if idle:
            self._evict(idle[0])
        return bool(idle)

    def attach(self, turn: Turn) -> None:
        """Give an admitted turn its llama.cpp sequence id, reusing cached KV: its session's
        history (or its client's conversation it continues), a parked or saved copy of
        that, else the longest prefix it may copy (its client's own, or a public one)."""
        cache = self.cache
        # Admission may have counted on sharing a pinned prefix (Scheduler.shares): the full
        # reservation back first, then _share_pinned gives back what the turn really copies.
        self.budget.hold(turn, turn.reserved + turn.shared)
        turn.shared, turn.shared_from = 0, -1
        if self.commons is not None:
            self.stats.promoted += self.commons.share(turn)
        m = cache.match(turn.session, turn.client, turn.prompt, turn.public_len)
        if m.own and m.entry is not None and m.entry.seq_id >= 0:
            self._take_over(turn, m.entry, m.n_common)
            return
        # Its own session, or else the client's parked anonymous conversation it continues.
        own = cache.entries.get(turn.session) or (m.entry if m.own else None)
        if own is not None and own.stored:
            if self._restore(turn, own):
                return
            # Restoring may have evicted the donor found above: look again.
            m = cache.match(turn.session, turn.client, turn.prompt, turn.public_len)
        donor = m.entry if m.entry is not None and m.n_common >= self.policy.min_shared else None
        leader, lead_n = followers.leader(turn, self.turns.running, self.policy.share_all)
        if leader is not None and lead_n > (m.n_common if donor is not None else 0):
            donor = None  # a running turn is computing more of this prompt: wait and copy that
        if donor is not None:
            donor.busy = True  # pinned: making room for our id must not evict the donor
        try:
            turn.seq_id = self._alloc_id()
        finally:
            if donor is not None:
                donor.busy = False
        if donor is not None:
            self.model.seq_cp(donor.seq_id, turn.seq_id, 0, m.n_common)
            turn.n_cached = turn.n_reused = turn.copied = m.n_common
            if donor.public:
                self._share_pinned(turn, m.n_common, donor.seq_id)
            self.stats.shared_hits += 1
            return
        if leader is not None and lead_n >= self.policy.min_shared:
            turn.leader, turn.lead_n = leader, lead_n

    def _take_over(self, turn: Turn, e: Entry, n_common: int) -> None:
        self.cache.take(e, turn.session)
        self.model.seq_rm(e.seq_id, n_common, -1)  # an edited history keeps what still matches
        turn.seq_id, turn.n_cached, turn.n_reused = e.seq_id, n_common, n_common
        # Cells this entry shares with the sequence it copied from stay not-its-own.
        turn.copied = min(e.n_tokens - e.own_tokens, n_common)
        # A conversation that copied a pinned block (a front-end's tools) goes on sharing it,
        # while the block is still pinned.
        if self.cache.shares_pinned(e, n_common):
            self._share_pinned(turn, e.shared, e.shared_from)
        self.stats.hits += 1

    def expected_share(self, turn: Turn) -> int:
        """The cells of a pinned public prefix `attach` would let this waiting turn copy, as
        things stand (0 where unsure: a restore, a leader computing more). Pure: admission
        asks it only of a turn that does not fit otherwise (Scheduler.shares)."""
        # k: a front-end's block may copy a part of one (kv/commons)
        cache, k = self.cache, self.policy.min_shared
        if not any(turn.prompt[:k] == p.tokens[:k] for p in cache.public):
            return 0
        public_len = turn.public_len if self.commons is None else self.commons.public_len(turn)
        m = cache.match(turn.session, turn.client, turn.prompt, public_len)
        e = m.entry
        if m.own and e is not None and e.seq_id >= 0:  # _take_over
            return e.shared if cache.shares_pinned(e, m.n_common) else 0
        own = cache.entries.get(turn.session) or (e if m.own else None)
        if own is not None and own.stored or e is None or not e.public or m.n_common < self.policy.min_shared:
            return 0
        leader, lead_n = followers.leader(turn, self.turns.running, self.policy.share_all)
        return 0 if leader is not None and lead_n > m.n_common else m.n_common

    def _share_pinned(self, turn: Turn, n: int, source: int) -> None:
        """The turn's first n cells are a pinned public prefix's: counted once, as pinned, so
        its reservation gives them back (a front-end's 6,626-token tools block reserved per
        chat let two chats run at once in 16,384 cells; shared, a dozen)."""
        self.budget.hold(turn, turn.reserved - n)
        turn.shared, turn.shared_from = n, source

    def _restore(self, turn: Turn, e: Entry) -> bool:
        """Bring a parked session back into the KV cache, when cheaper than recomputing."""
        n = min(common_prefix(e.tokens, turn.prompt), len(turn.prompt) - 1)
        worth = n >= max(1, self.policy.restore_min_tokens)
        data = e.parked
        if data is None and e.disk is not None and worth:
            data = persist.load(e.disk)  # checksummed: a damaged file gives None, not a crash
        if data is None or not worth:
            self._forget(e)
            return False
        # Claim the state first: parking another session to free an id for it must not shed
        # this one from the parking budget (it is usually the oldest parked) mid-restore.
        self.cache.unpark(e)
        try:
            turn.seq_id = sid = self._alloc_id()  # the turn's from here: freed with it on failure
            ok = self._set_state(sid, data)
        except Exception:
            self._forget(e)  # its state is no longer anywhere
            raise
        if not ok:
            log.warning("session %s: could not restore parked state; recomputing", log_name(e.session))
            turn.seq_id = -1
            self.cache.release_id(sid)
            self._forget(e)
            return False
        discard(e.disk)
        self.cache.restored(e, sid)
        self.cache.take(e, turn.session)
        self.model.seq_rm(sid, n, -1)
        turn.n_cached, turn.n_reused = n, n
        self.stats.restored += 1
        return True

    def _set_state(self, sid: int, data: bytes) -> bool:
        """Load saved state into sequence sid, evicting idle sessions while the cells are
        short. A restore needs free cells, not contiguous ones (llama.cpp places it like a
        batch), and the turn's own reserve counts it: refused with the books in bounds, it
        was refused for another reason, and evicting everyone else would not help."""
        while True:
            try:
                if self.model.set_seq_state(sid, data):
                    return True
            except KVCacheFull:
                pass  # no free cells: same as a refused restore, handled below
            self.model.seq_rm(sid)
            idle = self.cache.idle_lru()
            if not idle or self.cache.cached_tokens + self.budget.committed <= self.budget.total:
                return False
            self._evict(idle[0])

    def _forget(self, e: Entry) -> None:
        discard(e.disk)
        self.cache.drop(e.session)
        self.stats.recomputed += 1

    def resolve_followers(self) -> None:
        self.stats.shared_hits += followers.resolve(self.turns.running, self.model)

    def _alloc_id(self) -> int:
        sid = self.cache.alloc_id()
        while sid is None:
            # More sequence ids than slots, so an idle session always exists here.
            idle = self.cache.idle_lru()
            if not idle:
                raise EngineFailure("no free sequence id (every id is held by a running request)")
            self._evict(idle[0])
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

    def make_room(self) -> bool:
        """Keep idle sessions + running reservations within the KV budget (LRU first), and
        idle sessions within idle_kv_tokens while parking can keep them."""
        idle = self.cache.idle_lru()
        while idle and self.cache.cached_tokens + self.budget.committed > self.budget.total:
            self._evict(idle.pop(0))
        self._park_idle(idle)
        return bool(idle)

    def _park_idle(self, idle: list[Entry] | None = None) -> None:
        """Park the least recently used idle sessions beyond idle_kv_tokens, once idle for
        IDLE_PARK_AFTER_S. Every decode step attends over the KV cache's whole used range,
        so idle cells slow every stream (12k idle cells: a 16-row step 24% slower), while
        parking and later restoring a 512-token conversation costs ~20 ms of the engine
        thread, a pause for every stream (docs/benchmarks/speculation.md)."""
        cap = self.policy.idle_kv_tokens
        if not cap or self.cache.park_budget <= 0:
            return
        if idle is None:
            idle = self.cache.idle_lru()
        now = self.clock()
        while idle and self.cache.cached_tokens > cap and now - idle[0].last_used >= IDLE_PARK_AFTER_S:
            self._evict(idle.pop(0))

    def expire(self) -> None:
        now = self.clock()
        if now < self._next_ttl_check:
            return
        self._next_ttl_check = now + 1.0
        self.memory.fit()
        self._park_idle()
        for e in self.cache.expired():
            if e.seq_id >= 0:
                self.model.seq_rm(e.seq_id)
            discard(e.disk)

    def drop_session(self, session: str) -> bool:
        """Forget a session now, and what its turns in flight would leave; True if there
        was anything to forget."""
        in_flight = False
        for t in (*self.turns.running, *self.turns.waiting):
            if t.session == session:
                t.no_cache = True  # a first turn has no entry yet, but would leave one
                in_flight = True
        e = self.cache.drop(session)
        if e is None:
            return in_flight
        if e.seq_id >= 0 and not e.busy:  # a busy entry's id stays with its running turn
            self.model.seq_rm(e.seq_id)
        discard(e.disk)
        return True

    def keep_or_free(self, t: Turn, keep: bool) -> None:
        """A finished turn's KV stays as its session's cache entry, unless it failed or the
        session was deleted meanwhile."""
        cache = self.cache
        if keep and not t.no_cache:
            tokens = (t.prompt + t.output)[:t.n_cached]
            old = cache.entries.get(t.session)
            if old is not None:
                discard(old.disk)  # a file saved by the last run is superseded by this turn
            replaced = cache.put(t.session, t.seq_id, tokens, t.public_len, t.copied, t.client, t.named,
                                 t.shared, t.shared_from)
            if replaced is not None:
                self.model.seq_rm(replaced)
            self.make_room()
            return
        own = cache.entries.get(t.session)
        if own is not None and own.seq_id == t.seq_id:
            cache.drop(t.session)  # busy: the id stays ours, released below
        self.model.seq_rm(t.seq_id)
        cache.release_id(t.seq_id)

    def add_public(self, seq_id: int, tokens: list[int]) -> None:
        """Pin a public prefix (a system prompt anyone may send) computed at start-up."""
        self.cache.add_public(seq_id, tokens)

    def load_sessions(self) -> None:
        saving.load(self.cache, self.policy, self.model.fingerprint, self.clock)

    def save_sessions(self) -> None:
        saving.save(self.cache, self.policy, self.model, self.clock)
