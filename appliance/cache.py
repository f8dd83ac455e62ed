"""Which conversations keep their KV cache: session -> llama.cpp sequence id, cached tokens,
last use; prefix matching with the isolation rule; TTL expiry and LRU eviction; parking
evicted sessions in RAM. Pure Python (the engine does the llama.cpp calls), injected clock.

A sequence id is not a decode slot: the running batch uses `slots` of them, and the rest
hold idle conversations so that their next turn only prefills its new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts share long prefixes, and slicing is C-fast.
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(slots=True, eq=False)
class Entry:
    session: str
    seq_id: int  # -1 while parked or in no sequence
    tokens: list[int]  # tokens whose KV this entry holds, in order from position 0
    shared_len: int  # leading tokens other sessions may reuse (system prompt + template)
    last_used: float
    busy: bool = False  # a running request owns the sequence
    parked: bytes | None = field(default=None, repr=False)  # llama_state_seq data in RAM
    disk: Any = field(default=None, repr=False)  # persist.Saved: state left by the last run
    own_tokens: int = 0  # cells counted for this entry (prefix copied from others excluded)
    turns: int = 1  # finished turns of this session
    named: bool = True  # the client chose the id (not one the server made up for it)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def worth_parking(self) -> bool:
        """A session the client can come back to: it chose the id, or has come back already.
        One-off requests with a server-made id rarely return; parking them costs engine time."""
        return self.named or self.turns > 1

    @property
    def stored(self) -> bool:
        """Out of the KV cache but restorable: parked in RAM or saved on disk."""
        return self.seq_id < 0 and (self.parked is not None or self.disk is not None)


@dataclass(frozen=True, slots=True)
class Match:
    entry: Entry | None  # session's own entry to take over, or a donor to copy from
    n_common: int  # tokens of the prompt already in that entry's KV
    own: bool  # True: the session's own entry (take over); False: copy a shared prefix


@dataclass(slots=True)
class CacheStats:
    hits: int = 0  # turns that found their own session
    shared_hits: int = 0  # turns that copied another sequence's system prompt
    evicted: int = 0  # dropped from the KV cache (then parked, or gone)
    expired: int = 0  # TTL
    parked: int = 0
    restored: int = 0
    recomputed: int = 0  # parked, but recomputing was cheaper (or the park was dropped)
    parked_dropped: int = 0  # RAM budget


class SessionCache:
    def __init__(
        self,
        seq_ids: Iterable[int],
        clock: Callable[[], float],
        ttl_s: float = 1800.0,
        share_all: bool = False,
        park_budget_bytes: int = 0,
    ) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self.share_all = share_all  # False: across sessions reuse only the shared prefix
        self.park_budget = park_budget_bytes
        self.free_ids: list[int] = sorted(seq_ids, reverse=True)
        self.entries: dict[str, Entry] = {}
        self.stats = CacheStats()

    # -- lookup --------------------------------------------------------------------------
    def match(self, session: str, prompt: list[int], shared_len: int) -> Match:
        """The best reuse for a new turn. At least the last prompt token is always left to
        compute, since its logits give the first answer token."""
        limit = len(prompt) - 1
        own = self.entries.get(session)
        if own is not None and not own.busy and own.seq_id >= 0:
            n = min(common_prefix(own.tokens, prompt), limit)
            if n > 0:
                return Match(own, n, True)
        best: Entry | None = None
        best_n = 0
        cap = limit if self.share_all else min(shared_len, limit)
        if cap > 0:
            for e in self.entries.values():
                if e.seq_id < 0 or e.busy:
                    # Parked: not in the KV cache. Busy: a running turn may have cut its
                    # sequence below e.tokens (running sequences are matched by the engine).
                    continue
                n = min(common_prefix(e.tokens, prompt), cap if self.share_all else min(cap, e.shared_len))
                if n > best_n:
                    best, best_n = e, n
        return Match(best, best_n, False)

    # -- ownership -----------------------------------------------------------------------
    def take(self, entry: Entry) -> None:
        entry.busy = True
        entry.last_used = self.clock()

    def alloc_id(self) -> int | None:
        return self.free_ids.pop() if self.free_ids else None

    def release_id(self, seq_id: int) -> None:
        self.free_ids.append(seq_id)

    def put(self, session: str, seq_id: int, tokens: list[int], shared_len: int, copied: int,
            named: bool = True) -> int | None:
        """A finished turn leaves its KV behind as the session's entry. Returns the sequence
        id of an idle entry it replaced (two turns of one session ran at once), whose
        cells the caller must clear; its id is free again."""
        old = self.entries.get(session)
        replaced = None
        if old is not None and old.seq_id not in (-1, seq_id) and not old.busy:
            replaced = old.seq_id
            self.release_id(old.seq_id)
        self.entries[session] = Entry(session, seq_id, tokens, shared_len, self.clock(),
                                      own_tokens=len(tokens) - copied,
                                      turns=old.turns + 1 if old is not None else 1, named=named)
        return replaced

    def drop(self, session: str) -> Entry | None:
        e = self.entries.pop(session, None)
        if e is not None and e.seq_id >= 0 and not e.busy:
            self.release_id(e.seq_id)
        return e

    # -- eviction ------------------------------------------------------------------------
    # list() before iterating: /health and /metrics read these from the event loop thread
    # while the engine thread changes the dict; list() copies it atomically under the GIL.
    @property
    def cached_tokens(self) -> int:
        return sum(e.own_tokens for e in list(self.entries.values()) if e.seq_id >= 0 and not e.busy)

    @property
    def parked_bytes(self) -> int:
        return sum(len(p) for e in list(self.entries.values()) if (p := e.parked) is not None)

    def idle_lru(self) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.seq_id >= 0 and not e.busy),
                      key=lambda e: e.last_used)

    def expired(self) -> list[Entry]:
        """Entries past their TTL (in KV or parked), removed from the cache."""
        now = self.clock()
        old = [e for e in self.entries.values() if not e.busy and now - e.last_used > self.ttl_s]
        for e in old:
            del self.entries[e.session]
            if e.seq_id >= 0:
                self.release_id(e.seq_id)
            self.stats.expired += 1
        return old

    def evict(self, e: Entry, parked: bytes | None) -> None:
        """Take e out of the KV cache; keep its state in RAM when given and the budget allows."""
        self.release_id(e.seq_id)
        e.seq_id = -1
        self.stats.evicted += 1
        if parked is not None and len(parked) <= self.park_budget:
            e.parked = parked
            self.stats.parked += 1
            self._fit_park_budget(keep=e)
        else:
            del self.entries[e.session]

    def _fit_park_budget(self, keep: Entry) -> None:
        parked = sorted((e for e in self.entries.values() if e.parked is not None), key=lambda e: e.last_used)
        total = sum(len(e.parked or b"") for e in parked)
        for e in parked:
            if total <= self.park_budget:
                break
            if e is keep:
                continue
            total -= len(e.parked or b"")
            del self.entries[e.session]
            self.stats.parked_dropped += 1
