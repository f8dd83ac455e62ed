"""The engine thread's distributions, kept as plain bucket counts and published in the
snapshot: the HTTP side renders them as Prometheus histograms (http/metrics.py), so the
engine imports nothing of the HTTP side and nothing crosses per observation. The recent
answers' end times and serving times behind the queue notes' wait estimate
(engine/pace.wait_estimate) are kept here too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

# Bucket bounds (s, or sequences), Prometheus's `le`: a value counts in the first bucket
# whose bound is >= it; one more bucket past the last bound (+Inf).
LATENCY = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)
SEQS = (1, 2, 4, 8, 12, 16, 24, 32, 64)
RECENT = 32  # answers remembered for the wait estimate


@dataclass(frozen=True, slots=True)
class HistogramView:
    name: str  # the Prometheus family's name
    doc: str
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket, not cumulative; the last is past the last bound
    total: float  # the sum of the observations


@dataclass(slots=True)
class Histogram:
    name: str
    doc: str
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    _view: HistogramView | None = None  # the last one published, while nothing changed

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self._view = None

    def view(self) -> HistogramView:
        if self._view is None:
            self._view = HistogramView(self.name, self.doc, self.bounds, tuple(self.counts), self.total)
        return self._view


@dataclass(slots=True)
class Figures:
    step_seqs: Histogram = field(default_factory=lambda: Histogram(
        "appliance_step_sequences", "Sequences advanced by one llama_decode call", SEQS))
    step_seconds: Histogram = field(default_factory=lambda: Histogram(
        "appliance_step_seconds", "Wall time of one decode step", ITL))
    ttft: Histogram = field(default_factory=lambda: Histogram(
        "appliance_time_to_first_token_seconds", "Arrival to the first non-empty content", LATENCY))
    itl: Histogram = field(default_factory=lambda: Histogram(
        "appliance_inter_token_seconds", "Gap between consecutive content deltas", ITL))
    queue_wait: Histogram = field(default_factory=lambda: Histogram(
        "appliance_queue_wait_seconds", "Arrival to admission into a slot", LATENCY))
    finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))  # engine clock
    served_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))  # first token to end

    def histograms(self) -> tuple[HistogramView, ...]:
        return tuple(h.view() for h in (self.step_seqs, self.step_seconds, self.ttft, self.itl, self.queue_wait))

    def answered(self, first_token_at: float, now: float) -> None:
        """An answer ended now (it started answering at first_token_at; 0: it never did)."""
        self.finished_at.append(now)
        if first_token_at:
            self.served_s.append(now - first_token_at)
