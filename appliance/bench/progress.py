"""The progress line on stderr while a level runs."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from appliance.bench.results import RequestResult


class Progress:
    """One line on stderr: which server and level, a bar, answers so far; redrawn at most
    10 times a second, wiped when the level ends. Silent when off (not a TTY, or --quiet)."""

    WIDTH = 24  # characters of bar

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.title, self.total, self.timed = "", 1.0, False
        self.t0 = self.drawn = 0.0
        self.num_done = self.num_ok = 0

    def begin(self, title: str, total: float, timed: bool = False) -> None:
        """total: requests expected, or seconds when timed (a soak)."""
        self.title, self.total, self.timed = title, max(total, 1e-9), timed
        self.t0, self.drawn, self.num_done, self.num_ok = time.perf_counter(), 0.0, 0, 0
        self._draw(force=True)

    def update(self, results: list[RequestResult]) -> None:
        self.num_done, self.num_ok = len(results), sum(1 for r in results if r.ok)
        self._draw(force=not self.timed and self.num_done >= self.total)

    def end(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        frac = min(1.0, (elapsed if self.timed else self.num_done) / self.total)
        bar = "#" * round(frac * self.WIDTH)
        count = f"{elapsed:.0f}/{self.total:.0f} s" if self.timed else f"{self.num_done}/{self.total:.0f}"
        failed = self.num_done - self.num_ok
        return (f"{self.title}  [{bar.ljust(self.WIDTH, '.')}] {count}  ok {self.num_ok}"
                + (f"  not ok {failed}" if failed else "") + f"  {elapsed:.1f} s")

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
