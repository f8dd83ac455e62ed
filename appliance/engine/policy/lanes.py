"""The two lanes (turn.Lane): people's turns are ordered before every background turn;
background turns never take the last `Limits.kept_for_people` free slots, hold at most
`Limits.background_cap` slots, and add at most a tenth of people's rows to a step. So a
front-end's title and tag requests, sent a few milliseconds before the chat turn they
describe, no longer hold that turn's first token behind their prefill (1.39 s instead of
0.18 s with Open WebUI, issue 37)."""

from __future__ import annotations

from collections.abc import Iterable

from appliance.engine.plan import Limits, Step
from appliance.engine.turn import Turn

BACKGROUND_SHARE = 10  # beside people's work, background work adds at most 1/10 of its rows to a step
# Alone, background work reads 16 rows a step: a person who arrives waits for the step in
# progress. On the 2-core VM llama-bench reads 45.5 tok/s at 16 rows and 48.4 at 64 (2
# threads): 6 % slower for background work, and a step of 0.35 s, not 1.3 s (0.7 s, not 2.6 s,
# at one thread, as with Open WebUI beside it, where a 64-row title step held a chat 2.5 s).
BACKGROUND_ALONE_ROWS = 16


class Lanes:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def holds_back(self, turn: Turn, free: int, running: Iterable[Turn]) -> bool:
        """Whether `turn` waits although one of the `free` slots could take it: a background
        turn leaves the last slots to people, and runs beside few of its lane."""
        return turn.background and (free <= self.limits.kept_for_people
                                    or sum(t.background for t in running) >= self.limits.background_cap)

    def background_rows(self, step: Step) -> int:
        """Rows background work may add to a step that carries people's: a tenth of theirs,
        at least one (so it never starves). A step's time grows with its rows: when background
        prompts filled what people's decode left (490 of 512 rows), people's streams and first
        tokens slowed 4x in an office with Open WebUI's titles and tags (12.9 -> 3.4 tok/s)."""
        people = step.n_tokens
        if not people:  # alone: short steps (BACKGROUND_ALONE_ROWS)
            return min(self.limits.prefill_chunk or self.limits.batch_tokens, BACKGROUND_ALONE_ROWS)
        return min(max(1, people // BACKGROUND_SHARE), self.limits.batch_tokens - people)
