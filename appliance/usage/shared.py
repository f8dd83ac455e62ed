"""The daily usage table in the store several boxes share (PostgreSQL at `database_url`):
the same rows as usage/store.py's SQLite file, added to by every box, so a person's quota
counts what they used on all of them (the ledger reads today's rows back after each write).
"""

from __future__ import annotations

from collections.abc import Iterable

from appliance.people.db import MIGRATION_LOCK, Store, Tx
from appliance.usage.store import ADD_SQL, COLUMNS, Row, Tally

_SCHEMA = """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, who TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    cached_tokens BIGINT NOT NULL DEFAULT 0, generated_tokens BIGINT NOT NULL DEFAULT 0,
    refusals BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (day, who))"""


class SharedUsageStore:
    """UsageStore's methods over a shared Store; errors are the store's StoreError."""

    def __init__(self, db: Store) -> None:
        self.db = db
        self.path = db.path

        def create(tx: Tx) -> None:
            # Under the migrations' lock: two boxes starting at once would both try to create the
            # table, and PostgreSQL refuses the second (a unique violation in its catalogue).
            tx.one("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            tx.run(_SCHEMA)

        db.write(create)

    def add(self, rows: Iterable[Row]) -> None:
        params = [(day, who, *(getattr(t, c) for c in COLUMNS)) for day, who, t in rows]

        def add(tx: object) -> None:
            for p in params:
                tx.run(ADD_SQL, p)  # type: ignore[attr-defined]

        self.db.write(add)

    def rows(self, since: str = "") -> list[Row]:
        got = self.db.read(lambda tx: tx.all(
            f"SELECT day, who, {', '.join(COLUMNS)} FROM usage WHERE day >= ? ORDER BY day, who", (since,)))
        return [(day, who, Tally(*(int(x) for x in counts))) for day, who, *counts in got]

    def prune(self, before: str) -> int:
        return self.db.write(lambda tx: tx.run("DELETE FROM usage WHERE day < ?", (before,)))

    def close(self) -> None:
        """The connection is the people store's too: it stays open."""
