"""Usage as requests end: each identity's counts per local day, held in memory (what the
admin page and the quotas read) and written to the SQLite store once a second by a writer
thread, in one small transaction, so neither the event loop nor the engine thread waits on
the disk. A store that cannot be opened or written (an SD card gone read-only, a full disk,
a corrupt file) is one log line: counting goes on in memory, what was not written is kept,
and the writer tries the file again every `RETRY_S` until it takes the counts, so a short
disk error loses nothing (one more line says when it is back). `trouble` says what is
wrong meanwhile, for /health and the admin page.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from appliance.store.errors import StoreError
from appliance.usage.shared import SharedUsageStore
from appliance.usage.store import Row, Tally, UsageStore, UsageTable
from appliance.workers import Worker

log = logging.getLogger(__name__)
RETRY_S = 60.0  # a failing file is tried again this often (each try opens it anew)
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
                 clock: Callable[[], float] = time.time, flush_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic, retry_s: float = RETRY_S,
                 shared: Callable[[], SharedUsageStore] | None = None) -> None:
        self.retention_days = max(1, retention_days)
        self._clock = clock
        self._monotonic = monotonic
        self._flush_s = flush_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._days: dict[str, dict[str, Tally]] = {}
        self._pending: dict[tuple[str, str], Tally] = {}
        self._forget: set[str] = set()  # identities whose rows the next flush removes from the file
        self._today = local_day(clock())
        self._dir = Path(state_dir) if state_dir else None
        # Several boxes' one table (PostgreSQL): today's counts are read back after each write,
        # so a quota counts what a person used on every box, a second behind at most.
        self._shared = shared
        if shared is not None and self._dir is None:
            self._dir = Path("(shared)")
        self._loaded = False  # the file's earlier days are in _days
        self._failed_at: float | None = None  # monotonic time of the last failure, while failing
        self.trouble = ""  # what is wrong with the file now, "" while it is fine
        self._store: UsageTable | None = self._connect() if self._dir is not None else None
        self._writer: Worker[None] | None = None

    @property
    def writable(self) -> bool | None:
        """Whether the file takes the counts now (None: no state directory, memory only)."""
        return None if self._dir is None else not self.trouble

    @property
    def persistent(self) -> bool:
        """The file is open and taking the counts right now."""
        return self._store is not None

    def _connect(self) -> UsageTable | None:
        """Open the file (the first time, with its earlier days); None, logged once a failure, if it cannot be used."""
        assert self._dir is not None
        try:
            store = self._shared() if self._shared is not None else UsageStore(self._dir)
            try:
                store.prune(self._cutoff(self._today))
                rows = None if self._loaded else store.rows()
            except BaseException:
                store.close()
                raise
        except StoreError as e:
            self._failed(f"state directory not usable: usage database in {self._dir} cannot be used ({e})")
            return None
        if rows is not None:
            with self._lock:
                for day, who, tally in rows:
                    self._days.setdefault(day, {}).setdefault(who, Tally()).add(tally)
            self._loaded = True
        return store

    def _failed(self, what: str) -> None:
        if self._failed_at is None:  # once per outage in the journal
            log.error("%s: counting in memory, trying again every %g s", what, self._retry_s)
        self._failed_at = self._monotonic()
        self.trouble = what

    def _cutoff(self, today: str) -> str:
        return days_before(today, self.retention_days)

    # -- the writer thread -------------------------------------------------------------------
    def start(self) -> None:
        if self._dir is not None and self._writer is None:
            self._writer = _Writer(self)
            self._writer.start()

    def workers(self) -> list[Worker[None]]:
        """The writer while it runs (none without a state directory), for /admin/status."""
        return [self._writer] if self._writer is not None else []

    def close(self) -> None:
        """Stop the writer, write what is pending (one last try), close the file."""
        if self._writer is not None:
            self._writer.stop(timeout=10)
            self._writer = None
        self._failed_at = None if self._failed_at is None else float("-inf")  # retry now, still logged once
        self.flush()
        if self._store is not None:
            self._store.close()
            self._store = None

    def flush(self) -> None:
        """Write the counts added since the last flush, in one transaction; while the file
        fails, keep them and try again once `retry_s` has passed since the last failure."""
        if self._dir is None:
            return
        if self._store is None:
            if self._failed_at is not None and self._monotonic() - self._failed_at < self._retry_s:
                return
            self._store = self._connect()
            if self._store is None:
                return
        with self._lock:
            pending, self._pending = self._pending, {}
            forget, self._forget = self._forget, set()
            cutoff = self._cutoff(self._today)
        store = self._store
        try:
            if pending:
                store.add((day, who, t) for (day, who), t in pending.items())
            for who in forget:  # after the add, on this one thread: no row of theirs comes back
                store.forget(who)
            store.prune(cutoff)
            if self._shared is not None:
                self._read_back(store)
        except StoreError as e:
            with self._lock:  # the transaction was rolled back: these counts are still to write
                for key, t in pending.items():
                    self._pending.setdefault(key, Tally()).add(t)
                self._forget |= forget
            self._store = None
            store.close()  # a fresh connection next time: nothing of a failed transaction stays
            self._failed(f"state directory not writable: usage database {store.path} cannot be written ({e})")
            return
        if self._failed_at is not None:
            log.warning("usage database %s writable again: the counts held in memory are written", store.path)
            self._failed_at, self.trouble = None, ""

    def _read_back(self, store: UsageTable) -> None:
        """Today's counts as every box wrote them, plus this box's not yet written."""
        today = local_day(self._clock())
        rows = store.rows(since=today)
        with self._lock:
            fresh: dict[str, Tally] = {}
            for day, who, t in rows:
                if day == today:
                    fresh.setdefault(who, Tally()).add(t)
            for (day, who), t in self._pending.items():
                if day == today:
                    fresh.setdefault(who, Tally()).add(t)
            self._days[today] = fresh

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
            if self._dir is not None:
                self._pending.setdefault((day, who), Tally()).add(tally)

    def forget(self, who: str) -> None:
        """Remove every count of `who` (a person removed with everything of theirs): from memory
        now, from the file at the next flush (the writer's, so a flush under way cannot add them back)."""
        with self._lock:
            for counts in self._days.values():
                counts.pop(who, None)
            for key in [k for k in self._pending if k[1] == who]:
                del self._pending[key]
            if self._dir is not None:
                self._forget.add(who)

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


class _Writer(Worker[None]):
    """The ledger's writer: a flush every `flush_s`, nothing queued."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__("usage-writer", every=ledger._flush_s)
        self.ledger = ledger

    def tick(self) -> bool:
        self.ledger.flush()
        return True
