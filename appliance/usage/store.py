"""The daily usage table: one row per (local day, identity) with counts only, added to in
small transactions, old days pruned. One definition for both engines: usage.sqlite3 in
state_dir on one box (UsageStore), or the PostgreSQL database several boxes share
(shared.py), where every box adds to the same rows.

The SQLite file is private like the session files (store/sqlite.py: statedir.private_file
makes the directory 0700 and the file 0600, refusing a symlink).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from appliance.store.database import Database, Naming, Tx
from appliance.store.migrations import Migrations
from appliance.store.sqlite import SqliteDatabase

FILE_NAME = "usage.sqlite3"
# IF NOT EXISTS: the table is older than its migrations (a usage.sqlite3 at user_version 0, a
# shared database without usage_schema_version hold it already). BIGINT: SQLite's INTEGER.
USAGE = Migrations("usage", ((
    """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, who TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    cached_tokens BIGINT NOT NULL DEFAULT 0, generated_tokens BIGINT NOT NULL DEFAULT 0,
    refusals BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (day, who))""",
),))
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
NAMING = Naming("usage database", journal=False)  # the ledger says what it keeps in memory meanwhile


class UsageTable:
    """The table on a Database; every method may raise the store's StoreError: the caller
    decides (the ledger logs one line and goes on counting in memory)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.path = db.path
        db.migrate(USAGE)

    def add(self, rows: Iterable[Row]) -> None:
        """Add counts to their days' rows, in one transaction."""
        params = [(day, who, *astuple(t)) for day, who, t in rows]

        def add(tx: Tx) -> None:
            for p in params:
                tx.run(ADD_SQL, p)
        self.db.write(add)

    def rows(self, since: str = "") -> list[Row]:
        """Every row from day `since` on (YYYY-MM-DD; "" = all), oldest first."""
        got = self.db.read(lambda tx: tx.all(
            f"SELECT day, who, {', '.join(COLUMNS)} FROM usage WHERE day >= ? ORDER BY day, who", (since,)))
        return [(day, who, Tally(*(int(x) for x in counts))) for day, who, *counts in got]

    def forget(self, who: str) -> int:
        """Remove every row of `who` (a person removed with everything of theirs); the rows removed."""
        return self.db.write(lambda tx: tx.run("DELETE FROM usage WHERE who = ?", (who,)))

    def prune(self, before: str) -> int:
        """Forget the days before `before` (YYYY-MM-DD); the rows removed."""
        return self.db.write(lambda tx: tx.run("DELETE FROM usage WHERE day < ?", (before,)))

    def close(self) -> None:
        self.db.close()


class UsageStore(UsageTable):
    """usage.sqlite3 in state_dir, this box's alone."""

    def __init__(self, state_dir: Path) -> None:
        # wal off: the file keeps its rollback journal, as before the store layer (one writer
        # thread, no reader waiting on it; a file broken under it fails at the next write).
        super().__init__(SqliteDatabase(state_dir, FILE_NAME, USAGE, NAMING, wal=False))
