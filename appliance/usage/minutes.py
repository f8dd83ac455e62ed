"""The last day per minute, in memory: requests ended, tokens generated, time to first token,
refusals and errors, and who was active. A bounded ring (one entry per minute that saw
anything), filled as requests end; the admin page's charts read it as series.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DAY_MIN = 24 * 60
TTFT_SAMPLES = 512  # per minute: enough for a percentile, bounded whatever the load
ACTIVE_WHO = 1024  # identities remembered per minute


@dataclass(slots=True)
class Minute:
    start: int  # Unix minute (s // 60)
    requests: int = 0
    generated: int = 0
    refusals: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)  # s
    who: set[str] = field(default_factory=set)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


class Minutes:
    def __init__(self, clock: Callable[[], float] = time.time, size: int = DAY_MIN) -> None:
        self._clock = clock
        self._ring: deque[Minute] = deque(maxlen=size)
        self._lock = threading.Lock()

    def _now(self, who: str) -> Minute:
        m = int(self._clock() // 60)
        if not self._ring or self._ring[-1].start != m:
            self._ring.append(Minute(m))
        minute = self._ring[-1]
        if len(minute.who) < ACTIVE_WHO:
            minute.who.add(who)
        return minute

    def ended(self, who: str, generated: int, ttft_s: float | None) -> None:
        with self._lock:
            minute = self._now(who)
            minute.requests += 1
            minute.generated += generated
            if ttft_s is not None and len(minute.ttft) < TTFT_SAMPLES:
                minute.ttft.append(ttft_s)

    def refused(self, who: str) -> None:
        with self._lock:
            self._now(who).refusals += 1

    def failed(self, who: str) -> None:
        with self._lock:
            self._now(who).errors += 1

    def active(self, within_min: int = 5) -> int:
        """Identities that asked for something in the last `within_min` minutes."""
        since = int(self._clock() // 60) - within_min + 1
        with self._lock:
            return len(set().union(*(m.who for m in self._ring if m.start >= since)))

    def series(self, minutes: int, step: int = 1) -> dict[str, list[Any]]:
        """The last `minutes` minutes in buckets of `step` minutes, oldest first, as columns:
        t (bucket start, Unix s), requests, tokens_per_s (the last bucket's over its seconds so far),
        ttft_p50 / ttft_p95 (s, None
        without samples), refusals, errors. Minutes that saw nothing are zeros."""
        now = self._clock()
        end = int(now // 60) + 1
        first = end - minutes
        with self._lock:
            seen = {m.start: m for m in self._ring if m.start >= first}
        cols: dict[str, list[Any]] = {k: [] for k in ("t", "requests", "tokens_per_s", "ttft_p50", "ttft_p95",
                                                       "refusals", "errors")}
        for start in range(first, end, step):
            bucket = [seen[m] for m in range(start, min(end, start + step)) if m in seen]
            ttft = sorted(x for m in bucket for x in m.ttft)
            cols["t"].append(start * 60)
            cols["requests"].append(sum(m.requests for m in bucket))
            # The last bucket is still filling: its rate is over the seconds it has had.
            seconds = min(60.0 * step, max(1.0, now - start * 60))
            cols["tokens_per_s"].append(round(sum(m.generated for m in bucket) / seconds, 2))
            cols["ttft_p50"].append(percentile(ttft, 0.5))
            cols["ttft_p95"].append(percentile(ttft, 0.95))
            cols["refusals"].append(sum(m.refusals for m in bucket))
            cols["errors"].append(sum(m.errors for m in bucket))
        return cols


class TokenRate:
    """Tokens/s now, from the engine's generated-token count sampled at each status poll:
    the count's growth over the last RATE_WINDOW_S or so (any number of pollers)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque(maxlen=256)
        self._lock = threading.Lock()

    def sample(self, now: float, count: int) -> float:
        with self._lock:
            self._samples.append((now, count))
            while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
                self._samples.popleft()
            t0, c0 = self._samples[0]
        return round((count - c0) / (now - t0), 2) if now - t0 > 0.5 else 0.0
