"""How many llama.cpp threads a decode step uses: the cores other processes leave free.

llama.cpp's threads wait for each other hundreds of times per step. Spinning while they wait
(libgomp's default, ~300k rounds) is what a quiet machine wants: one stream decodes 1.2-1.3x
faster than with 600 rounds, eight 1.1-1.2x. But when another process keeps one of those
cores busy, the thread that shares it runs in time slices and its partner spins through each
of them: one stream fell to a third of its quiet speed (docs/benchmarks/threads.md, "llama.cpp's
threads"). Giving that core up does better than any waiting policy: one thread has no
barriers at all, and on the free core it decoded a lone stream 1.5x faster than two threads
sleeping after 600 rounds beside the busy process.

So the engine thread measures, every half second while it decodes, how much of its cores
the rest of the machine used (the cores' busy time, stolen time included, less this
process's own CPU time: cpu.cpu_seconds), and runs one thread fewer per core that others keep busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# A core counts as taken once others use more than TAKE of it over a sample, and is given
# back once they use less than FREE: with two cores, a busy process shows as ~0.5 of a core
# while our two spinning threads share its core, and as ~1.0 once we leave it that core.
# Background daemons use a few hundredths.
TAKE = 0.3
FREE = 0.15
INTERVAL_S = 0.5

Reading = tuple[float, float, float]  # (wall s, busy s of our cores by all processes, this process's CPU s)


@dataclass(slots=True)
class CoreShare:
    """The thread count for the next steps, from how busy others keep our cores."""

    n_cpus: int  # the cores the engine is pinned to
    max_threads: int  # the configured count: never more
    read: Callable[[], tuple[float, float]]  # cpu.cpu_seconds for our cores
    clock: Callable[[], float]
    taken: int = field(init=False, default=0)  # cores given up to others
    others: float = field(init=False, default=0.0)  # cores others used over the last sample
    _last: Reading | None = field(init=False, default=None)

    @property
    def threads(self) -> int:
        return max(1, min(self.max_threads, self.n_cpus - self.taken))

    def update(self) -> int:
        """Call before a step; returns the thread count it should run with."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < INTERVAL_S:
            return self.threads
        busy, own = self.read()
        last, self._last = self._last, (now, busy, own)
        if last is None or now - last[0] > 4 * INTERVAL_S or busy <= 0.0:
            return self.threads  # the first sample, or one that spans an idle spell
        # Our own threads may run on cores outside the pinned set (the event loop is not
        # pinned), so this can undercount others: it errs towards keeping threads.
        self.others = max(0.0, ((busy - last[1]) - (own - last[2])) / (now - last[0]))
        self.taken = self.decide(self.others)
        return self.threads

    def decide(self, others: float) -> int:
        """Cores to leave to others: a core more once they use more than TAKE beyond the ones
        already left, a core fewer once they use less than FREE of the last one."""
        k = self.taken
        while k < self.n_cpus - 1 and others > k + TAKE:
            k += 1
        while k > 0 and others < k - 1 + FREE:
            k -= 1
        return k
