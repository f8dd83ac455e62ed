"""The people store on PostgreSQL (`database_url`): several boxes behind one nginx share
people, sessions, keys, chats and the usage table, so a person's chats and quota are the same
on every box. psycopg 3 (its binary wheel carries libpq), imported here only.

The same statements as SQLite's (db.Tx's `?` placeholders become psycopg's `%s`); migrations
are numbered in a `schema_version` table and applied under an advisory lock, so two boxes
starting together migrate once. A lost connection is one journal line and the next call
connects again.
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

from appliance.people.db import MIGRATION_LOCK, Params, StoreConflict, StoreError
from appliance.people.schema import MIGRATIONS

log = logging.getLogger(__name__)
T = TypeVar("T")
CONNECT_TIMEOUT_S = 5


def _sql(statement: str) -> str:
    # Ours carry no literal '?' or '%': every '?' is a parameter.
    return statement.replace("%", "%%").replace("?", "%s")


def redact(url: str) -> str:
    """The URL as the journal and /admin may show it: without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


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


class PgDatabase:
    """One connection, used by one thread at a time (the routes' worker threads, the usage
    writer): an office's requests to the store are short and few."""

    def __init__(self, url: str, migrations: tuple[tuple[str, ...], ...] = MIGRATIONS) -> None:
        self.url, self.path = url, redact(url)
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self.trouble = ""
        self._migrations = migrations
        with self._lock:
            try:
                self._connect()
            except psycopg.Error as e:
                raise StoreError(f"people store {self.path}: {e}".strip()) from None

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
            self._migrate(self._conn)
        return self._conn

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            cur.execute("SELECT coalesce(max(version), 0) FROM schema_version")
            row = cur.fetchone()
            have = int(row[0]) if row else 0
            for number, statements in enumerate(self._migrations, 1):
                if number <= have:
                    continue
                for sql in statements:
                    cur.execute(sql)
                cur.execute("INSERT INTO schema_version VALUES (%s)", (number,))
                log.info("people store %s: migrated to version %d", self.path, number)

    @property
    def version(self) -> int:
        return int(self.read(lambda tx: (tx.one("SELECT coalesce(max(version), 0) FROM schema_version") or (0,))[0]))

    def read(self, fn: Callable[[PgTx], T]) -> T:
        return self.write(fn)  # a transaction either way: one consistent view

    def write(self, fn: Callable[[PgTx], T]) -> T:
        with self._lock:
            try:
                conn = self._connect()
                with conn.transaction(), conn.cursor() as cur:
                    result = fn(PgTx(cur))
            except psycopg.errors.IntegrityError as e:
                raise StoreConflict(str(e).strip().splitlines()[0]) from None
            except psycopg.Error as e:
                if self._conn is not None and (self._conn.closed or isinstance(e, psycopg.OperationalError)):
                    self._conn.close()
                    self._conn = None  # connect again next time
                raise self._failed(e) from None
        if self.trouble:
            log.warning("people store %s works again: chats are saved", self.path)
            self.trouble = ""
        return result

    def _failed(self, e: psycopg.Error) -> StoreError:
        err = StoreError(f"people store {self.path}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
        if not self.trouble:
            log.error("%s; signed-in people keep working, chats are not being saved", err)
        self.trouble = str(err)
        return err

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
