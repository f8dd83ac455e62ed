"""The SQLite backend: one file in state_dir (WAL, 0600, migrated on open) for one owner,
used from worker threads one statement batch at a time (`state_dir` None: in memory, tests).

Every failure (a corrupt file, a disk gone read-only or full) is a StoreError carrying one
line; the callers decide what still works (accounts keep the sessions they have seen, the
usage ledger counts in memory, the page is told chats are not being saved).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from appliance.statedir import private_file
from appliance.store.database import Backend, Naming, Params, Tx
from appliance.store.errors import StoreConflict
from appliance.store.migrations import Migrations, NewerSchema

log = logging.getLogger(__name__)
T = TypeVar("T")


class SqliteTx:
    """One transaction's statements (the database's only way to the connection)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def run(self, sql: str, params: Params = ()) -> int:
        """Run one statement; the rows it changed."""
        return self._conn.execute(sql, tuple(params)).rowcount

    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        row = self._conn.execute(sql, tuple(params)).fetchone()
        return tuple(row) if row is not None else None

    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._conn.execute(sql, tuple(params)).fetchall()]


class SqliteDatabase(Backend):
    """One owner's file: its migrations are applied on open, its version is the file's user_version."""

    def __init__(self, state_dir: Path | None, file_name: str, migrations: Migrations, naming: Naming,
                 wal: bool = True) -> None:
        super().__init__(str(state_dir / file_name) if state_dir is not None else ":memory:", naming)
        self.file_name, self.owner = file_name, migrations.owner
        self.read_only = False  # opened read-only: the disk was at start-up
        self._lock = threading.Lock()
        try:
            self._conn = self._open(state_dir)
        except (OSError, sqlite3.Error) as e:
            raise self._open_failed(e) from None
        try:
            self._conn.execute("PRAGMA foreign_keys = ON")
            if state_dir is not None and not self.read_only:
                if wal:  # readers never wait on the writer
                    self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate(migrations)
        except (sqlite3.Error, NewerSchema) as e:
            self._conn.close()
            raise self._open_failed(e) from None

    def _open(self, state_dir: Path | None) -> sqlite3.Connection:
        """The file, read and write; on a disk gone read-only (an SD card failing), read only:
        what it holds is read, nothing is saved, and the journal says so once."""
        if state_dir is None:
            return sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            target = str(private_file(state_dir, self.file_name))
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not (state_dir / self.file_name).is_file():
                raise
            # immutable: a WAL file is opened read-only only where its -shm can be made, or so.
            conn = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True, timeout=5,
                                   check_same_thread=False, isolation_level=None)
            self.trouble = f"{self.naming.what} {self.path}: read-only ({e.strerror})"
            self.read_only = True
            log.error("%s; what it holds is read, nothing is saved until it is writable", self.trouble)
            return conn
        # check_same_thread off: opened on the thread that builds the app, used by worker threads.
        return sqlite3.connect(target, timeout=5, check_same_thread=False, isolation_level=None)

    @property
    def version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self, migrations: Migrations) -> None:
        """Bring the file's owner up to date (its migrations ran on open: this finds none due)."""
        with self._lock:
            try:
                self._migrate(migrations)
            except sqlite3.Error as e:
                raise self._failed(e, writing=True) from None

    def _migrate(self, migrations: Migrations) -> None:
        if migrations.owner != self.owner:  # user_version counts one owner's steps
            raise ValueError(f"{self.path} holds {self.owner}'s tables, not {migrations.owner}'s")
        for number, statements in migrations.due(self.version):
            with self._tx() as tx:
                for sql in statements:
                    tx.run(sql)
                tx.run(f"PRAGMA user_version = {number}")
            log.info("%s %s: migrated to version %d", self.naming.what, self.path, number)

    def read(self, fn: Callable[[Tx], T]) -> T:
        """fn's result, reading one consistent view."""
        with self._lock:
            try:
                return fn(SqliteTx(self._conn))
            except sqlite3.Error as e:
                raise self._failed(e, writing=False) from None

    def write(self, fn: Callable[[Tx], T]) -> T:
        """fn's result, its statements in one transaction (all or none)."""
        with self._lock:
            try:
                with self._tx() as tx:
                    result = fn(tx)
            except sqlite3.IntegrityError as e:
                raise StoreConflict(str(e)) from None  # the store is fine: the change met another
            except sqlite3.Error as e:
                raise self._failed(e, writing=True) from None
            self._worked()
            return result

    @contextmanager
    def _tx(self) -> Iterator[SqliteTx]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield SqliteTx(self._conn)
            self._conn.execute("COMMIT")  # a full or read-only disk fails here
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

