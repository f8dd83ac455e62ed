"""The admission window: when the engine is idle, the first arrival opens a short window
so requests that arrive together are prefilled together (one step over all their prompts,
not one after another). Background work alone is held longer, since a person's turn may
be right behind it (Limits.background_hold_s)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from appliance.engine.plan import Limits
from appliance.engine.turn import Turn


class Window:
    def __init__(self, limits: Limits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.clock = clock

    def closes(self, waiting: Collection[Turn], running: bool) -> float | None:
        """When idle (nothing `running`) with a young queue, the time the window closes;
        None when admission may go ahead."""
        if running or not waiting:
            return None
        limits = self.limits
        if all(t.background for t in waiting):  # a person may be right behind (background_hold_s)
            hold = min(limits.background_hold_s, limits.queue_timeout_s / 4)
            closes = min(t.arrival for t in waiting) + hold
            return closes if self.clock() < closes else None
        want = min(limits.min_batch or limits.slots, limits.slots)
        closes = min(t.arrival for t in waiting) + limits.max_wait_s
        if len(waiting) < want and self.clock() < closes:
            return closes
        return None
