"""Which conversations keep their KV cache: session -> llama.cpp sequence id, cached tokens,
owner, last use; prefix matching with the isolation rule; TTL expiry and LRU eviction;
parking evicted sessions in RAM. Pure Python (the engine does the llama.cpp calls),
injected clock. The table changes only through these methods, which keep its invariants:
an id is either free or held by exactly one idle entry or a running turn, and a busy entry
is owned by its running turn.

A sequence id is not a decode slot: the running batch uses `slots` of them, and the rest
hold idle conversations so that their next turn only prefills its new tokens.

Isolation: a turn reuses any prefix of its own client's conversations (named by
X-Session-Id or not), but from other clients only *public* prefixes: the model's default
system prompt and the operator's presets, computed at start-up and pinned. So nothing one
client sends changes what another can find in the cache, or how fast.
"""

from __future__ import annotations

from collections import UserDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.names import saved_key
from appliance.model.prompt import common_prefix

# A turn continues one of its client's anonymous conversations (takes its sequence over)
# when the match covers all but this many of its cached tokens: the rendered template may
# tokenize the end of the last answer differently. A shorter match is a branch (an edit,
# a regeneration): the prefix is copied and the original conversation stays cached.
TAKEOVER_SLACK = 16


@dataclass(slots=True, eq=False)
class Entry:
    session: str
    seq_id: int  # -1 while parked or in no sequence
    tokens: list[int]  # tokens whose KV this entry holds, in order from position 0
    public_len: int  # leading tokens any client may reuse (a public system prompt)
    last_used: float
    owner: str = ""  # the client identity whose turns made it
    busy: bool = False  # a running turn owns the sequence
    parked: bytes | None = field(default=None, repr=False)  # llama_state_seq data in RAM
    disk: Any = field(default=None, repr=False)  # persist.Saved: state left by the last run
    own_tokens: int = 0  # cells counted for this entry (prefix copied from others excluded)
    turns: int = 1  # finished turns of this session
    named: bool = True  # the client chose the id (not one the server made up for it)
    public: bool = False  # a pinned public prefix, not a conversation
    shared: int = 0  # leading cells it shares with a pinned public prefix (Turn.shared)
    shared_from: int = -1  # that prefix's public sequence (Turn.shared_from)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def stored(self) -> bool:
        """Out of the KV cache but restorable: parked in RAM or saved on disk."""
        return self.seq_id < 0 and (self.parked is not None or self.disk is not None)

    @property
    def state(self) -> str:
        if self.busy:
            return "active"
        if self.seq_id >= 0:
            return "cached"
        return "parked" if self.parked is not None else "saved"


SAVED = "saved:"  # prefix of the key a session saved by the last run waits under


class SessionTable(UserDict[str, Entry]):
    """Entries by session id. A session saved by the last run is known only by the digest
    of its id, so it waits under SAVED + digest until the first lookup by its id (`in`,
    `get`, `[]`, `pop`) claims it and files it under the id.

    `version` grows whenever what a snapshot shows of the sessions may have changed: an
    entry added, removed or renamed here, or changed by a SessionCache method (`changed`).
    The engine rebuilds its sessions view only then, not every loop iteration."""

    def __init__(self) -> None:
        self.version = 0
        super().__init__()
        self.unclaimed = 0  # entries under SAVED keys (an upper bound: skips hashing when 0)

    def changed(self) -> None:
        self.version += 1

    def add_saved(self, entry: Entry) -> None:
        assert entry.session.startswith(SAVED) and entry.session not in self.data
        self.data[entry.session] = entry
        self.unclaimed += 1
        self.version += 1

    @staticmethod
    def key_of(session: str) -> str:
        """What a saved file names this entry's session by."""
        return session[len(SAVED):] if session.startswith(SAVED) else saved_key(session)

    def _claim(self, session: object) -> Entry | None:
        if not self.unclaimed or not isinstance(session, str) or session.startswith(SAVED):
            return None
        e = self.data.pop(SAVED + saved_key(session), None)
        if e is not None:
            self.unclaimed -= 1
            e.session = session
            self.data[session] = e
            self.version += 1
        return e

    def __contains__(self, key: object) -> bool:
        return key in self.data or self._claim(key) is not None

    def __missing__(self, key: str) -> Entry:
        e = self._claim(key)
        if e is None:
            raise KeyError(key)
        return e

    def __setitem__(self, key: str, entry: Entry) -> None:
        self.data[key] = entry
        self.version += 1

    def __delitem__(self, key: str) -> None:
        del self.data[key]
        self.version += 1
        if key.startswith(SAVED):
            self.unclaimed -= 1


@dataclass(frozen=True, slots=True)
class Match:
    entry: Entry | None  # an entry to take over, or a donor to copy a prefix from
    n_common: int  # tokens of the prompt already in that entry's KV
    own: bool  # True: take the entry's sequence over; False: copy its prefix


@dataclass(slots=True)
class CacheEvents:
    evicted: int = 0  # dropped from the KV cache (then parked, or gone)
    expired: int = 0  # TTL
    parked: int = 0
    parked_dropped: int = 0  # RAM budget
    parked_shed: int = 0  # the budget shrank: memory ran short, or the kernel was reclaiming


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
        self.share_all = share_all  # True: any prefix is reused across clients (leaks!)
        self.park_budget = park_budget_bytes
        self.free_ids: list[int] = sorted(seq_ids, reverse=True)
        self.entries = SessionTable()  # read freely; change only through methods
        self.public: list[Entry] = []  # pinned public prefixes, on ids of their own
        self.events = CacheEvents()

    # -- lookup --------------------------------------------------------------------------
    def match(self, session: str, client: str, prompt: list[int], public_len: int) -> Match:
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
        parked: Entry | None = None  # this client's anonymous conversation, parked, that the prompt continues
        parked_n = 0
        for e in (*self.public, *self.entries.values()):
            if e.seq_id < 0 and own is None and (n := self._continues(e, client, prompt, limit)) > parked_n:
                parked, parked_n = e, n
            if e.seq_id < 0 or e.busy:
                # Parked: not in the KV cache. Busy: a running turn may have cut its
                # sequence below e.tokens (running turns are matched by the engine).
                continue
            if e.owner == client and not e.public or self.share_all:
                cap = limit
            elif e.public:
                cap = min(limit, public_len, e.public_len)
            else:
                continue  # another client's conversation: never reused
            if cap > best_n:
                n = min(common_prefix(e.tokens, prompt), cap)
                if n > best_n:
                    best, best_n = e, n
        takeover = (best is not None and own is None and best.owner == client and not best.public
                    and not best.named and best_n >= best.n_tokens - TAKEOVER_SLACK)
        if parked is not None and parked_n > best_n:
            return Match(parked, parked_n, True)  # the engine restores it, then takes it over
        return Match(best, best_n, takeover)

    @staticmethod
    def _continues(e: Entry, client: str, prompt: list[int], limit: int) -> int:
        """Tokens of `prompt` a parked anonymous conversation of `client` holds, when the
        prompt continues it (as a takeover would need); else 0. Named sessions are found
        by their id instead, and parked entries are never donors (not in the KV cache)."""
        if e.parked is None or e.named or e.public or e.owner != client:
            return 0
        n = min(common_prefix(e.tokens, prompt), limit)
        return n if n > 0 and n >= e.n_tokens - TAKEOVER_SLACK else 0

    # -- ownership -----------------------------------------------------------------------
    def take(self, entry: Entry, session: str) -> None:
        """A running turn of `session` owns entry's sequence from now on."""
        if entry.session != session:  # continuing an anonymous conversation under a new id
            del self.entries[entry.session]
            entry.session = session
            self.entries[session] = entry
        entry.busy = True
        entry.last_used = self.clock()
        self.entries.changed()

    def alloc_id(self) -> int | None:
        return self.free_ids.pop() if self.free_ids else None

    def release_id(self, seq_id: int) -> None:
        self.free_ids.append(seq_id)

    def put(self, session: str, seq_id: int, tokens: list[int], public_len: int, copied: int,
            owner: str = "", named: bool = True, shared: int = 0, shared_from: int = -1) -> int | None:
        """A finished turn leaves its KV behind as the session's entry. Returns the sequence
        id of an idle entry it replaced (two turns of one session ran at once), whose
        cells the caller must clear; its id is free again."""
        old = self.entries.get(session)
        replaced = None
        if old is not None and old.seq_id not in (-1, seq_id) and not old.busy:
            replaced = old.seq_id
            self.release_id(old.seq_id)
        self.entries[session] = Entry(session, seq_id, tokens, public_len, self.clock(), owner=owner,
                                      own_tokens=len(tokens) - copied,
                                      turns=old.turns + 1 if old is not None else 1, named=named, shared=shared,
                                      shared_from=shared_from)
        return replaced

    def add_saved(self, entry: Entry) -> None:
        """An entry read back from disk after a restart (not in the KV cache), under
        SAVED + the digest of its session id until a turn of that session claims it."""
        assert entry.seq_id < 0
        self.entries.add_saved(entry)

    def add_public(self, seq_id: int, tokens: list[int]) -> None:
        self.public.append(Entry("", seq_id, tokens, len(tokens), self.clock(), public=True))

    def shares_pinned(self, e: Entry, n_common: int) -> bool:
        """The entry's first e.shared cells, all of them kept (n_common), are (a prefix of) the
        block it copied them from, still pinned (a front-end's block may copy a part of another)."""
        return 0 < e.shared <= n_common and any(p.seq_id == e.shared_from for p in self.public)

    def remove_public(self, seq_id: int) -> None:
        self.public = [e for e in self.public if e.seq_id != seq_id]

    def drop(self, session: str) -> Entry | None:
        """Forget a session. A busy entry's id stays with its running turn."""
        e = self.entries.pop(session, None)
        if e is not None and e.seq_id >= 0 and not e.busy:
            self.release_id(e.seq_id)
        return e

    # -- eviction ------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> int:
        return sum(e.own_tokens for e in self.entries.values() if e.seq_id >= 0 and not e.busy)

    @property
    def parked_bytes(self) -> int:
        return sum(len(e.parked) for e in self.entries.values() if e.parked is not None)

    def idle_lru(self) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.seq_id >= 0 and not e.busy),
                      key=lambda e: e.last_used)

    def expired(self) -> list[Entry]:
        """Entries past their TTL (in KV or parked), removed from the cache."""
        now = self.clock()
        old = [e for e in self.entries.values() if not e.busy and now - e.last_used > self.ttl_s]
        for e in old:
            self.drop(e.session)
            self.events.expired += 1
        return old

    def evict(self, e: Entry, parked: bytes | None) -> None:
        """Take e out of the KV cache; keep its state in RAM when given and the budget allows."""
        self.release_id(e.seq_id)
        e.seq_id = -1
        self.entries.changed()
        self.events.evicted += 1
        if parked is not None and len(parked) <= self.park_budget:
            e.parked = parked
            self.events.parked += 1
            self._fit_park_budget(keep=e)
        else:
            del self.entries[e.session]

    def unpark(self, e: Entry) -> None:
        """A restore has e's parked state in hand: e stops counting against the parking
        budget, so fitting the budget while room is made for it cannot drop it."""
        e.parked = None
        self.entries.changed()

    def restored(self, e: Entry, seq_id: int) -> None:
        e.parked, e.disk, e.seq_id = None, None, seq_id
        self.entries.changed()

    def set_park_budget(self, budget: int) -> int:
        """A new RAM budget for parked sessions; the least recently used ones beyond it are
        dropped. Returns how many."""
        self.park_budget = budget
        before = self.events.parked_shed
        self._fit_park_budget(keep=None)
        return self.events.parked_shed - before

    def _fit_park_budget(self, keep: Entry | None) -> None:
        parked = sorted((e for e in self.entries.values() if e.parked is not None), key=lambda e: e.last_used)
        total = sum(len(e.parked or b"") for e in parked)
        for e in parked:
            if total <= self.park_budget:
                break
            if e is keep:
                continue
            total -= len(e.parked or b"")
            del self.entries[e.session]
            if keep is None:
                self.events.parked_shed += 1
            else:
                self.events.parked_dropped += 1
