"""The people store: people.sqlite3 in state_dir (store/sqlite.py) with people's and chats'
tables (schema.py); on PostgreSQL, postgres.py. Accounts and chats use it as a store.Database."""

from __future__ import annotations

from pathlib import Path

from appliance.people.schema import PEOPLE
from appliance.store.database import Database as Store
from appliance.store.database import Naming, Tx
from appliance.store.errors import StoreConflict, StoreError
from appliance.store.sqlite import SqliteDatabase

FILE_NAME = "people.sqlite3"
NAMING = Naming("people store")


class Database(SqliteDatabase):
    """People's SQLite file. `state_dir` None keeps it in memory (tests)."""

    def __init__(self, state_dir: Path | None) -> None:
        super().__init__(state_dir, FILE_NAME, PEOPLE, NAMING)


__all__ = ["FILE_NAME", "NAMING", "Database", "Store", "StoreConflict", "StoreError", "Tx"]
