"""System prompts that become public once they are common: a whole system message that
`need_clients` different clients have sent, token for token, is copied once into a pinned
public sequence and shared like an operator preset (an office tool sends the same one from
every PC). What a client can learn from its timing is that someone else sent exactly the
system message it sent, never a part of one: only the whole block matches (docs/SECURITY.md).
kv/store.py asks it for each admitted turn, before looking for a prefix to reuse.

A trusted front-end's block is its own, not a person's: tool definitions after the template's
own system prompt or a preset (nothing a person wrote), sent for people the front-end names,
are public once computed. Open WebUI sends its 36 built-in tools (6,626 tokens) with every
chat turn of every person; read once, a new chat copies them instead of reading them for
minutes (issue 37)."""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from appliance.engine.kv.budget import InFlight, KVBudget
from appliance.engine.kv.cache import SessionCache
from appliance.engine.turn import Turn

log = logging.getLogger(__name__)


FRONT = "\x00front:"  # a trusted front-end's identity among a block's senders (no client id starts so)


class CopyOps(Protocol):
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


@dataclass(slots=True, eq=False)
class Candidate:
    tokens: list[int]  # the template's start through the end of the system message
    clients: set[str] = field(default_factory=set)  # who sent it (at most need_clients kept)
    seq_id: int = -1  # its public sequence once promoted
    last_used: float = 0.0


@dataclass(frozen=True, slots=True)
class CommonsPolicy:
    max_public: int = 4  # promoted system prompts held at once (pinned cells); 0 = off
    # Different client identities that must send the same block. Three, not two: with two,
    # the second identity's own request already copied the block, so one identity could
    # confirm in one request that a single other one had sent a guessed private prompt (a
    # code name, a budget figure). From three, what a guesser learns is that at least two
    # others send it: a common prompt, which is what this shares (docs/SECURITY.md).
    need_clients: int = 3
    min_tokens: int = 16  # shorter blocks are not worth a sequence
    max_tokens: int = 2048  # longer ones are not pinned for everyone
    max_front_tokens: int = 2048  # a trusted front-end's tools block (ctx_per_slot + tools_tokens)
    max_candidates: int = 256  # blocks remembered (by digest) while they wait for enough clients


class Commons:
    def __init__(self, policy: CommonsPolicy, seq_ids: range, model: CopyOps, cache: SessionCache,
                 budget: KVBudget, turns: InFlight, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.free_ids = list(reversed(seq_ids))  # public sequence ids of their own
        self.candidates: OrderedDict[bytes, Candidate] = OrderedDict()
        self.model, self.cache, self.budget, self.turns, self.clock = model, cache, budget, turns, clock

    def share(self, turn: Turn) -> bool:
        """Note the turn's system block; once enough other clients sent it whole, it is
        public and this turn may copy all of it (never a part). True if it was promoted now."""
        n = turn.system_len
        if not 0 < n < len(turn.prompt):
            return False
        # Through a front-end a block may be as long as its tools' allowance (pinning cost, not
        # privacy, bounds it); it is the front-end's at once only with nothing a person wrote.
        longest = self.policy.max_front_tokens if turn.front_end else 0
        front = bool(turn.front_end and turn.block_public)
        cand = self.note(FRONT + turn.front_end if front else turn.client, turn.prompt[:n], self.clock(),
                         1 if front else 0, longest)
        if cand is None:
            return False
        promoted = cand.seq_id < 0 and self._promote(cand)
        if cand.seq_id >= 0:
            turn.public_len = max(turn.public_len, n)
        return promoted

    def public_len(self, turn: Turn) -> int:
        """The public_len `share` would give this turn now, noting nothing: its block's length
        if the block is public already and the turn may copy it (KVStore.expected_share)."""
        n, p = turn.system_len, self.policy
        if not 0 < n < len(turn.prompt) or not p.min_tokens <= n <= max(
                p.max_front_tokens if turn.front_end else 0, p.max_tokens):
            return turn.public_len
        block = turn.prompt[:n]
        cand = self.candidates.get(self.key(block))
        if cand is None or cand.seq_id < 0 or cand.tokens != block:
            return turn.public_len
        front = bool(turn.front_end and turn.block_public)
        senders = sum(not c.startswith(FRONT) for c in cand.clients | {turn.client})
        return max(turn.public_len, n) if front or senders >= p.need_clients else turn.public_len

    def _promote(self, cand: Candidate) -> bool:
        """Copy the block from a sequence that holds it into a public one of its own and pin
        it; False while none has computed it yet (the next turn that sends it tries again)."""
        n, block = len(cand.tokens), cand.tokens
        donor = next((t.seq_id for t in self.turns.running if t.seq_id >= 0 and t.n_cached >= n
                      and t.prompt[:n] == block), -1)
        if donor < 0:
            donor = next((e.seq_id for e in self.cache.entries.values()
                          if e.seq_id >= 0 and not e.busy and e.tokens[:n] == block), -1)
        if donor < 0 or not self.budget.fits(n):
            return False
        if not self.free_ids and (old := self.least_used()) is not None:
            self._demote(old)
        sid = self.alloc()
        if sid is None:
            return False
        self.model.seq_cp(donor, sid, 0, n)
        self.cache.add_public(sid, block)
        self.budget.pin(n)  # as for a preset: cells no reservation may count on
        cand.seq_id = sid
        log.info("a system block of %d tokens is public now (sent by %d client identities)", n, len(cand.clients))
        return True

    def _demote(self, cand: Candidate) -> None:
        """The least recently sent promoted block gives its sequence to a new one (turns
        that copied it keep their cells); it may be promoted again."""
        self.cache.remove_public(cand.seq_id)
        self.model.seq_rm(cand.seq_id)
        self.budget.unpin(len(cand.tokens))
        n = len(cand.tokens)
        for e in self.cache.entries.values():  # their cells of it are their own now, not the pinned copy's
            if e.shared == n and e.tokens[:n] == cand.tokens:
                e.shared = 0
        self.release(cand)

    @staticmethod
    def key(tokens: list[int]) -> bytes:
        # A digest, not Python's hash(): no client can make its block collide with another's.
        return hashlib.blake2b(array("i", tokens).tobytes(), digest_size=16).digest()

    def note(self, client: str, block: list[int], now: float, need: int = 0, longest: int = 0) -> Candidate | None:
        """Client sent this whole block; the candidate once `need` (default: the policy's)
        different clients have, else None. Equality is checked token by token, not only by digest."""
        p = self.policy
        need = need or p.need_clients
        if not p.max_public or not p.min_tokens <= len(block) <= max(longest, p.max_tokens):
            return None
        k = self.key(block)
        cand = self.candidates.get(k)
        if cand is None:
            cand = self.candidates[k] = Candidate(list(block))
            self._bound()
        elif cand.tokens != block:
            return None  # a digest collision: nobody shares anything through it
        self.candidates.move_to_end(k)
        if len(cand.clients) < p.need_clients + 1:
            cand.clients.add(client)
        cand.last_used = now
        if need == 1:
            return cand
        # A front-end's copy never counts toward the identities a client needs: with two of its
        # own, an outsider would learn that the front-end had sent exactly these tools.
        return cand if sum(not c.startswith(FRONT) for c in cand.clients) >= need else None

    def _bound(self) -> None:
        """Forget the least recently sent blocks beyond max_candidates (promoted ones stay)."""
        excess = len(self.candidates) - self.policy.max_candidates
        for k in [k for k, c in self.candidates.items() if c.seq_id < 0][:max(0, excess)]:
            del self.candidates[k]

    def alloc(self) -> int | None:
        return self.free_ids.pop() if self.free_ids else None

    def release(self, cand: Candidate) -> int:
        """Demote: its id is free again (the caller clears the cells); it may come back."""
        sid, cand.seq_id = cand.seq_id, -1
        self.free_ids.append(sid)
        return sid

    def least_used(self) -> Candidate | None:
        """The promoted block sent least recently that no running turn copied: a turn's cells
        of it are counted as pinned (Turn.shared), so it stays pinned while they run."""
        held = [t.prompt for t in self.turns.running if t.shared]
        promoted = [c for c in self.candidates.values()
                    if c.seq_id >= 0 and not any(p[:len(c.tokens)] == c.tokens for p in held)]
        return min(promoted, key=lambda c: c.last_used, default=None)
