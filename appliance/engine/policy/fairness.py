"""Fair shares: waiting turns are admitted round-robin across client identities, each
client's own in priority order (continuing conversations first, with ageing). Remembers
when each client was last admitted and when its last running turn in a lane ended; the
scheduler tells it (`admitted`, `ended`, `forget`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from appliance.engine.plan import Limits
from appliance.engine.turn import Lane, Turn


class Fairness:
    def __init__(self, limits: Limits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.clock = clock
        self.admissions = 0  # turns admitted so far
        # client -> its latest admission (time, number)
        self.last_admitted: dict[str, tuple[float, int]] = {}
        # (client, lane) -> when its last running turn in that lane ended
        self.idle_since: dict[tuple[str, Lane], float] = {}

    def priority(self, turn: Turn, now: float) -> tuple[int, float]:
        """Continuing conversations first (their KV is cached: cheap, and a user is mid-chat),
        otherwise FIFO. Ageing: once a new request has waited ageing_s it ranks with the
        continuing ones, so it is overtaken only by those that arrived within ageing_s after it."""
        urgent = turn.continuing or now - turn.arrival >= self.limits.ageing_s
        return (0 if urgent else 1, turn.arrival)

    def order(self, waiting: list[Turn], running: Iterable[Turn], now: float) -> list[Turn]:
        """`waiting` (one lane's) in admission order. Clients take turns (round-robin, ranked
        by `_client_rank`), so one client's backlog delays another client's first request by
        at most one admission per other client with requests waiting. Within one client,
        priority order (continuing conversations first, with ageing)."""
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
        busy = {t.client for t in running if t.lane is lane}
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
        last = self.last_admitted.get(client)
        if last is None:
            return (-1, *self.priority(head, now))
        if not busy and head.arrival > self.idle_since.get((client, head.lane), last[0]):
            return (-1, *self.priority(head, now))
        return last[1], 0, 0.0

    def admitted(self, turn: Turn, now: float) -> None:
        self.last_admitted[turn.client] = (now, self.admissions)
        self.admissions += 1

    def ended(self, turn: Turn, running: Iterable[Turn]) -> None:
        """A running turn ended: its client is idle in its lane when nothing else of it runs there."""
        if all(t.client != turn.client or t.lane is not turn.lane for t in running):
            self.idle_since[(turn.client, turn.lane)] = self.clock()

    def forget(self, running: Collection[Turn], waiting: Collection[Turn]) -> None:
        """Forget clients with nothing running or waiting (keeps the tables small); a
        client with a request running keeps its place in the rotation."""
        if len(self.last_admitted) > len(running) + len(waiting):
            present = {t.client for t in running} | {t.client for t in waiting}
            self.last_admitted = {c: n for c, n in self.last_admitted.items() if c in present}
            self.idle_since = {c: n for c, n in self.idle_since.items() if c[0] in present}
