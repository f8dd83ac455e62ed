"""No downgrade: a database a newer release wrote (its owner's schema version above what this
code knows) is refused at open and left as it was, never read with the wrong tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from appliance.people.db import FILE_NAME, Database
from appliance.people.schema import PEOPLE
from appliance.store.errors import StoreError
from appliance.store.migrations import NewerSchema


def test_a_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    Database(tmp_path).close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        db.execute(f"PRAGMA user_version = {len(PEOPLE.steps) + 1}")
    before = (tmp_path / FILE_NAME).read_bytes()
    with pytest.raises(StoreError, match="newer version of the appliance"):
        Database(tmp_path)
    assert (tmp_path / FILE_NAME).read_bytes() == before


def test_due_steps() -> None:
    assert [n for n, _ in PEOPLE.due(0)] == list(range(1, len(PEOPLE.steps) + 1))
    assert PEOPLE.due(len(PEOPLE.steps)) == []
    with pytest.raises(NewerSchema, match="people's tables are at schema version"):
        PEOPLE.due(len(PEOPLE.steps) + 1)
