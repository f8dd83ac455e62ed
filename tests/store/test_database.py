"""The store layer (appliance/store): a transaction is all or none on both engines, each
owner's migrations run once and in order, a failure is a StoreError in the owner's words
carrying its HTTP status, and the files and database the code before the store layer wrote
open unchanged (the same tables, the same rows, only a version number added where none was)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.postgres import fresh_database

from appliance.library.store import FILE_NAME as LIBRARY_FILE
from appliance.library.store import MIGRATIONS as LIBRARY
from appliance.library.store import OFFICE, LibraryStore
from appliance.people.db import FILE_NAME as PEOPLE_FILE
from appliance.people.db import Database as PeopleDatabase
from appliance.people.schema import PEOPLE
from appliance.store.database import Database, Naming, Tx
from appliance.store.errors import StoreConflict, StoreError
from appliance.store.migrations import Migrations
from appliance.store.sqlite import SqliteDatabase
from appliance.usage.shared import SharedUsageStore
from appliance.usage.store import FILE_NAME as USAGE_FILE
from appliance.usage.store import Tally, UsageStore

NAMING = Naming("test store", read_code="t_unreadable", write_code="t_unwritable")
STEPS = (
    ("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",),
    ("INSERT INTO t VALUES ('step2', 2)",),  # a second run would be a conflict: it runs once
    ("UPDATE t SET v = v * 10",),  # after step 2, or there is nothing to multiply
)
# usage/store.py's table as the code before the store layer made it (INTEGER, user_version 0).
OLD_USAGE = """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, who TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, generated_tokens INTEGER NOT NULL DEFAULT 0,
    refusals INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (day, who))"""


def pg(url: str, *owners: Migrations) -> Database:
    from appliance.store.postgres import PgDatabase  # psycopg only where it is asked for

    return PgDatabase(url, owners, NAMING)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    owner = Migrations("t", STEPS)
    if request.param == "sqlite":
        store: Database = SqliteDatabase(tmp_path, "t.sqlite3", owner, NAMING)
    else:
        store = pg(fresh_database(request.getfixturevalue("postgres"), f"s{abs(hash(request.node.nodeid))}"), owner)
    yield store
    store.close()


def values(db: Database) -> list[tuple[object, ...]]:
    return db.read(lambda tx: tx.all("SELECT k, v FROM t ORDER BY k"))


def test_a_transaction_that_fails_leaves_nothing(db: Database) -> None:
    def half(tx: Tx) -> None:
        tx.run("INSERT INTO t VALUES ('a', 1)")
        raise RuntimeError("the caller's own error, half-way")

    with pytest.raises(RuntimeError):
        db.write(half)
    with pytest.raises(StoreConflict) as conflict:  # the second insert meets the migration's row
        db.write(lambda tx: [tx.run("INSERT INTO t VALUES ('b', 1)"), tx.run("INSERT INTO t VALUES ('step2', 1)")])
    assert conflict.value.status == 409 and conflict.value.code == "conflict" and conflict.value.detail
    assert values(db) == [("step2", 20)] and db.trouble == ""  # a conflict is no trouble of the store's
    assert db.write(lambda tx: tx.run("INSERT INTO t VALUES ('c', 3)")) == 1
    assert values(db) == [("c", 3), ("step2", 20)]


def test_sqlite_migrations_run_once_and_in_order(tmp_path: Path) -> None:
    SqliteDatabase(tmp_path, "t.sqlite3", Migrations("t", STEPS[:2]), NAMING).close()
    again = SqliteDatabase(tmp_path, "t.sqlite3", Migrations("t", STEPS[:2]), NAMING)
    assert again.version == 2 and values(again) == [("step2", 2)]
    again.close()
    grown = SqliteDatabase(tmp_path, "t.sqlite3", Migrations("t", STEPS), NAMING)  # one step more: that one runs
    assert grown.version == 3 and values(grown) == [("step2", 20)]
    with pytest.raises(ValueError, match="t's tables"):  # user_version counts one owner's steps
        grown.migrate(Migrations("other", STEPS))
    grown.close()


def test_postgres_owners_migrate_apart_once_and_in_order(postgres: str) -> None:
    url = fresh_database(postgres, "owners")
    first = pg(url, Migrations("t", STEPS[:2]))
    other = Migrations("u", (("CREATE TABLE u (n INTEGER)",), ("INSERT INTO u VALUES (7)",)))
    first.migrate(other)
    first.migrate(other)  # registered twice: its steps still ran once
    first.close()
    again = pg(url, Migrations("t", STEPS), other)  # step 3 of t runs, nothing of u
    assert values(again) == [("step2", 20)]
    assert again.read(lambda tx: tx.all("SELECT n FROM u")) == [(7,)]
    assert again.read(lambda tx: tx.all("SELECT version FROM t_schema_version ORDER BY version")) == [(1,), (2,), (3,)]
    assert again.read(lambda tx: tx.all("SELECT version FROM u_schema_version ORDER BY version")) == [(1,), (2,)]
    again.close()


def test_a_failure_is_a_503_in_the_owners_words_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = SqliteDatabase(tmp_path, "t.sqlite3", Migrations("t", STEPS), NAMING)
    db.close()  # every statement fails from here on, as on a vanished file
    with caplog.at_level(logging.WARNING, logger="appliance.store"):
        with pytest.raises(StoreError) as written:
            db.write(lambda tx: tx.run("INSERT INTO t VALUES ('x', 1)"))
        with pytest.raises(StoreError) as again:
            db.write(lambda tx: tx.run("INSERT INTO t VALUES ('x', 1)"))
    err = written.value
    assert err.status == 503 and err.code == "t_unwritable" and str(err).startswith("not saved: the test store")
    assert err.body()["error"]["message"] == str(err) and db.trouble == str(again.value)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_a_failed_read_says_read(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path, "t.sqlite3", Migrations("t", STEPS), NAMING)
    db.close()
    with pytest.raises(StoreError, match="cannot be read now") as read:
        values(db)
    assert read.value.code == "t_unreadable" and read.value.status == 503


def schema(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def old_file(path: Path, statements: tuple[str, ...], version: int, *rows: str) -> list[tuple[object, ...]]:
    """A file as the code before the store layer left it; its schema."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    with sqlite3.connect(path) as conn:
        for sql in (*statements, *rows):
            conn.execute(sql)
        conn.execute(f"PRAGMA user_version = {version}")
    path.chmod(0o600)
    return schema(path)


def test_sqlite_files_written_before_the_store_layer_open_unchanged(tmp_path: Path) -> None:
    people = old_file(tmp_path / PEOPLE_FILE, PEOPLE.steps[0], 1,
                      "INSERT INTO people (id, name, name_key, role, created) VALUES ('p1', 'Ann', 'ann', 'admin', 1)")
    db = PeopleDatabase(tmp_path)
    assert db.version == 1 and db.read(lambda tx: tx.all("SELECT id, name FROM people")) == [("p1", "Ann")]
    db.close()
    assert schema(tmp_path / PEOPLE_FILE) == people
    library = old_file(tmp_path / LIBRARY_FILE, LIBRARY.steps[0], 1,
                       "INSERT INTO documents VALUES ('lib_1', 'office', 'FAQ', 'faq.txt', 'text', 9, NULL, 9, 0, 0, 0, "
                       "'ready', NULL, 1.0, 'op')")
    store = LibraryStore(tmp_path)
    assert [d.id for d in store.docs([OFFICE])] == ["lib_1"] and not store.read_only
    store.close()
    assert schema(tmp_path / LIBRARY_FILE) == library
    usage = old_file(tmp_path / USAGE_FILE, (OLD_USAGE,), 0, "INSERT INTO usage VALUES ('2027-01-01', 'Ann', 1, 2, 3, 4, 5)")
    table = UsageStore(tmp_path)  # its one step (IF NOT EXISTS) finds the table there: version 1, nothing else
    assert table.rows() == [("2027-01-01", "Ann", Tally(1, 2, 3, 4, 5))]
    assert table.db.version == 1  # type: ignore[attr-defined]
    table.close()
    assert schema(tmp_path / USAGE_FILE) == usage


def test_a_shared_database_from_before_the_store_layer_opens_unchanged(postgres: str) -> None:
    import psycopg

    from appliance.people.postgres import PgDatabase

    url = fresh_database(postgres, "before")
    with psycopg.connect(url, autocommit=True) as conn:  # as people/postgres.py and usage/shared.py left it
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for sql in PEOPLE.steps[0]:
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version VALUES (1)")
        conn.execute(OLD_USAGE.replace("INTEGER", "BIGINT"))
        conn.execute("INSERT INTO usage VALUES ('2027-01-01', 'Ann', 1, 2, 3, 4, 5)")
        conn.execute("INSERT INTO people (id, name, name_key, role, created) VALUES ('p1', 'Ann', 'ann', 'admin', 1)")
    db = PgDatabase(url)
    shared = SharedUsageStore(db)
    assert shared.rows() == [("2027-01-01", "Ann", Tally(1, 2, 3, 4, 5))]
    assert db.read(lambda tx: tx.all("SELECT id FROM people")) == [("p1",)]
    assert db.read(lambda tx: tx.all("SELECT version FROM schema_version")) == [(1,)]
    assert db.read(lambda tx: tx.all("SELECT version FROM usage_schema_version")) == [(1,)]  # the one thing added
    db.close()
