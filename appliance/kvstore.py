"""The engine's KV cache management: which llama.cpp sequence a turn uses and what it can
reuse (its session's history, a parked or saved copy of it, another session's system
prompt), and what gives way when the cache is full. Engine thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from . import persist
from .cache import Entry, SessionCache, common_prefix
from .errors import KVCacheFull
from .scheduler import Scheduler
from .sequence import Sequence, State

log = logging.getLogger(__name__)


class SequenceOps(Protocol):
    """The KV-cache side of llm.LLM."""

    fingerprint: str  # model + llama.cpp version + KV type: what saved state must match

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_state(self, seq: int) -> bytes: ...
    def set_seq_state(self, seq: int, data: bytes) -> bool: ...


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


class KVStore:
    def __init__(self, model: SequenceOps, cache: SessionCache, policy: CachePolicy, sched: Scheduler,
                 kv_tokens: int, clock: Callable[[], float]) -> None:
        self.model = model
        self.cache = cache
        self.policy = policy
        self.sched = sched
        self.kv_tokens = kv_tokens
        self.clock = clock
        self._next_ttl_check = 0.0

    def evict_lru(self) -> bool:
        """Make room after a "KV cache full" decode; False when nothing idle is left."""
        idle = self.cache.idle_lru()
        if idle:
            self._evict(idle[0])
        return bool(idle)

    def attach(self, seq: Sequence) -> None:
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

    def resolve_followers(self) -> None:
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
        if (self.policy.park_bytes and e.worth_parking
                and e.n_tokens >= max(1, self.policy.restore_min_tokens)):
            data = self.model.seq_state(sid)
        self.cache.evict(e, data)
        self.model.seq_rm(sid)

    def make_room(self) -> bool:
        """Keep idle sessions + running reservations within the KV budget (LRU first)."""
        idle = self.cache.idle_lru()
        while idle and self.cache.cached_tokens + self.sched.reserved > self.kv_tokens:
            self._evict(idle.pop(0))
        return bool(idle)

    def expire(self) -> None:
        now = self.clock()
        if now < self._next_ttl_check:
            return
        self._next_ttl_check = now + 1.0
        for e in self.cache.expired():
            if e.seq_id >= 0:
                self.model.seq_rm(e.seq_id)
            _forget(e.disk)

    def drop_session(self, session: str) -> None:
        # Turns of this session running or queued now must not cache it when they finish
        # (a first turn has no entry yet, but would leave one).
        for s in (*self.sched.running, *self.sched.waiting):
            if s.session == session:
                s.no_cache = True
        e = self.cache.entries.get(session)
        if e is None:
            return
        if e.busy:
            del self.cache.entries[session]  # its running turn owns the sequence id
            return
        sid = e.seq_id
        self.cache.drop(session)
        if sid >= 0:
            self.model.seq_rm(sid)
        _forget(e.disk)

    def keep_or_free(self, s: Sequence, keep: bool) -> None:
        """A finished turn's KV stays as its session's cache entry, unless it failed or the
        session was deleted meanwhile."""
        cache = self.cache
        if keep and not s.no_cache:
            tokens = (s.prompt + s.output)[:s.n_cached]
            old = cache.entries.get(s.session)
            if old is not None:
                _forget(old.disk)  # a file saved by the last run is superseded by this turn
            replaced = cache.put(s.session, s.seq_id, tokens, s.shared_len, s.copied, s.named)
            if replaced is not None:
                self.model.seq_rm(replaced)
            self.make_room()
            return
        own = cache.entries.get(s.session)
        if own is not None and own.seq_id == s.seq_id:
            del cache.entries[s.session]
        self.model.seq_rm(s.seq_id)
        cache.release_id(s.seq_id)

    def load_sessions(self) -> None:
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

    def save_sessions(self) -> None:
        if not self.policy.state_dir:
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


def _forget(saved: persist.Saved | None) -> None:
    if saved is not None:
        try:
            saved.path.unlink(missing_ok=True)
        except OSError as e:  # a stale file is harmless; a crashed engine is not
            log.warning("could not remove %s: %s", saved.path, e)
