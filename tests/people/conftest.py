from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fakes import FakeClock

from appliance.people.accounts import Accounts
from appliance.people.chats import Chats
from appliance.people.db import Database, Store
from appliance.people.passwords import Hasher


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)  # the wall clock and the monotonic one, moved by the test


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store on each engine: the same statements must mean the same on both."""
    if request.param == "sqlite":
        store: Store = Database(tmp_path / "state")
    else:
        from helpers.postgres import fresh_database

        from appliance.people.postgres import PgDatabase

        store = PgDatabase(fresh_database(request.getfixturevalue("postgres"), f"t{abs(hash(request.node.nodeid))}"))
    yield store
    store.close()


@pytest.fixture
def accounts(db: Store, clock: FakeClock) -> Accounts:
    # A cheap scrypt cost: these test the policies around the hash (test_passwords.py tests the hash).
    return Accounts(db, clock=clock, monotonic=clock, hasher=Hasher(n=2**10))


@pytest.fixture
def chats(db: Store, clock: FakeClock) -> Chats:
    return Chats(db, clock=clock)
