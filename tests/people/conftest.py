from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fakes import FakeClock

from appliance.people.accounts import Accounts
from appliance.people.chats import Chats
from appliance.people.db import Database
from appliance.people.passwords import Hasher


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)  # the wall clock and the monotonic one, moved by the test


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(tmp_path / "state")


@pytest.fixture
def accounts(db: Database, clock: FakeClock) -> Accounts:
    # A cheap scrypt cost: these test the policies around the hash (test_passwords.py tests the hash).
    return Accounts(db, clock=clock, monotonic=clock, hasher=Hasher(n=2**10))


@pytest.fixture
def chats(db: Database, clock: FakeClock) -> Chats:
    return Chats(db, clock=clock)
