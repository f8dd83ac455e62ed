"""How much RAM parked sessions may hold, following free memory and pressure (MemoryFit),
and when an idle conversation is worth parking (IDLE_PARK_AFTER_S). Parked sessions are
the one use of memory the engine can give back: the KV cache and the weights are fixed
at start-up."""

from __future__ import annotations

import logging
import time

from appliance.cpu import Memory, trim_heap
from appliance.engine.kv.cache import SessionCache
from appliance.engine.kv.policy import CachePolicy

log = logging.getLogger(__name__)

# A conversation idle for less than this is more likely a user reading the answer and
# typing the next turn than one that is over: parking it now would cost a park and a
# restore (~20 ms of the engine thread each, a pause for every stream) to save a few
# seconds of idle cells (~1% of a step per 500 cells). Past it, parking pays.
IDLE_PARK_AFTER_S = 5.0

# Parked sessions leave a reserve free for the rest of the machine: a tenth of the memory,
# at least 64 MiB (a 1 GiB board keeps ~100 MiB, which its kernel, sshd and journald need;
# 8 GiB keeps ~800 MiB for the page cache).
PARK_RESERVE_MIN = 64 << 20
# PSI "some avg10" (% of the last 10 s in which a task waited for memory) at which the
# kernel is already reclaiming hard: parked sessions are halved, at most every
# PRESSURE_HOLD_S since avg10 trails the relief by about that long.
PRESSURE_PCT = 10.0
PRESSURE_HOLD_S = 10.0


def park_budget(ceiling: int, parked: int, mem: Memory, pressed: bool) -> int:
    """What parked sessions may hold now: at most `ceiling`; growing by at most half of
    what is free beyond the reserve, shrinking by the shortfall when less than the reserve
    is free; halved when `pressed` (memory pressure)."""
    reserve = max(PARK_RESERVE_MIN, mem.total // 10)
    spare = mem.available - reserve
    budget = parked + (spare // 2 if spare > 0 else spare)
    if pressed:
        budget = min(budget, parked // 2)
    return max(0, min(ceiling, budget))


class MemoryFit:
    """The parking budget, following free memory and pressure (`fit`, once a second)."""

    def __init__(self, policy: CachePolicy, cache: SessionCache) -> None:
        self.policy = policy
        self.cache = cache
        self._next_pressure_cut = 0.0

    def fit(self) -> None:
        probe = self.policy.memory
        if probe is None or not self.policy.park_bytes:
            return
        mem = probe()
        now = time.monotonic()
        pressed = mem.pressure >= PRESSURE_PCT and now >= self._next_pressure_cut
        if pressed:
            self._next_pressure_cut = now + PRESSURE_HOLD_S
        parked = self.cache.parked_bytes
        dropped = self.cache.set_park_budget(park_budget(self.policy.park_bytes, parked, mem, pressed))
        if dropped:
            trim_heap()
            log.warning("memory short (%d MiB free of %d, pressure %.0f%%): dropped %d parked sessions, "
                        "parking budget now %d MiB", mem.available >> 20, mem.total >> 20, mem.pressure,
                        dropped, self.cache.park_budget >> 20)
