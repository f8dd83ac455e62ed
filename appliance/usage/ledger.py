"""Usage as requests end: each identity's counts per local day, held in memory (what the
admin page and the quotas read) and written to the SQLite store once a second by a writer
thread, in one small transaction, so neither the event loop nor the engine thread waits on
the disk. A store that cannot be opened or written is one log line: counting goes on in
memory and nothing already counted is lost until the process ends.
"""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from appliance.usage.store import Row, Tally, UsageStore

log = logging.getLogger(__name__)
MAX_IDENTITIES = 1000  # per day (an office has far fewer): beyond it, new identities are counted together
OTHERS = "(others)"


def local_day(t: float) -> str:
    """The local calendar day of Unix time `t`, as YYYY-MM-DD."""
    return time.strftime("%Y-%m-%d", time.localtime(t))


def next_midnight(t: float) -> float:
    """The Unix time of the local midnight after `t` (when a daily quota resets)."""
    tomorrow = dt.datetime.fromtimestamp(t).date() + dt.timedelta(days=1)
    return dt.datetime.combine(tomorrow, dt.time()).timestamp()


def days_before(day: str, n: int) -> str:
    return (dt.date.fromisoformat(day) - dt.timedelta(days=n)).isoformat()


class Ledger:
    """Daily counts per identity. `state_dir` "" = in memory only (tests, benches)."""

    def __init__(self, state_dir: str | Path = "", retention_days: int = 90, *,
                 clock: Callable[[], float] = time.time, flush_s: float = 1.0) -> None:
        self.retention_days = max(1, retention_days)
        self._clock = clock
        self._flush_s = flush_s
        self._lock = threading.Lock()
        self._days: dict[str, dict[str, Tally]] = {}
        self._pending: dict[tuple[str, str], Tally] = {}
        self._today = local_day(clock())
        self._store: UsageStore | None = self._open(Path(state_dir)) if state_dir else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def persistent(self) -> bool:
        return self._store is not None

    def _open(self, state_dir: Path) -> UsageStore | None:
        try:
            store = UsageStore(state_dir)
            store.prune(self._cutoff(self._today))
            rows = store.rows()
        except (sqlite3.Error, OSError) as e:
            log.error("usage database in %s cannot be used (%s): counting in memory only", state_dir, e)
            return None
        for day, who, tally in rows:
            self._days.setdefault(day, {})[who] = tally
        return store

    def _cutoff(self, today: str) -> str:
        return days_before(today, self.retention_days)

    # -- the writer thread -------------------------------------------------------------------
    def start(self) -> None:
        if self._store is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the writer, write what is pending, close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()
        if self._store is not None:
            self._store.close()
            self._store = None

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()

    def flush(self) -> None:
        """Write the counts added since the last flush, in one transaction."""
        with self._lock:
            pending, self._pending = self._pending, {}
            store, cutoff = self._store, self._cutoff(self._today)
        if store is None or not pending:
            return
        try:
            store.add((day, who, t) for (day, who), t in pending.items())
            store.prune(cutoff)
        except (sqlite3.Error, OSError) as e:
            log.error("usage database %s cannot be written (%s): counting in memory only", store.path, e)
            with self._lock:
                self._store = None
                self._pending.clear()
            store.close()

    # -- counting ----------------------------------------------------------------------------
    def record(self, who: str, tally: Tally) -> None:
        """Add `tally` to `who`'s counts for today."""
        day = local_day(self._clock())
        with self._lock:
            if day != self._today:
                self._today = day
                cutoff = self._cutoff(day)
                for old in [d for d in self._days if d < cutoff]:
                    del self._days[old]
            today = self._days.setdefault(day, {})
            if who not in today and len(today) >= MAX_IDENTITIES:
                who = OTHERS
            today.setdefault(who, Tally()).add(tally)
            if self._store is not None:
                self._pending.setdefault((day, who), Tally()).add(tally)

    def today(self, who: str) -> Tally:
        with self._lock:
            return self._days.get(local_day(self._clock()), {}).get(who, Tally()).copy()

    def rows(self, days: int | None = None) -> list[Row]:
        """The daily table, oldest day first: the last `days` days including today (None = all kept)."""
        today = local_day(self._clock())
        since = days_before(today, days - 1) if days else ""
        with self._lock:
            return [(day, who, t.copy()) for day in sorted(self._days) if day >= since
                    for who, t in sorted(self._days[day].items())]

    def totals(self, days: int) -> dict[str, Tally]:
        """Each identity's counts summed over the last `days` days including today."""
        out: dict[str, Tally] = {}
        for _, who, t in self.rows(days):
            out.setdefault(who, Tally()).add(t)
        return out
