"""Usage accounting: the SQLite store and the ledger over it (restart, corruption, pruning,
concurrency, file modes), the minute ring and the quota's reset time."""

from __future__ import annotations

import datetime as dt
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from appliance.store.errors import StoreError
from appliance.usage.ledger import Ledger, local_day, next_midnight
from appliance.usage.minutes import Minutes, TokenRate, percentile
from appliance.usage.store import FILE_NAME, Tally, UsageStore

NOON = dt.datetime(2026, 12, 3, 12, 0).timestamp()  # local time
DAY = 86400.0


class Clock:
    def __init__(self, t: float = NOON) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_restart_keeps_todays_counters(tmp_path: Path) -> None:
    clock = Clock()
    ledger = Ledger(tmp_path, clock=clock)
    ledger.record("alice", Tally(requests=1, prompt_tokens=10, cached_tokens=4, generated_tokens=7))
    ledger.record("alice", Tally(refusals=1))
    ledger.record("10.0.0.9", Tally(requests=1, generated_tokens=3))
    ledger.close()
    again = Ledger(tmp_path, clock=clock)
    assert again.persistent
    assert again.today("alice") == Tally(1, 10, 4, 7, 1)
    assert again.today("10.0.0.9") == Tally(requests=1, generated_tokens=3)
    again.record("alice", Tally(requests=1, generated_tokens=1))
    again.close()
    assert Ledger(tmp_path, clock=clock).today("alice").generated_tokens == 8


def test_the_writer_thread_flushes_within_a_second(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, flush_s=0.05)
    ledger.start()
    ledger.record("bob", Tally(requests=1))
    store = UsageStore(tmp_path)
    try:
        for _ in range(100):
            if store.rows():
                break
            threading.Event().wait(0.02)
        assert [(who, t.requests) for _, who, t in store.rows()] == [("bob", 1)]
    finally:
        store.close()
        ledger.close()


def test_a_corrupt_file_is_one_log_line_and_counting_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"this is not a database" * 100)
    os.chmod(tmp_path / FILE_NAME, 0o600)
    os.chmod(tmp_path, 0o700)
    with caplog.at_level(logging.WARNING):
        ledger = Ledger(tmp_path)
    assert not ledger.persistent
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    ledger.record("alice", Tally(requests=1, generated_tokens=5))
    assert ledger.today("alice").generated_tokens == 5
    ledger.close()


def test_an_unwritable_database_is_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(tmp_path)
    ledger.record("alice", Tally(requests=1))
    (tmp_path / FILE_NAME).write_bytes(b"garbage" * 1000)  # broken under the open connection
    with caplog.at_level(logging.WARNING):
        ledger.flush()
        ledger.record("alice", Tally(requests=1))
        ledger.flush()
    assert not ledger.persistent and ledger.today("alice").requests == 2
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    ledger.close()


def test_modes_are_0600_in_0700_and_a_symlink_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    Ledger(state).close()
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state / FILE_NAME).st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    (other / FILE_NAME).symlink_to(target)
    with caplog.at_level(logging.ERROR):
        assert not Ledger(other).persistent
    assert target.read_bytes() == b""  # never written through the link
    linked = tmp_path / "linked"
    linked.symlink_to(state)
    assert not Ledger(linked).persistent


def test_old_days_are_pruned(tmp_path: Path) -> None:
    clock = Clock(NOON - 10 * DAY)
    ledger = Ledger(tmp_path, retention_days=5, clock=clock)
    ledger.record("alice", Tally(requests=1))
    clock.t = NOON - 3 * DAY
    ledger.record("alice", Tally(requests=2))
    ledger.close()
    clock.t = NOON
    again = Ledger(tmp_path, retention_days=5, clock=clock)
    assert [(d, t.requests) for d, _, t in again.rows()] == [(local_day(NOON - 3 * DAY), 2)]
    clock.t = NOON + 3 * DAY  # a day change prunes the memory too
    again.record("bob", Tally(requests=1))
    assert [d for d, _, _ in again.rows()] == [local_day(NOON + 3 * DAY)]
    again.close()
    store = UsageStore(tmp_path)
    assert [d for d, _, _ in store.rows()] == [local_day(NOON + 3 * DAY)]
    store.close()


def test_threads_recording_at_once_sum_exactly(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, flush_s=0.01)
    ledger.start()
    n_threads, each = 8, 500

    def work(i: int) -> None:
        for _ in range(each):
            ledger.record(f"user{i % 3}", Tally(requests=1, generated_tokens=2))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger.close()
    total = sum(t.requests for _, _, t in Ledger(tmp_path).rows())
    assert total == n_threads * each
    assert sum(t.generated_tokens for t in Ledger(tmp_path).totals(7).values()) == 2 * n_threads * each


def test_in_memory_only_without_a_state_dir(tmp_path: Path) -> None:
    ledger = Ledger("")
    ledger.start()
    ledger.record("a", Tally(requests=1))
    assert not ledger.persistent and ledger.totals(7)["a"].requests == 1
    ledger.close()


def test_next_midnight_is_local() -> None:
    reset = dt.datetime.fromtimestamp(next_midnight(NOON))
    assert (reset.date(), reset.hour, reset.minute) == (dt.date(2026, 12, 4), 0, 0)


def test_minutes_series_and_active_clients() -> None:
    clock = Clock(NOON)
    m = Minutes(clock)
    m.ended("a", 120, 0.5)
    m.ended("b", 60, 1.5)
    m.refused("c")
    clock.t += 60
    m.failed("a")
    s = m.series(3)
    assert s["requests"] == [0, 2, 0] and s["tokens_per_s"] == [0, 3.0, 0]
    assert s["ttft_p50"] == [None, 0.5, None] and s["ttft_p95"][1] == 1.5
    assert s["refusals"] == [0, 1, 0] and s["errors"] == [0, 0, 1]
    assert m.active() == 3
    clock.t += 10 * 60
    assert m.active() == 0
    day = m.series(24 * 60, step=10)
    assert len(day["t"]) == 144 and sum(day["requests"]) == 2
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([], 0.5) is None


def test_token_rate() -> None:
    rate = TokenRate(window_s=10)
    assert rate.sample(0.0, 0) == 0.0
    assert rate.sample(5.0, 50) == 10.0
    assert rate.sample(20.0, 250) == pytest.approx(13.33, abs=0.01)


def test_identities_beyond_the_daily_cap_are_counted_together(monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.usage import ledger as ledger_mod

    monkeypatch.setattr(ledger_mod, "MAX_IDENTITIES", 3)
    ledger = Ledger("")
    for i in range(5):
        ledger.record(f"10.0.0.{i}", Tally(requests=1))
    totals = ledger.totals(1)
    assert len(totals) == 4 and totals[ledger_mod.OTHERS].requests == 2


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Failing:
    """Makes every UsageStore write (or open) raise, as a read-only or full disk does, until healed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, what: str = "add") -> None:
        self.on = True
        real = getattr(UsageStore, what)

        def failing(store: object, *args: object) -> object:
            if self.on:
                raise StoreError("attempt to write a readonly database")
            return real(store, *args)
        monkeypatch.setattr(UsageStore, what, failing)


def test_counts_after_a_disk_error_reach_the_file_once_it_takes_writes_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock, ticks = Clock(), Ticks()
    ledger = Ledger(tmp_path, clock=clock, monotonic=ticks, retry_s=60)
    ledger.record("alice", Tally(requests=1))
    ledger.flush()
    disk = Failing(monkeypatch)
    with caplog.at_level(logging.WARNING):
        for _ in range(19):  # 19 answers while the disk refuses writes
            ledger.record("alice", Tally(requests=1, generated_tokens=2))
            ledger.flush()
            ticks.t += 10  # tried again every 60 s of these
    assert not ledger.persistent and "cannot be written" in ledger.trouble
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1  # once per outage
    assert ledger.today("alice").requests == 20  # memory kept counting
    disk.on = False
    ticks.t += 60
    with caplog.at_level(logging.WARNING):
        ledger.flush()
    assert ledger.persistent and ledger.trouble == ""
    assert any("writable again" in r.getMessage() for r in caplog.records)
    ledger.close()
    again = Ledger(tmp_path, clock=clock)
    assert again.today("alice") == Tally(requests=20, generated_tokens=38)  # nothing lost, nothing twice
    again.close()


def test_a_file_that_cannot_be_opened_at_start_is_tried_again_and_its_days_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock, ticks = Clock(), Ticks()
    first = Ledger(tmp_path, clock=clock)
    first.record("bob", Tally(requests=3))
    first.close()
    opening = Failing(monkeypatch, "prune")  # opens, then the first write of the day fails
    ledger = Ledger(tmp_path, clock=clock, monotonic=ticks, retry_s=60)
    assert not ledger.persistent and ledger.trouble
    ledger.record("bob", Tally(requests=1))
    ledger.flush()  # not due yet: nothing tried
    opening.on = False
    ticks.t += 61
    ledger.flush()
    assert ledger.persistent
    assert ledger.today("bob").requests == 4  # the file's earlier count and the new one
    ledger.close()
    assert Ledger(tmp_path, clock=clock).today("bob").requests == 4


def test_close_tries_the_file_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = Ticks()
    ledger = Ledger(tmp_path, monotonic=ticks, retry_s=60)
    disk = Failing(monkeypatch)
    ledger.record("carol", Tally(requests=1))
    ledger.flush()
    disk.on = False
    ledger.close()  # within the retry time, but the process is ending: one last try
    assert Ledger(tmp_path).today("carol").requests == 1
