"""A consistent copy of a live SQLite file (`appliance backup`): SQLite's online backup API
reads one snapshot of the database while the server keeps writing (in WAL mode the writer is
never blocked), where copying the file would take pages from before and after a commit and
leave the -wal file's newest pages behind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from appliance.store.errors import StoreError


def copy_sqlite(src: Path, dst: Path) -> int:
    """Copy `src` into the new file `dst` through the backup API, check the copy and make it one
    self-contained file (rollback journal, no -wal beside it); the copy's user_version."""
    try:
        source = sqlite3.connect(src.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as e:
        raise StoreError(f"{src} cannot be opened to back it up: {e}") from None
    try:
        target = sqlite3.connect(dst)
        try:
            source.backup(target)  # pages=-1: one step, so one snapshot (a writer restarts a stepped copy)
            check = target.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(f"the copy of {src} fails SQLite's check: {check}")
            target.execute("PRAGMA journal_mode = DELETE")  # the server sets WAL again when it opens it
            return int(target.execute("PRAGMA user_version").fetchone()[0])
        finally:
            target.close()
    except sqlite3.Error as e:
        raise StoreError(f"{src} could not be backed up: {e}") from None
    finally:
        source.close()
