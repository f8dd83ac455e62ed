"""The people store's database: one SQLite file in state_dir (WAL, 0600, migrated on open),
used from worker threads one statement batch at a time.

Every failure below (a corrupt file, a disk gone read-only or full) is a StoreError carrying
one line for the journal; the callers decide what still works (accounts.py keeps the sessions
it has seen; the page is told chats are not being saved).
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from appliance.people.schema import MIGRATIONS
from appliance.statedir import private_file

log = logging.getLogger(__name__)
FILE_NAME = "people.sqlite3"
T = TypeVar("T")
Params = Sequence[Any]
# pg_advisory_xact_lock's key ("app1") under which PostgreSQL's migrations run: here, not in
# postgres.py, so the usage table's code can name it without importing psycopg (issue 47).
MIGRATION_LOCK = 0x61707031


class StoreError(Exception):
    """The store cannot do this now; str() is one line for the journal and the admin page."""


class StoreConflict(StoreError):
    """Two changes at once that cannot both be (two people added under one name): a 409 at a
    route; elsewhere a StoreError like any other."""


class Tx(Protocol):
    """One transaction's statements, on either engine (SQLite here, PostgreSQL in postgres.py)."""

    def run(self, sql: str, params: Params = ()) -> int: ...
    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None: ...
    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...


class Store(Protocol):
    """What accounts.py, chats.py and the usage table use of a database."""

    path: str
    trouble: str

    def read(self, fn: Callable[[Tx], T]) -> T: ...
    def write(self, fn: Callable[[Tx], T]) -> T: ...
    def close(self) -> None: ...


class SqliteTx:
    """One transaction's statements (the store's only way to the connection)."""

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


class Database:
    """The SQLite file. `path` ":memory:" keeps it in memory (tests)."""

    def __init__(self, state_dir: Path | None, file_name: str = FILE_NAME,
                 migrations: Sequence[Sequence[str]] = MIGRATIONS, what: str = "people store") -> None:
        # file_name, migrations, what: the library's database (library/store.py) is one too.
        self.file_name, self.migrations, self.what = file_name, migrations, what
        self.read_only = False  # opened read-only: the disk was at start-up
        self._lock = threading.Lock()
        self.trouble = ""  # the last failure, "" since the last write that worked (or never failed)
        try:
            self._conn, target = self._open(state_dir)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"{what} {state_dir}/{file_name}: {e}") from None
        self.path = target
        try:
            self._conn.execute("PRAGMA foreign_keys = ON")
            if state_dir is not None and not self.trouble:
                self._conn.execute("PRAGMA journal_mode = WAL")  # readers never wait on the writer
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.Error as e:
            self._conn.close()
            raise StoreError(f"{what} {target}: {e}") from None

    def _open(self, state_dir: Path | None) -> tuple[sqlite3.Connection, str]:
        """The file, read and write; on a disk gone read-only (an SD card failing), read only:
        people sign in and read their chats, nothing is saved, and the journal says so once."""
        if state_dir is None:
            return sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None), ":memory:"
        try:
            target = str(private_file(state_dir, self.file_name))
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not (state_dir / self.file_name).is_file():
                raise
            target = str(state_dir / self.file_name)
            # immutable: a WAL file is opened read-only only where its -shm can be made, or so.
            conn = sqlite3.connect(f"file:{target}?mode=ro&immutable=1", uri=True, timeout=5,
                                   check_same_thread=False, isolation_level=None)
            self.trouble = f"{self.what} {target}: read-only ({e.strerror})"
            self.read_only = True
            log.error("%s; what it holds is read, nothing is saved until it is writable", self.trouble)
            return conn, target
        return sqlite3.connect(target, timeout=5, check_same_thread=False, isolation_level=None), target

    @property
    def version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        for number, statements in enumerate(self.migrations, 1):
            if self.version >= number:
                continue
            with self._tx() as tx:
                for sql in statements:
                    tx.run(sql)
                tx.run(f"PRAGMA user_version = {number}")
            log.info("%s %s: migrated to version %d", self.what, self.path, number)

    def read(self, fn: Callable[[Tx], T]) -> T:
        """fn's result, reading one consistent view."""
        with self._lock:
            try:
                return fn(SqliteTx(self._conn))
            except sqlite3.Error as e:
                raise self._failed(e) from None

    def write(self, fn: Callable[[Tx], T]) -> T:
        """fn's result, its statements in one transaction (all or none)."""
        with self._lock:
            try:
                with self._tx() as tx:
                    result = fn(tx)
            except sqlite3.IntegrityError as e:
                raise StoreConflict(str(e)) from None  # the store is fine: the change met another
            except sqlite3.Error as e:
                raise self._failed(e) from None
            if self.trouble:
                log.warning("%s %s works again: changes are saved", self.what, self.path)
                self.trouble = ""
            return result

    def _failed(self, e: sqlite3.Error) -> StoreError:
        """The error to raise; the first of a run of failures is one journal line."""
        err = StoreError(f"{self.what} {self.path}: {e}")
        if not self.trouble:
            log.error("%s; what it holds is still read, changes are not being saved", err)
        self.trouble = str(err)
        return err

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
