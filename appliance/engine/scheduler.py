"""Which sequences run in the next decode step (pure policy: no llama.cpp, injected clock).

Each step carries one token for every generating sequence first, then fills the rest of
the token budget with prompt chunks, shortest remaining prompt first. When the engine is
idle, the first arrival opens a short admission window so requests that arrive together
are prefilled together. Waiting requests are admitted round-robin across client
identities (fair shares), each client's own in priority order.

Two lanes (turn.Lane): people's turns are ordered before every background turn, background
turns never take the last `people_slots` free slots, hold at most an eighth of the slots,
and add at most a tenth of people's rows to a step. So a front-end's title and tag requests, sent a few
milliseconds before the chat turn they describe, no longer hold that turn's first token
behind their prefill (1.39 s instead of 0.18 s with Open WebUI, issue 37).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.engine.kv.budget import KVBudget
from appliance.engine.turn import Lane, State, Turn
from appliance.errors import Unavailable

BACKGROUND_SHARE = 10  # beside people's work, background work adds at most 1/10 of its rows to a step
# Alone, background work reads 16 rows a step: a person who arrives waits for the step in
# progress. On the 2-core VM llama-bench reads 45.5 tok/s at 16 rows and 48.4 at 64 (2
# threads): 6 % slower for background work, and a step of 0.35 s, not 1.3 s (0.7 s, not 2.6 s,
# at one thread, as with Open WebUI beside it, where a 64-row title step held a chat 2.5 s).
BACKGROUND_ALONE_ROWS = 16


@dataclass(frozen=True, slots=True)
class Limits:
    slots: int  # sequences in the running batch
    batch_tokens: int  # tokens per llama_decode call
    kv_tokens: int  # KV cells shared by all running sequences
    ctx_limit: int  # tokens (prompt + output) one sequence may hold
    prefill_chunk: int = 0  # prompt tokens per step while others stream (0 = batch_tokens)
    prefill_steps: int = 0  # beside streams, a long prompt is read in about this many steps (0 = chunks)
    prefill_group: int = 0  # finish the shortest prompts that fit in this many tokens first (0 = off)
    max_wait_s: float = 0.03  # admission window when idle
    min_batch: int = 0  # close the window once this many wait (0 = slots)
    max_queue: int = 64
    queue_timeout_s: float = 120.0
    ageing_s: float = 2.0  # a new conversation waiting this long ranks with continuing ones
    people_slots: int = -1  # free slots background work leaves to people (-1: a quarter, at least 1)
    tools_tokens: int = 0  # tool definitions a turn may hold beyond ctx_limit (Turn.allowance)
    # An idle engine holds background requests this long before starting them alone: Open
    # WebUI sends one ~0.25 s before the chat turn it goes with, which then waited for its
    # first step (0.78 s for a slot with one llama.cpp thread; the 5 s new-chat check missed).
    background_hold_s: float = 0.5

    @property
    def background_cap(self) -> int:
        """Background turns running at once: an eighth of the slots, at least one. Background
        work beside people moves a tenth of a step's rows, so it holds its slots long: left to
        take every slot but `kept_for_people`, it held 18 of 24 and people's next turns waited
        15 s for a slot (121 s TTFT p50, office of 20 with Open WebUI's titles and tags)."""
        return max(1, self.slots // 8)

    @property
    def kept_for_people(self) -> int:
        if self.people_slots >= 0:
            return min(self.people_slots, self.slots - 1)
        return min(max(1, self.slots // 4), self.slots - 1)  # one slot: background runs, in its turn


@dataclass(slots=True)
class Step:
    decode: list[Turn] = field(default_factory=list)  # one token each
    prefill: list[tuple[Turn, int]] = field(default_factory=list)  # (turn, n prompt tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill)

    @property
    def n_seqs(self) -> int:
        return len(self.decode) + len(self.prefill)


class Scheduler:
    def __init__(self, limits: Limits, clock: Callable[[], float], budget: KVBudget | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.budget = budget or KVBudget(limits.kv_tokens)  # reserved here, pinned by the KV side
        self.waiting: deque[Turn] = deque()
        self.running: list[Turn] = []
        self._admissions = 0  # turns admitted so far
        self._last_admitted: dict[str, tuple[float, int]] = {}  # client -> its latest admission (time, number)
        # (client, lane) -> when its last running turn in that lane ended
        self._idle_since: dict[tuple[str, Lane], float] = {}
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
        """When idle with a young queue, the time the admission window closes."""
        if self.running or not self.waiting:
            return None
        if all(t.background for t in self.waiting):  # a person may be right behind (background_hold_s)
            closes = min(t.arrival for t in self.waiting) + min(self.limits.background_hold_s, self.limits.queue_timeout_s / 4)
            return closes if self.clock() < closes else None
        want = min(self.limits.min_batch or self.limits.slots, self.limits.slots)
        closes = min(t.arrival for t in self.waiting) + self.limits.max_wait_s
        if len(self.waiting) < want and self.clock() < closes:
            return closes
        return None

    def priority(self, turn: Turn, now: float) -> tuple[int, float]:
        """Continuing conversations first (their KV is cached: cheap, and a user is mid-chat),
        otherwise FIFO. Ageing: once a new request has waited ageing_s it ranks with the
        continuing ones, so it is overtaken only by those that arrived within ageing_s after it."""
        urgent = turn.continuing or now - turn.arrival >= self.limits.ageing_s
        return (0 if urgent else 1, turn.arrival)

    def order(self, now: float) -> list[Turn]:
        """The waiting turns in admission order: people's, then background work's, each
        lane fair within itself (`_fair`)."""
        people = [t for t in self.waiting if not t.background]
        if len(people) == len(self.waiting):
            return self._fair(people, now)
        return self._fair(people, now) + self._fair([t for t in self.waiting if t.background], now)

    def _fair(self, waiting: list[Turn], now: float) -> list[Turn]:
        """`waiting` in admission order. Fair shares: clients take turns
        (round-robin, ranked by `_client_rank`), so one client's
        backlog delays another client's first request by at most one admission per other
        client with requests waiting. Within one client, priority order (continuing
        conversations first, with ageing)."""
        ranked = sorted(waiting, key=lambda q: self.priority(q, now))
        queues: dict[str, list[Turn]] = {}
        for t in ranked:
            queues.setdefault(t.client, []).append(t)
        if len(queues) < 2:
            return ranked
        # Busy in this lane only: a person whose front-end's title request still runs asked
        # while nothing of theirs did (ranked among the backlogs, people's next turns waited
        # 121 s at p50 in an office of 20 with Open WebUI's titles and tags).
        lane = waiting[0].lane
        busy = {t.client for t in self.running if t.lane is lane}
        active = sorted(queues, key=lambda c: self._client_rank(queues[c][0], c, c in busy, now))
        out: list[Turn] = []
        i = 0
        while active:  # round i takes each remaining client's i-th turn: O(waiting)
            more = []
            for c in active:
                q = queues[c]
                out.append(q[i])
                if i + 1 < len(q):
                    more.append(c)
            active = more
            i += 1
        return out

    def _client_rank(self, head: Turn, client: str, busy: bool, now: float) -> tuple[int, int, float]:
        """Where a client's round-robin turn comes. A client that asked while it was waiting
        on nothing is fresh: nothing of it runs, and its most urgent turn arrived after its
        last turn ended (or it was never served). Fresh ones go first, in priority order, so
        one person per PC (an office) is served in arrival order. The others have a backlog
        (turns sent while one of theirs was served) and go after them, the one admitted
        least recently first. Ranking by the admission alone made clients forgotten between
        turns overtake those remembered: at twice the capacity one user waited 57 s while
        others waited 1. Ranking by arrival alone let a backlog sent in a burst go ahead of
        a newcomer, whose request came later."""
        last = self._last_admitted.get(client)
        if last is None or (not busy and head.arrival > self._idle_since.get((client, head.lane), last[0])):
            return (-1, *self.priority(head, now))
        return last[1], 0, 0.0

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
            if turn.background and (self.limits.slots - len(self.running) <= self.limits.kept_for_people
                                    or sum(t.background for t in self.running) >= self.limits.background_cap):
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
            self._last_admitted[turn.client] = (now, self._admissions)
            self._admissions += 1
        if len(self._last_admitted) > len(self.running) + len(self.waiting):
            # Forget clients with nothing running or waiting (keeps the table small); a
            # client with a request running keeps its place in the rotation.
            present = {t.client for t in self.running} | {t.client for t in self.waiting}
            self._last_admitted = {c: n for c, n in self._last_admitted.items() if c in present}
            self._idle_since = {c: n for c, n in self._idle_since.items() if c[0] in present}
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
            if t.background and (free - n <= self.limits.kept_for_people or
                                 sum(r.background for r in self.running) >= self.limits.background_cap):
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
        # A follower waits while its leader computes the prompt prefix they share; the
        # leader stops at the end of that prefix, so next step everyone goes on together.
        shared_end: dict[int, int] = {}
        for s in self.running:
            if s.leader is not None:
                key = id(s.leader)
                shared_end[key] = max(shared_end.get(key, 0), s.lead_n)
        # People's prompts first, then background work's; within a lane short prompts first
        # keeps time-to-first-token low for short questions, and a long paste still advances
        # whenever budget is left. Background prompts get what people's leave: holding them
        # back whenever a person's prompt was being read (the first design) starved them in
        # an office over capacity, where someone always is, and the slots and KV they held
        # were lost to people too (20 users, 60 s: 8 people's turns timed out).
        prefilling = sorted((s for s in self.running if s.state is State.PREFILL and s.leader is None),
                            key=lambda s: (s.background, s.prefill_left, s.arrival))
        # One row is kept for background work that is generating: it moves every step.
        budget = self._prefill_budget(len(step.decode) + bool(behind), prefilling)
        spare = -1  # background rows this step may still take (-1: no person's work in it)
        for s in prefilling:
            if s.background and spare < 0:
                spare = self._background_rows(step)
                rows = behind[:spare]  # the longest-running first: they end and free slots
                step.decode += rows
                spare, budget = spare - len(rows), budget - max(0, len(rows) - 1)  # one row was kept
                behind = []
            if budget <= 0 or (s.background and spare == 0):
                break
            n = min(s.prefill_left, budget, self._first_chunk(s), spare if s.background else budget)
            end = shared_end.get(id(s), 0)
            if end > s.n_cached:
                n = min(n, end - s.n_cached)
            step.prefill.append((s, n))
            budget -= n
            spare -= n if s.background else 0
        if behind:
            step.decode += behind[:self._background_rows(step)]
        return step

    def _background_rows(self, step: Step) -> int:
        """Rows background work may add to a step that carries people's: a tenth of theirs,
        at least one (so it never starves). A step's time grows with its rows: when background
        prompts filled what people's decode left (490 of 512 rows), people's streams and first
        tokens slowed 4x in an office with Open WebUI's titles and tags (12.9 -> 3.4 tok/s)."""
        people = step.n_tokens
        if not people:  # alone: short steps (BACKGROUND_ALONE_ROWS)
            return min(self.limits.prefill_chunk or self.limits.batch_tokens, BACKGROUND_ALONE_ROWS)
        return min(max(1, people // BACKGROUND_SHARE), self.limits.batch_tokens - people)

    def _prefill_budget(self, n_decode: int, prefilling: list[Turn]) -> int:
        """Prompt tokens for this step. First tokens sooner: the shortest waiting prompts
        that fit in `prefill_group` tokens together are finished in this step, so they get
        their first token now instead of after one big step over every prompt (with nobody
        streaming yet) or several small chunks (while others stream). Longer prompts go at
        full speed when nobody streams, and in `prefill_chunk` pieces when someone does, so
        a long paste never freezes the streams."""
        room = self.limits.batch_tokens - n_decode
        group, grouped = 0, 0
        for s in prefilling:
            if group + s.prefill_left > self.limits.prefill_group:
                break
            group, grouped = group + s.prefill_left, grouped + 1
        if n_decode and self.limits.prefill_chunk:
            # The prompts beyond the group get their chunk on top: short first turns arrive
            # all the time in an office, and a paste that only got what they left waited for
            # a lull (5 s for 700 tokens, twice its compute).
            rest = grouped < len(prefilling)
            return min(room, group + self._chunk(prefilling[grouped:]) if rest else max(group, self.limits.prefill_chunk))
        return min(room, group or room)

    def _chunk(self, prefilling: list[Turn]) -> int:
        """Prompt tokens per step while others stream: `prefill_chunk`, or for a long prompt
        1/`prefill_steps` of what it had to compute, at most half a step. A pasted page read
        64 tokens a step waits one short step per chunk beside a dozen streams (~0.1 s each
        on 2 cores): 700 tokens in 11 chunks came 5 s after sending, where the same work in
        four pieces takes ~3.5 s; the streams' gap grows for those four steps only. Half of
        `batch_tokens` (~1 s a step on 2 cores) bounds that gap for a paste of any length."""
        chunk = self.limits.prefill_chunk
        if self.limits.prefill_steps and prefilling:
            longest = max(len(s.prompt) - s.n_reused for s in prefilling)
            chunk = max(chunk, min(self.limits.batch_tokens // 2, -(-longest // self.limits.prefill_steps)))
        return chunk

    def _first_chunk(self, s: Turn) -> int:
        """A long prompt whose stream hears its progress computes one `prefill_chunk` in
        its first step, so the first note comes within a short step's time (64 tokens:
        ~0.3 s on 2 cores, where a full 512-token step takes ~2 s); prompt tokens/s hardly
        depends on the step's size (64-512 tokens), so the extra step costs a few ms."""
        if s.progress and self.limits.prefill_chunk and s.n_cached == s.n_reused \
                and s.long_prompt(self.limits.batch_tokens):
            return self.limits.prefill_chunk
        return s.prefill_left

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
            if all(t.client != turn.client or t.lane is not turn.lane for t in self.running):
                self._idle_since[(turn.client, turn.lane)] = self.clock()
