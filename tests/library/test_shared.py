"""The library on several boxes (database_url): PostgreSQL holds it, each box's SQLite file
is a cache its sync keeps. Two Library objects, each with its own file, stand for two boxes;
their sync rounds are run by the test (the thread's own rounds are waited on, never timed).
Run on PostgreSQL and, for the same statements, on SQLite standing in for it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.documents import pdf_bytes
from helpers.embedding import HANDBOOK, FakeEmbedder, wait_ready
from helpers.polling import wait_until
from helpers.postgres import fresh_database

from appliance.documents.reader import DocumentReader
from appliance.errors import Conflict, Unavailable
from appliance.library.library import Library, LibraryLimits
from appliance.library.shared import MIGRATIONS, SharedLibrary, bump
from appliance.library.store import FILE_NAME, NAMING, OFFICE, LibraryStore, person_scope
from appliance.store.database import Database, Tx
from appliance.store.sqlite import SqliteDatabase

ANN, BEN = person_scope("ann"), person_scope("ben")


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest) -> Iterator[SharedLibrary]:
    if request.param == "sqlite":
        db: Database = SqliteDatabase(None, "shared", MIGRATIONS, NAMING)
    else:
        from appliance.store.postgres import PgDatabase  # psycopg only where it is asked for

        db = PgDatabase(fresh_database(request.getfixturevalue("postgres"), f"l{abs(hash(request.node.nodeid))}"),
                        (MIGRATIONS,), NAMING)
    lib = SharedLibrary(lambda: db)
    yield lib
    lib.close()


class Box:
    """One appliance's library on the shared one: its indexer runs, its sync rounds are the test's."""

    def __init__(self, state: Path, shared: SharedLibrary, limits: LibraryLimits | None = None) -> None:
        self.fake = FakeEmbedder()
        self.lib = Library(LibraryStore(state, cache=True), DocumentReader(), self.fake.embed, self.fake.embed_sync,
                           limits, clock=lambda: 1000.0, shared=shared, sync_s=3600)
        self.lib.vectors.load(self.lib.store.vectors())
        self.lib.indexer.start(resume=False)  # as Library.start with database_url: the first sync round resumes

    def add(self, scope: str, name: str, text: str) -> str:
        return asyncio.run(self.lib.add(scope, "op", name, "text/plain", text.encode())).id

    def find(self, scopes: list[str], question: str) -> list[str]:
        return [f.doc for f in asyncio.run(self.lib.search(scopes, question))]

    def sync(self) -> int:
        assert self.lib.sync is not None
        return self.lib.sync.round()

    def stop(self) -> None:
        self.lib.indexer.stop()
        self.lib.store.close()


@pytest.fixture
def boxes(tmp_path: Path, shared: SharedLibrary) -> Iterator[tuple[Box, Box]]:
    a, b = Box(tmp_path / "a", shared), Box(tmp_path / "b", shared)
    yield a, b
    a.stop()
    b.stop()


def test_a_document_added_on_one_box_is_searched_on_the_other_embedded_once(boxes: tuple[Box, Box]) -> None:
    a, b = boxes
    a.fake.gate.clear()  # box A's indexer waits: box B gets the words first
    doc = asyncio.run(a.lib.add(OFFICE, "op", "handbook.pdf", "application/pdf", pdf_bytes(HANDBOOK))).id
    b.sync()
    held = b.lib.store.doc(doc)
    assert held is not None and held.status == "indexing" and held.pages == 10
    assert b.find([OFFICE], "Linden bakery") == [doc] and len(b.lib.vectors) == 0
    a.fake.gate.set()
    wait_ready(a.lib, doc)
    assert b.sync() == 1
    ready = b.lib.store.doc(doc)
    assert ready is not None and ready.status == "ready" and ready.indexed == ready.passages
    assert len(b.lib.vectors) == ready.passages and b.fake.calls == 0  # A's embeddings, not computed again
    found = asyncio.run(b.lib.search([OFFICE], "where is the assembly point for emergencies?"))
    assert found[0].doc == doc and found[0].page == 7
    assert b.sync() == 0 and a.sync() == 0  # nothing new: each holds what PostgreSQL holds


def test_a_persons_own_documents_follow_them_and_nobody_else_sees_them(boxes: tuple[Box, Box]) -> None:
    a, b = boxes
    own = a.add(ANN, "notes.txt", "Codename Bluefinch: my salary review.")
    wait_ready(a.lib, own)
    b.sync()
    assert b.find([OFFICE, ANN], "Bluefinch salary review") == [own]
    assert [d.id for d in b.lib.documents([OFFICE, ANN])] == [own]
    assert b.find([OFFICE, BEN], "Bluefinch salary review") == []
    assert b.lib.documents([OFFICE, BEN]) == [] and b.lib.document(own, BEN) is None


def test_a_replacement_or_delete_on_one_box_reaches_the_other(boxes: tuple[Box, Box]) -> None:
    a, b = boxes
    doc = a.add(OFFICE, "menu.txt", "Soup of the day: tomato.")
    wait_ready(a.lib, doc)
    b.sync()
    row = b.lib.store.doc(doc)
    assert row is not None
    asyncio.run(b.lib.add(OFFICE, "op", "menu.txt", "text/plain", b"Soup of the day: lentil.", replacing=row))
    wait_ready(b.lib, doc)
    a.sync()
    texts = [f.text for f in asyncio.run(a.lib.search([OFFICE], "soup of the day"))]
    assert texts == ["Soup of the day: lentil."] and len(a.lib.vectors) == 1
    again = a.lib.store.doc(doc)
    assert again is not None
    asyncio.run(a.lib.delete(again))
    assert b.sync() == 1
    assert b.lib.documents([OFFICE]) == [] and len(b.lib.vectors) == 0 and b.find([OFFICE], "soup lentil") == []


def test_the_room_counts_every_boxs_documents(tmp_path: Path, shared: SharedLibrary) -> None:
    one = LibraryLimits(person_documents=1)
    a, b = Box(tmp_path / "a", shared, one), Box(tmp_path / "b", shared, one)
    try:
        a.add(ANN, "a.txt", "one short note")
        with pytest.raises(Conflict, match="delete one first"):  # box B holds none of hers yet
            b.add(ANN, "b.txt", "another")
    finally:
        a.stop()
        b.stop()


def test_without_postgresql_a_box_searches_its_cache_and_refuses_changes(tmp_path: Path) -> None:
    db = SqliteDatabase(None, "shared", MIGRATIONS, NAMING)
    shared = SharedLibrary(lambda: db)
    a = Box(tmp_path / "a", shared)
    try:
        doc = a.add(OFFICE, "faq.txt", "The wifi password is on the fridge.")
        wait_ready(a.lib, doc)
        db.close()  # PostgreSQL goes away
        assert a.find([OFFICE], "wifi password") == [doc]
        with pytest.raises(Unavailable) as refused:
            a.add(OFFICE, "b.txt", "more")
        assert refused.value.status == 503 and refused.value.code in ("library_unavailable", "library_not_writable")
        row = a.lib.store.doc(doc)
        assert row is not None
        with pytest.raises(Unavailable):
            asyncio.run(a.lib.delete(row))
        assert a.sync() == 0 and [d.id for d in a.lib.documents([OFFICE])] == [doc]
    finally:
        a.stop()


def test_a_box_that_was_off_catches_up_and_keeps_its_own_older_documents(tmp_path: Path,
                                                                          shared: SharedLibrary) -> None:
    b = Box(tmp_path / "b", shared)
    gone = b.add(OFFICE, "old.txt", "The canteen closes at two.")
    wait_ready(b.lib, gone)
    b.stop()
    # A document added before database_url: in the file, with no generation from PostgreSQL.
    mine = LibraryStore(tmp_path / "b")
    row = asyncio.run(Library(mine, DocumentReader(), b.fake.embed, b.fake.embed_sync).add(
        OFFICE, "op", "local.txt", "text/plain", b"The bike shed key hangs by the door."))
    mine.close()
    a = Box(tmp_path / "a", shared)
    kept = a.add(OFFICE, "new.txt", "Parking permits are issued by reception.")
    wait_ready(a.lib, kept)
    a.sync()
    asyncio.run(a.lib.delete(a.lib.store.doc(gone)))  # type: ignore[arg-type]
    b = Box(tmp_path / "b", shared)
    try:
        assert b.lib.sync is not None and b.lib.sync.whole  # its first round compares everything
        assert b.sync() == 2
        assert {d.id for d in b.lib.documents([OFFICE])} == {kept, row.id}
        assert b.find([OFFICE], "parking permits")[0] == kept and gone not in b.find([OFFICE], "canteen")
    finally:
        a.stop()
        b.stop()


def schema(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_a_library_file_from_before_becomes_a_cache_with_nothing_lost(tmp_path: Path) -> None:
    """A file the code before wrote (this version's format, without database_url) opened as a
    cache: its rows as they were, two tables added, and opened without database_url again, as before."""
    lib = Library(LibraryStore(tmp_path), DocumentReader(), FakeEmbedder().embed, FakeEmbedder().embed_sync)
    lib.start()
    doc = asyncio.run(lib.add(OFFICE, "op", "faq.txt", "text/plain", b"The AED hangs by reception.")).id
    wait_ready(lib, doc)
    lib.stop()
    before = schema(tmp_path / FILE_NAME)
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        rows = conn.execute("SELECT id, doc, seq, text, vec FROM passages ORDER BY id").fetchall()
    cache = LibraryStore(tmp_path, cache=True)
    try:
        assert cache.db.read(lambda tx: tx.all("SELECT id, doc, seq, text, vec FROM passages ORDER BY id")) == rows
        assert cache.mirrored() == {} and cache.seen() == 0 and len(cache.vectors()) == len(rows)
    finally:
        cache.close()
    after = schema(tmp_path / FILE_NAME)
    assert [t for t in after if t in before] == before  # nothing of before changed or dropped
    assert {t[1] for t in after} - {t[1] for t in before} == {"shared", "shared_seen", "sqlite_autoindex_shared_1"}
    plain = LibraryStore(tmp_path)  # database_url taken away again: the same documents, searched as before
    try:
        assert [d.id for d in plain.docs([OFFICE])] == [doc] and plain.keyword(OFFICE, [], 5, ["aed"])
    finally:
        plain.close()


def test_the_sync_thread_compares_at_start_and_takes_changes_when_asked(tmp_path: Path,
                                                                        shared: SharedLibrary) -> None:
    a = Box(tmp_path / "a", shared)
    first = a.add(OFFICE, "one.txt", "The printer code is 4711.")
    wait_ready(a.lib, first)
    fake = FakeEmbedder()
    b = Library(LibraryStore(tmp_path / "b", cache=True), DocumentReader(), fake.embed, fake.embed_sync,
                shared=shared, sync_s=3600)  # no tick in this test: the rounds are the start's and the asked one
    sync = b.sync
    assert sync is not None
    b.start()
    try:
        with sync.synced:
            assert sync.synced.wait_for(lambda: sync.rounds >= 1, timeout=30)
        assert [d.id for d in b.documents([OFFICE])] == [first] and not sync.whole
        second = a.add(OFFICE, "two.txt", "The fridge is cleaned on Fridays.")
        wait_ready(a.lib, second)
        sync.submit(False)
        with sync.synced:
            assert sync.synced.wait_for(lambda: sync.rounds >= 2, timeout=30)
        assert {d.id for d in b.documents([OFFICE])} == {first, second}
        assert [f.doc for f in asyncio.run(b.search([OFFICE], "fridge cleaned"))][0] == second
        assert fake.calls == 0
    finally:
        b.stop()
        a.stop()


def test_a_file_that_fails_to_embed_is_failed_on_every_box(boxes: tuple[Box, Box]) -> None:
    a, b = boxes

    def broken(texts: list[str]) -> object:
        raise RuntimeError("the embedding model fell over")

    a.lib.indexer.embed = broken  # type: ignore[assignment]
    doc = a.add(OFFICE, "bad.txt", "Nothing to see.")
    wait_ready(a.lib, doc)
    b.sync()
    row = b.lib.store.doc(doc)
    assert row is not None and row.status == "failed" and row.error == "indexing failed; see the server log"
    assert [w.name for w in b.lib.workers()] == ["library-indexer", "library-sync"]


def started(state: Path, shared: SharedLibrary) -> tuple[Library, FakeEmbedder]:
    """A box started again on its file, its first sync round done."""
    fake = FakeEmbedder()
    lib = Library(LibraryStore(state, cache=True), DocumentReader(), fake.embed, fake.embed_sync,
                  shared=shared, sync_s=3600)
    lib.start()
    sync = lib.sync
    assert sync is not None
    with sync.synced:
        assert sync.synced.wait_for(lambda: sync.rounds >= 1, timeout=30)
    return lib, fake


def test_a_box_started_again_embeds_only_what_it_left_and_no_box_finished(tmp_path: Path,
                                                                         shared: SharedLibrary) -> None:
    a, b = Box(tmp_path / "a", shared), Box(tmp_path / "b", shared)
    a.fake.gate.clear()
    finished = a.add(OFFICE, "one.txt", "The printer code is 4711.")
    b.sync()
    b.stop()  # box B holds it "indexing"
    a.fake.gate.set()
    wait_ready(a.lib, finished)
    a.lib.indexer.stop()  # box A stops before it embeds the next one
    left = a.add(OFFICE, "two.txt", "The fridge is cleaned on Fridays.")
    a.lib.store.close()
    b2, b_fake = started(tmp_path / "b", shared)
    try:
        ready, waiting = b2.store.doc(finished), b2.store.doc(left)
        assert ready is not None and ready.status == "ready" and b_fake.calls == 0  # box A's embeddings
        assert waiting is not None and waiting.status == "indexing"  # box A's to finish
        a2, a_fake = started(tmp_path / "a", shared)
        try:
            wait_ready(a2, left)
            assert a_fake.calls == 1 and shared.states()[left][1] == "ready"
        finally:
            a2.stop()
    finally:
        b2.stop()


def test_a_box_whose_postgresql_is_away_at_start_searches_its_copy(tmp_path: Path) -> None:
    from helpers.live import free_port

    from appliance.store.postgres import PgDatabase  # psycopg only where it is asked for

    before = Library(LibraryStore(tmp_path), DocumentReader(), FakeEmbedder().embed, FakeEmbedder().embed_sync)
    before.start()
    doc = asyncio.run(before.add(OFFICE, "op", "faq.txt", "text/plain", b"The wifi password is on the fridge.")).id
    wait_ready(before, doc)
    before.stop()
    url = f"postgresql://appliance@127.0.0.1:{free_port()}/appliance"  # nobody listens there
    box, _ = started(tmp_path, SharedLibrary(lambda: PgDatabase(url, (MIGRATIONS,), NAMING)))
    try:
        assert box.sync is not None and "cannot be opened" in box.sync.trouble and box.sync.whole
        assert [f.doc for f in asyncio.run(box.search([OFFICE], "wifi password"))] == [doc]
        with pytest.raises(Unavailable) as refused:
            asyncio.run(box.add(OFFICE, "op", "b.txt", "text/plain", b"more"))
        assert refused.value.status == 503 and refused.value.code == "library_unavailable"
    finally:
        box.stop()


def test_change_numbers_are_taken_in_the_order_they_commit(postgres: str) -> None:
    """A box reading change n must have every change before it: a second writer waits for the
    counter's row until the first commits (a sequence would hand out 2 while 1 is uncommitted)."""
    import psycopg

    from appliance.store.postgres import PgDatabase  # psycopg only where it is asked for

    url = fresh_database(postgres, "ordered")
    first, second, reader = (SharedLibrary(lambda: PgDatabase(url, (MIGRATIONS,), NAMING)) for _ in range(3))
    holding, release = threading.Event(), threading.Event()

    def slow(tx: Tx) -> int:
        n = bump(tx, "lib_first")
        holding.set()
        release.wait(30)
        return n

    one = threading.Thread(target=lambda: first.db.write(slow))
    one.start()
    assert holding.wait(30)
    two = threading.Thread(target=second.delete, args=("lib_second",))
    two.start()
    with psycopg.connect(url, autocommit=True) as watch:
        def waiting() -> bool:
            return watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone() \
                == (1,)
        wait_until(waiting, 30, "the second writer to wait for the counter")
    assert reader.changes(0) == []  # nothing committed yet
    release.set()
    one.join(30)
    two.join(30)
    assert reader.changes(0) == [("lib_first", 1), ("lib_second", 2)]
    for lib in (first, second, reader):
        lib.close()
