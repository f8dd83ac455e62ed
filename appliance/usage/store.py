"""The daily usage table in SQLite (the standard library's sqlite3) under state_dir: one row
per (local day, identity) with counts only, added to in small transactions, old days pruned.

The file is private like the session files: statedir.private_file checks the directory and
makes it 0700 (a symlink or another user's directory is refused) and creates the file 0600
without following a symlink; SQLite gives its journal the file's mode.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from appliance.statedir import private_file

log = logging.getLogger(__name__)
FILE_NAME = "usage.sqlite3"
_SCHEMA = """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, who TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, generated_tokens INTEGER NOT NULL DEFAULT 0,
    refusals INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (day, who))"""
ADD_SQL = ("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (day, who) DO UPDATE SET "
        "requests = usage.requests + excluded.requests, prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens, "
        "cached_tokens = usage.cached_tokens + excluded.cached_tokens, "
        "generated_tokens = usage.generated_tokens + excluded.generated_tokens, refusals = usage.refusals + excluded.refusals")


@dataclass(slots=True)
class Tally:
    """One identity's counts for one day (or any sum of them)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    refusals: int = 0

    def add(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> Tally:
        return Tally(*astuple(self))


COLUMNS = tuple(f.name for f in fields(Tally))
Row = tuple[str, str, Tally]  # (day as YYYY-MM-DD, identity, counts)


class UsageStore:
    """The SQLite file. Every method may raise sqlite3.Error or OSError: the caller decides
    (the ledger logs one line and goes on counting in memory)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = private_file(state_dir, FILE_NAME)
        # One connection, used by the ledger's writer thread after this (check_same_thread off
        # because it is created on the thread that builds the app).
        self._db = sqlite3.connect(self.path, timeout=5, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute(_SCHEMA)
            self._db.execute("SELECT count(*) FROM usage").fetchone()  # a corrupt file fails here
        except BaseException:
            self._db.close()
            raise

    def add(self, rows: Iterable[Row]) -> None:
        """Add counts to their days' rows, in one transaction."""
        with self._transaction():
            self._db.executemany(ADD_SQL, [(day, who, *astuple(t)) for day, who, t in rows])

    def rows(self, since: str = "") -> list[Row]:
        """Every row from day `since` on (YYYY-MM-DD; "" = all), oldest first."""
        cur = self._db.execute(f"SELECT day, who, {', '.join(COLUMNS)} FROM usage WHERE day >= ? ORDER BY day, who",
                               (since,))
        return [(day, who, Tally(*counts)) for day, who, *counts in cur.fetchall()]

    def prune(self, before: str) -> int:
        """Forget the days before `before` (YYYY-MM-DD); the rows removed."""
        with self._transaction():
            return self._db.execute("DELETE FROM usage WHERE day < ?", (before,)).rowcount

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # The connection runs in autocommit mode: each batch is one explicit transaction.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
