"""Each owner's tables (people, usage, library) as numbered migrations: a database holds an
owner at version len(steps) once opened, each step applied once, in order, with its number.

Where the number is kept: in a SQLite file, PRAGMA user_version (one owner a file:
people.sqlite3, usage.sqlite3, library.sqlite3); in PostgreSQL, which several owners share, a
table per owner (`<owner>_schema_version`; people's is `schema_version`, its name since
before owners had their own).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# pg_advisory_xact_lock's key ("app1") under which PostgreSQL's migrations run: two boxes
# starting together migrate once (the second finds the work done).
MIGRATION_LOCK = 0x61707031


@dataclass(frozen=True, slots=True)
class Migrations:
    owner: str
    steps: tuple[tuple[str, ...], ...]  # step n (from 1): its statements, in one transaction
    version_table: str = ""  # PostgreSQL's; "" = f"{owner}_schema_version"

    @property
    def table(self) -> str:
        return self.version_table or f"{self.owner}_schema_version"

    def due(self, have: int) -> Iterator[tuple[int, tuple[str, ...]]]:
        """The steps after version `have`, with their numbers, in order."""
        for number, statements in enumerate(self.steps, 1):
            if number > have:
                yield number, statements
