"""Which sequences run in the next decode step (pure policy: no llama.cpp, injected clock).

Each step carries one token for every generating sequence first, then fills the rest of
the token budget with prompt chunks, shortest remaining prompt first. The Scheduler holds
the queue, the running turns and their KV reservations, and composes four policies
(policy/): the admission window (`Window`), fair shares between clients (`Fairness`), the
background lane (`Lanes`) and chunked prefill (`Chunking`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from appliance.engine.kv.budget import KVBudget
from appliance.engine.plan import Limits, Step
from appliance.engine.policy.admission import Window
from appliance.engine.policy.chunking import Chunking
from appliance.engine.policy.fairness import Fairness
from appliance.engine.policy.lanes import Lanes
from appliance.engine.turn import State, Turn
from appliance.errors import Unavailable

__all__ = ["Limits", "Scheduler", "Step"]  # Limits and Step live in plan.py; imported from here too


class Scheduler:
    def __init__(self, limits: Limits, clock: Callable[[], float], budget: KVBudget | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.budget = budget or KVBudget(limits.kv_tokens)  # reserved here, pinned by the KV side
        self.waiting: deque[Turn] = deque()
        self.running: list[Turn] = []
        self.window = Window(limits, clock)
        self.fairness = Fairness(limits, clock)
        self.lanes = Lanes(limits)
        self.chunking = Chunking(limits)
        # The cells of a pinned public prefix the KV store's attach would let a waiting turn
        # copy (KVStore.expected_share; set by the core). Admission counts them once, as
        # pinned: counted again per chat, Open WebUI's 6,626-token tools let one chat at a
        # time start beside two running in 16,384 cells.
        self.shares: Callable[[Turn], int] = lambda turn: 0

    @property
    def reserved(self) -> int:
        """Cells promised to the running turns (the budget's; this is its one writer)."""
        return self.budget.reserved

    @property
    def pinned(self) -> int:
        return self.budget.pinned

    # -- the step ------------------------------------------------------------------------
    def expired(self) -> list[tuple[Turn, Unavailable | None, bool]]:
        """Remove cancelled sequences and those that waited too long for a slot.
        Returns (turn, error to report or None for a plain cancel, was it waiting)."""
        now = self.clock()
        out: list[tuple[Turn, Unavailable | None, bool]] = []
        if any(s.cancelled for s in self.running):
            for s in [s for s in self.running if s.cancelled]:
                out.append((s, None, False))
        keep: deque[Turn] = deque()
        for s in self.waiting:
            if s.cancelled:
                out.append((s, None, True))
            elif now - s.arrival > self.limits.queue_timeout_s:
                out.append((s, Unavailable(
                    f"no slot became free within {self.limits.queue_timeout_s:g} s", retry_after=5), True))
            else:
                keep.append(s)
        self.waiting = keep
        return out

    def window_open_until(self) -> float | None:
        """When idle with a young queue, the time the admission window closes (policy/admission.py)."""
        return self.window.closes(self.waiting, bool(self.running))

    def order(self, now: float) -> list[Turn]:
        """The waiting turns in admission order: people's, then background work's, each
        lane fair within itself (policy/fairness.py)."""
        fair = self.fairness.order
        people = [t for t in self.waiting if not t.background]
        if len(people) == len(self.waiting):
            return fair(people, self.running, now)
        background = [t for t in self.waiting if t.background]
        return fair(people, self.running, now) + fair(background, self.running, now)

    def admit(self) -> list[Turn]:
        """Move waiting sequences into free slots, in admission order (`order`), while the
        KV budget allows. The waiting queue is kept in that order, so the queue positions
        streams hear are the order they will be admitted in (as things stand)."""
        now = self.clock()
        if len(self.waiting) > 1:
            self.waiting = deque(self.order(now))
        if self.window_open_until() is not None:
            return []
        admitted = []
        while self.waiting and len(self.running) < self.limits.slots:
            turn = self.waiting[0]
            if self.lanes.holds_back(turn, self.limits.slots - len(self.running), self.running):
                break  # the rest are background too (order): they wait for people to leave room
            need = turn.kv_reserve(self.limits.ctx_limit)
            if not self._fits(bool(self.running), self.budget.committed, need):
                turn.shared = self.shares(turn)  # attach takes it back if it copies less
                need = turn.kv_reserve(self.limits.ctx_limit)
                if not self._fits(bool(self.running), self.budget.committed, need):
                    turn.shared = 0
                    break  # head of line waits for cache space, so it cannot be starved
            self.waiting.popleft()
            turn.state = State.PREFILL
            turn.admitted_at = now
            self.budget.hold(turn, need)
            self.running.append(turn)
            admitted.append(turn)
            self.fairness.admitted(turn, now)
        self.fairness.forget(self.running, self.waiting)
        return admitted

    def admissible(self) -> int:
        """How many queue places the next admission would take as things stand: the waiting
        turns, in order, while slots and the KV budget allow (as `admit`); when every one of
        them fits, the free slots, open to those still arriving too."""
        free = self.limits.slots - len(self.running)
        reserved = self.budget.committed
        for n, t in enumerate(self.waiting):
            need = t.kv_reserve(self.limits.ctx_limit)
            if n < free and not self._fits(bool(self.running) or n > 0, reserved, need):
                need -= self.shares(t)  # as admit
            if n >= free or not self._fits(bool(self.running) or n > 0, reserved, need):
                return n
            if self.lanes.holds_back(t, free - n, self.running):
                return n
            reserved += need
        return max(free, 0)

    def _fits(self, others_run: bool, reserved: int, need: int) -> bool:
        """Whether a turn needing `need` KV cells is admitted beside `reserved` ones. The
        first to run always is (a prompt longer than the budget still gets its turn, alone)."""
        return not others_run or reserved + need <= self.budget.total

    def schedule(self) -> Step:
        """Plan one decode step over the running turns (call admit() first)."""
        step = Step()
        behind: list[Turn] = []  # background turns generating: they get what people leave
        for s in self.running:
            if s.state is State.DECODE:
                (behind if s.background else step.decode).append(s)
        shared_end = self._shared_ends()
        # People's prompts first, then background work's; within a lane short prompts first
        # keeps time-to-first-token low for short questions, and a long paste still advances
        # whenever budget is left. Background prompts get what people's leave: holding them
        # back whenever a person's prompt was being read (the first design) starved them in
        # an office over capacity, where someone always is, and the slots and KV they held
        # were lost to people too (20 users, 60 s: 8 people's turns timed out).
        prefilling = sorted((s for s in self.running if s.state is State.PREFILL and s.leader is None),
                            key=lambda s: (s.background, s.prefill_left, s.arrival))
        # One row is kept for background work that is generating: it moves every step.
        budget = self.chunking.budget(len(step.decode) + bool(behind), prefilling)
        spare = -1  # background rows this step may still take (-1: no person's work in it)
        for s in prefilling:
            if s.background and spare < 0:
                spare = self.lanes.background_rows(step)
                rows = behind[:spare]  # the longest-running first: they end and free slots
                step.decode += rows
                spare, budget = spare - len(rows), budget - max(0, len(rows) - 1)  # one row was kept
                behind = []
            if budget <= 0 or (s.background and spare == 0):
                break
            n = min(s.prefill_left, budget, self.chunking.first(s), spare if s.background else budget)
            end = shared_end.get(id(s), 0)
            if end > s.n_cached:
                n = min(n, end - s.n_cached)
            step.prefill.append((s, n))
            budget -= n
            spare -= n if s.background else 0
        if behind:
            step.decode += behind[:self.lanes.background_rows(step)]
        return step

    def _shared_ends(self) -> dict[int, int]:
        """A follower waits while its leader computes the prompt prefix they share; the
        leader stops at the end of that prefix, so next step everyone goes on together.
        id(leader) -> where the longest of its followers' shares ends."""
        shared_end: dict[int, int] = {}
        for s in self.running:
            if s.leader is not None:
                key = id(s.leader)
                shared_end[key] = max(shared_end.get(key, 0), s.lead_n)
        return shared_end

    def find(self, rid: int) -> Turn | None:
        """The waiting or running turn with this request id; None once it has ended."""
        return next((t for t in (*self.running, *self.waiting) if t.rid == rid), None)

    def release(self, turn: Turn) -> None:
        """Finish a running sequence and give its slot back (idempotent)."""
        if turn.state is State.FINISHED:
            return  # NOTE: a cancel racing a normal finish must not free the slot twice
        was_running = turn.state is not State.WAITING
        turn.state = State.FINISHED
        if was_running:
            self.running.remove(turn)
            self.budget.hold(turn, 0)
            self.fairness.ended(turn, self.running)
