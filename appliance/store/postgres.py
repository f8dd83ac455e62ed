"""The PostgreSQL backend (`database_url`): several boxes behind one nginx share people,
sessions, keys, chats and the usage table, so a person's chats and quota are the same on every
box. psycopg 3 (its binary wheel carries libpq), imported here only, and this module only
when database_url is set.

The same statements as SQLite's (Tx's `?` placeholders become psycopg's `%s`); each owner's
migrations are numbered in its own version table and applied under an advisory lock, so two
boxes starting together migrate once. A lost connection is one journal line and the next call
connects again (and checks every owner's migrations again).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

try:
    import psycopg
    import psycopg.errors
except ModuleNotFoundError as e:  # config.load says so first for `appliance serve`
    from appliance.config import install_hint
    raise ModuleNotFoundError(f"{e}: database_url needs the postgres extra: {install_hint('postgres')}",
                              name=e.name) from e

from appliance.store.database import Backend, Naming, Params, Tx
from appliance.store.errors import StoreConflict
from appliance.store.migrations import MIGRATION_LOCK, Migrations, NewerSchema

log = logging.getLogger(__name__)
T = TypeVar("T")
CONNECT_TIMEOUT_S = 5


def _sql(statement: str) -> str:
    # Ours carry no literal '?' or '%': every '?' is a parameter.
    return statement.replace("%", "%%").replace("?", "%s")


def redact(url: str) -> str:
    """The URL as the journal and /admin may show it: without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class PgTx:
    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    def run(self, sql: str, params: Params = ()) -> int:
        self._cur.execute(_sql(sql), tuple(params))
        return int(self._cur.rowcount)

    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        self._cur.execute(_sql(sql), tuple(params))
        row = self._cur.fetchone()
        return tuple(row) if row is not None else None

    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(_sql(sql), tuple(params))
        return [tuple(r) for r in self._cur.fetchall()]


class PgDatabase(Backend):
    """One connection, used by one thread at a time (the routes' worker threads, the usage
    writer): an office's requests to the store are short and few. `migrations`: the owners
    known at open; another registers with migrate() (the usage table, on the people's connection)."""

    def __init__(self, url: str, migrations: tuple[Migrations, ...], naming: Naming) -> None:
        super().__init__(redact(url), naming)
        self.url = url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._owners = list(migrations)
        with self._lock:
            try:
                self._connect()
            except (psycopg.Error, NewerSchema) as e:
                raise self._open_failed(_line(e)) from None

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
            for owner in self._owners:
                self._migrate(self._conn, owner)
        return self._conn

    def _migrate(self, conn: psycopg.Connection[Any], migrations: Migrations) -> None:
        table = migrations.table
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            cur.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
            cur.execute(f"SELECT coalesce(max(version), 0) FROM {table}")
            row = cur.fetchone()
            for number, statements in migrations.due(int(row[0]) if row else 0):
                for sql in statements:
                    cur.execute(sql)
                cur.execute(f"INSERT INTO {table} VALUES (%s)", (number,))
                log.info("%s %s: %s migrated to version %d", self.naming.what, self.path, migrations.owner, number)

    def migrate(self, migrations: Migrations) -> None:
        """Register an owner: its steps due now, and on every connection after."""
        with self._lock:
            try:
                self._migrate(self._connect(), migrations)
            except psycopg.Error as e:
                raise self._lost(e) from None
            if migrations not in self._owners:
                self._owners.append(migrations)

    def version_of(self, migrations: Migrations) -> int:
        return int(self.read(lambda tx: (tx.one(f"SELECT coalesce(max(version), 0) FROM {migrations.table}") or (0,))[0]))

    @property
    def version(self) -> int:
        """The first owner's version."""
        return self.version_of(self._owners[0])

    def read(self, fn: Callable[[Tx], T]) -> T:
        return self.write(fn)  # a transaction either way: one consistent view

    def write(self, fn: Callable[[Tx], T]) -> T:
        with self._lock:
            try:
                conn = self._connect()
                with conn.transaction(), conn.cursor() as cur:
                    result = fn(PgTx(cur))
            except psycopg.errors.IntegrityError as e:
                raise StoreConflict(_line(e)) from None
            except psycopg.Error as e:
                raise self._lost(e) from None
        self._worked()
        return result

    def _lost(self, e: psycopg.Error) -> Exception:
        if self._conn is not None and (self._conn.closed or isinstance(e, psycopg.OperationalError)):
            self._conn.close()
            self._conn = None  # connect again next time
        return self._failed(_line(e), writing=True)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
