"""Two boxes' ledgers on one PostgreSQL (database_url): each writes its counts to the one
usage table and reads today's back, so a quota counts what a person used on both boxes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.fakes import FakeClock

from appliance.http.accounting import Accounting
from appliance.http.guard import Caller
from appliance.people.accounts import Account, Role
from appliance.people.postgres import PgDatabase
from appliance.usage.ledger import Ledger
from appliance.usage.shared import SharedUsageStore
from appliance.usage.store import Tally


@pytest.fixture
def two_boxes(postgres: str) -> Iterator[tuple[Ledger, Ledger]]:
    from helpers.postgres import fresh_database

    url = fresh_database(postgres, "usage_two_boxes")
    dbs = [PgDatabase(url), PgDatabase(url)]
    clock = FakeClock(1_800_000_000.0)
    ledgers = [Ledger(retention_days=30, clock=clock, shared=lambda db=db: SharedUsageStore(db))  # type: ignore[misc]
               for db in dbs]
    yield ledgers[0], ledgers[1]
    for ledger, db in zip(ledgers, dbs, strict=True):
        ledger.close()
        db.close()


def test_a_quota_counts_what_a_person_used_on_both_boxes(two_boxes: tuple[Ledger, Ledger]) -> None:
    a, b = two_boxes
    ann = Caller("10.0.0.2", None, account=Account("p1", "Ann", Role.USER, quota=100))
    box_a, box_b = Accounting(a), Accounting(b)
    a.record("Ann", Tally(requests=1, generated_tokens=60))
    box_a.check(ann)  # 60 of 100 on this box
    b.record("Ann", Tally(requests=1, generated_tokens=30))
    a.flush()
    b.flush()
    a.flush()  # box A reads back what B wrote
    assert a.today("Ann").generated_tokens == 90 and b.today("Ann").generated_tokens == 90
    b.record("Ann", Tally(requests=1, generated_tokens=15))
    b.flush()
    a.flush()
    assert a.today("Ann").generated_tokens == 105
    for box in (box_a, box_b):
        with pytest.raises(Exception, match="daily quota reached"):
            box.check(ann)


def test_counts_not_yet_written_still_count_on_their_box(two_boxes: tuple[Ledger, Ledger]) -> None:
    a, b = two_boxes
    a.record("Ben", Tally(requests=1, generated_tokens=5))
    b.flush()  # B reads back: nothing of Ben's is written yet
    a.flush()
    a.record("Ben", Tally(requests=1, generated_tokens=7))
    b.flush()
    assert b.today("Ben").generated_tokens == 5 and a.today("Ben").generated_tokens == 12
    rows = a.rows()
    assert [(who, t.requests) for _, who, t in rows] == [("Ben", 2)]


def test_boxes_starting_together_create_the_tables_once(postgres: str) -> None:
    """Two boxes (here four) starting at once on an empty database: each migrates and creates
    the usage table under one lock; none fails (a unique violation in the catalogue)."""
    import threading

    from helpers.postgres import fresh_database

    url = fresh_database(postgres, "usage_starting_together")
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def box() -> None:
        try:
            start.wait()
            db = PgDatabase(url)
            SharedUsageStore(db).add([("2027-01-01", "Ann", Tally(requests=1))])
            db.close()
        except BaseException as e:  # noqa: BLE001 - the test reports what any box raised
            errors.append(e)

    threads = [threading.Thread(target=box) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    db = PgDatabase(url)
    assert SharedUsageStore(db).rows() == [("2027-01-01", "Ann", Tally(requests=4))]
    db.close()
