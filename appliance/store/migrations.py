"""Each owner's tables (people, usage, library) as numbered migrations: a database holds an
owner at version len(steps) once opened, each step applied once, in order, with its number.

Where the number is kept: in a SQLite file, PRAGMA user_version (one owner a file:
people.sqlite3, usage.sqlite3, library.sqlite3); in PostgreSQL, which several owners share, a
table per owner (`<owner>_schema_version`; people's is `schema_version`, its name since
before owners had their own).
"""

from __future__ import annotations

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

    def due(self, have: int) -> list[tuple[int, tuple[str, ...]]]:
        """The steps after version `have`, with their numbers, in order. A version above the last
        step is a newer release's (a downgrade): NewerSchema, as this code would misread its tables."""
        if have > len(self.steps):
            raise NewerSchema(f"{self.owner}'s tables are at schema version {have}, written by a newer version of "
                              f"the appliance (this one knows {len(self.steps)}): not opened, so nothing is lost; "
                              "run that version again, or restore a backup this one made")
        return [(number, statements) for number, statements in enumerate(self.steps, 1) if number > have]


class NewerSchema(Exception):
    """A database written by a newer release: opening it is refused (no downgrade)."""
