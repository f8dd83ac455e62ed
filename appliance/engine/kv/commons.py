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
minutes (issue 37). Its admins get 36 tools and its users 30, the first 24 the same: a
front-end's block copies the longest prefix of its other blocks that is public, and is
public itself as soon as a turn has computed it (`computed`), not when a second one sends it."""

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
from appliance.model.prompt import common_prefix

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
    front: str = ""  # the trusted front-end that sent it as its own (any prefix of it is the front-end's too)
    people: set[str] = field(default_factory=set)  # for whom the front-end sent it (at most two kept)
    # A promoted block whose first `borrowed` cells are another promoted block's (its donor had
    # copied them): pinned once, by the lender, until the lender is demoted.
    lender: Candidate | None = field(default=None, repr=False)
    borrowed: int = 0


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
        if front and len(cand.people) < 2:
            cand.people.add(turn.client)
        if cand.seq_id >= 0:
            turn.public_len = max(turn.public_len, n)
        elif front:
            turn.public_len = max(turn.public_len, self._front_prefix(cand.front, cand.tokens))
        return promoted

    def computed(self, turn: Turn) -> bool:
        """The turn has just computed its system block (core, prefill): a front-end's block is
        public from now on, so the next new chat copies it instead of waiting for another to
        send it (a person's first chat of the day would otherwise read it twice)."""
        n = turn.system_len
        if not (turn.front_end and turn.block_public) or not 0 < n <= turn.n_cached:
            return False
        cand = self.candidates.get(self.key(turn.prompt[:n]))
        if cand is None or cand.seq_id >= 0 or not cand.front or cand.tokens != turn.prompt[:n]:
            return False
        # Into a free public sequence only: a block read once (a person's own tool set through
        # the front-end) does not push out one that is sent all the time; sent again, it may.
        return bool(self.free_ids) and self._promote(cand)

    def _front_prefix(self, front: str, block: list[int]) -> int:
        """The longest prefix of the front-end's not yet public block that one of its public
        blocks holds (0 when under min_tokens). Only a block it sent for two people or more
        lends a part: a person may add tools of their own (Open WebUI's workspace tools), and
        a part of a block sent for one other person would tell, token by token, how much of
        a guess at their tools is right; a block two others get is the front-end's."""
        best = max((common_prefix(c.tokens, block) for c in self.candidates.values()
                    if c.seq_id >= 0 and c.front == front and len(c.people) >= 2), default=0)
        return best if best >= self.policy.min_tokens else 0

    def public_len(self, turn: Turn) -> int:
        """The public_len `share` would give this turn now, noting nothing: its block's length
        if the block is public already and the turn may copy it (KVStore.expected_share)."""
        n, p = turn.system_len, self.policy
        if not 0 < n < len(turn.prompt) or not p.min_tokens <= n <= max(
                p.max_front_tokens if turn.front_end else 0, p.max_tokens):
            return turn.public_len
        block = turn.prompt[:n]
        cand = self.candidates.get(self.key(block))
        front = bool(turn.front_end and turn.block_public)
        if front and (cand is None or cand.seq_id < 0):
            return max(turn.public_len, self._front_prefix(FRONT + turn.front_end, block))
        if cand is None or cand.seq_id < 0 or cand.tokens != block:
            return turn.public_len
        senders = sum(not c.startswith(FRONT) for c in cand.clients | {turn.client})
        return max(turn.public_len, n) if front or senders >= p.need_clients else turn.public_len

    def _promote(self, cand: Candidate) -> bool:
        """Copy the block from a sequence that holds it into a public one of its own and pin
        it; False while none has computed it yet (the next turn that sends it tries again)."""
        n, block = len(cand.tokens), cand.tokens
        running = next((t for t in self.turns.running if t.seq_id >= 0 and t.n_cached >= n
                        and t.prompt[:n] == block), None)
        donor = -1 if running is None else running.seq_id
        if donor < 0:  # an idle copy's shared cells are not traced to their block: pinned twice
            donor = next((e.seq_id for e in self.cache.entries.values()
                          if e.seq_id >= 0 and not e.busy and e.tokens[:n] == block), -1)
        # The donor's first cells may be another public block's (a front-end's user tools
        # copied from its admin ones): the copy shares them, so they are pinned once.
        lender = None if running is None else next(
            (c for c in self.candidates.values() if c.seq_id >= 0 and c.seq_id == running.shared_from), None)
        borrowed = 0 if lender is None or running is None else min(running.shared, n)
        # A running donor's own cells of the block become the pinned copy's (llama.cpp shares
        # cells between sequences): its reservation gives them back, so promoting costs no
        # cells. Counted twice, a 5,432-token block read beside a pinned 6,603-token one did
        # not fit in 16,384 cells, and every later chat read it again (Open WebUI, issue 37).
        own = n - borrowed if running is not None and running.shared <= n else 0
        if donor < 0 or not self.budget.fits(n - borrowed - own):
            return False
        if not self.free_ids and (old := self.least_used()) is not None and old is not lender:
            self._demote(old)
        sid = self.alloc()
        if sid is None:
            return False
        self.model.seq_cp(donor, sid, 0, n)
        self.cache.add_public(sid, block)
        self.budget.pin(n - borrowed)  # as for a preset: cells no reservation may count on
        if own and running is not None:
            self.budget.hold(running, running.reserved - own)
            running.shared, running.shared_from = n, sid
        cand.seq_id, cand.lender, cand.borrowed = sid, lender, borrowed
        log.info("a system block of %d tokens is public now (sent by %d client identities)", n, len(cand.clients))
        return True

    def _demote(self, cand: Candidate) -> None:
        """The least recently sent promoted block gives its sequence to a new one (turns
        that copied it keep their cells); it may be promoted again."""
        self.cache.remove_public(cand.seq_id)
        self.model.seq_rm(cand.seq_id)
        self.budget.unpin(len(cand.tokens) - cand.borrowed)
        cand.lender, cand.borrowed = None, 0
        for c in self.candidates.values():  # the cells they borrowed are theirs alone now
            if c.lender is cand:
                self.budget.pin(c.borrowed)
                c.lender, c.borrowed = None, 0
        for e in self.cache.entries.values():  # their cells of it are their own now, not the pinned copy's
            if e.shared and e.shared_from == cand.seq_id:
                e.own_tokens += e.shared
                e.shared, e.shared_from = 0, -1
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
        if client.startswith(FRONT):
            cand.front = client
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
        held = {t.shared_from for t in self.turns.running if t.shared}
        promoted = [c for c in self.candidates.values() if c.seq_id >= 0 and c.seq_id not in held]
        return min(promoted, key=lambda c: c.last_used, default=None)
