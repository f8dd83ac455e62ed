"""The library on PostgreSQL (`database_url`), its source of truth when several boxes share
one: documents' rows, their passages (text, page, place) and embeddings (computed once, by
the box that took the upload). Each box searches a cache of it (store.py's SQLite file, kept
up by sync.py); every upload and delete is written here first.

A change counter orders the changes: each write takes the next number from a one-row table
(the row stays locked until it commits), so numbers commit in order and a box that has seen
change n has seen every change before it; `library_changes` keeps each document's last.

Why not PostgreSQL's own search: its text search has no Chinese parser (a Chinese question
would find nothing), pgvector is an extension an office's Debian PostgreSQL does not have,
and a box whose database is away would search nothing. Here the search stays the box's own
(FTS5 and the vectors in RAM), as without database_url, and keeps working in an outage.

The statements are portable (store/database.py): the tests run them on SQLite too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from appliance.library.passages import Passage
from appliance.library.store import COLUMNS, DocRow, check_room, doc_row
from appliance.store.database import Database, Tx
from appliance.store.migrations import Migrations

DOCS = "library_documents"
MIGRATIONS = Migrations("library", ((
    f"""CREATE TABLE {DOCS} (id TEXT PRIMARY KEY, scope TEXT NOT NULL, title TEXT NOT NULL, name TEXT NOT NULL,
       kind TEXT NOT NULL, size BIGINT NOT NULL, pages INTEGER, chars BIGINT NOT NULL, truncated INTEGER NOT NULL,
       passages INTEGER NOT NULL, indexed INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, error TEXT,
       added_at DOUBLE PRECISION NOT NULL, added_by TEXT NOT NULL, gen BIGINT NOT NULL)""",
    f"CREATE INDEX {DOCS}_scope ON {DOCS} (scope, added_at)",
    f"""CREATE TABLE library_passages (doc TEXT NOT NULL REFERENCES {DOCS} (id) ON DELETE CASCADE,
       seq INTEGER NOT NULL, page INTEGER, text TEXT NOT NULL, vec BYTEA, PRIMARY KEY (doc, seq))""",
    "CREATE TABLE library_counter (n BIGINT NOT NULL)",
    "INSERT INTO library_counter VALUES (0)",
    "CREATE TABLE library_changes (doc TEXT PRIMARY KEY, n BIGINT NOT NULL)",
    "CREATE INDEX library_changes_n ON library_changes (n)",
),))
CHANGES_AT_ONCE = 500  # changes a sync takes at a time (a box off for a week catches up in turns)


@dataclass(frozen=True, slots=True)
class Copy:
    """A document as PostgreSQL holds it: its row, generation (the change that added this
    file), passages and their embeddings (None: not made yet)."""

    row: DocRow
    gen: int
    passages: list[Passage]
    vecs: list[bytes | None]


def bump(tx: Tx, doc: str) -> int:
    """The next change number, for `doc`. Every write takes it first: the counter's row lock
    then orders it after every write that took one before (and what it reads next is theirs)."""
    r = tx.one("UPDATE library_counter SET n = n + 1 RETURNING n")
    assert r is not None
    tx.run("INSERT INTO library_changes (doc, n) VALUES (?, ?) ON CONFLICT (doc) DO UPDATE SET n = excluded.n",
           (doc, int(r[0])))
    return int(r[0])


class SharedLibrary:
    """The library's tables on the shared database, connected on first use (and again after
    an outage): a box whose PostgreSQL is away starts and searches its cache."""

    def __init__(self, connect: Callable[[], Database]) -> None:
        self._connect = connect
        self._db: Database | None = None
        self._lock = threading.Lock()

    @property
    def db(self) -> Database:
        with self._lock:
            if self._db is None:
                self._db = self._connect()  # a StoreError (a 503) while it cannot be reached
            return self._db

    @property
    def trouble(self) -> str:
        return self._db.trouble if self._db is not None else ""

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def add(self, row: DocRow, passages: list[Passage], replace: bool, room: tuple[int, int]) -> int:
        """A new document (replace: the same id's new file) waiting for its embeddings, the
        scope's room checked in the same transaction; its generation."""
        def put(tx: Tx) -> int:
            gen = bump(tx, row.id)
            check_room(tx, row, len(passages), room, DOCS)
            if replace:
                tx.run(f"DELETE FROM {DOCS} WHERE id = ?", (row.id,))  # its passages with it
            tx.run(f"INSERT INTO {DOCS} ({COLUMNS}, gen) VALUES ({', '.join('?' * 16)})",
                   (row.id, row.scope, row.title, row.name, row.kind, row.size, row.pages, row.chars,
                    int(row.truncated), row.passages, 0, row.status, row.error, row.added_at, row.added_by, gen))
            for p in passages:
                tx.run("INSERT INTO library_passages (doc, seq, page, text) VALUES (?, ?, ?, ?)",
                       (row.id, p.seq, p.page, p.text))
            return gen
        return self.db.write(put)

    def delete(self, doc: str) -> None:
        def drop(tx: Tx) -> None:
            bump(tx, doc)
            tx.run(f"DELETE FROM {DOCS} WHERE id = ?", (doc,))
        self.db.write(drop)

    def count(self, scope: str) -> tuple[int, int]:
        """The scope's documents and passages, on every box."""
        r = self.db.read(lambda tx: tx.one(
            f"SELECT count(*), coalesce(sum(passages), 0) FROM {DOCS} WHERE scope = ?", (scope,)))
        return (int(r[0]), int(r[1])) if r is not None else (0, 0)

    def publish(self, doc: str, gen: int, vecs: Sequence[tuple[int, bytes]]) -> bool:
        """The embeddings of generation `gen` of the document, by passage place; ready once
        every passage has one. False: the document was replaced or deleted meanwhile (that
        change is the truth, and these embeddings are of a file no longer there)."""
        def put(tx: Tx) -> bool:
            bump(tx, doc)
            if tx.one(f"SELECT 1 FROM {DOCS} WHERE id = ? AND gen = ?", (doc, gen)) is None:
                return False
            for seq, vec in vecs:
                tx.run("UPDATE library_passages SET vec = ? WHERE doc = ? AND seq = ?", (vec, doc, seq))
            tx.run(f"UPDATE {DOCS} SET indexed = (SELECT count(*) FROM library_passages WHERE doc = ? AND vec IS NOT "
                   "NULL) WHERE id = ?", (doc, doc))
            tx.run(f"UPDATE {DOCS} SET status = 'ready', error = NULL WHERE id = ? AND indexed = passages", (doc,))
            return True
        return self.db.write(put)

    def finish(self, doc: str, gen: int, status: str, error: str | None) -> None:
        """Generation `gen`'s end other than ready (its file failed to embed)."""
        def put(tx: Tx) -> None:
            bump(tx, doc)
            tx.run(f"UPDATE {DOCS} SET status = ?, error = ? WHERE id = ? AND gen = ?", (status, error, doc, gen))
        self.db.write(put)

    def last(self) -> int:
        """The last change's number."""
        return int((self.db.read(lambda tx: tx.one("SELECT n FROM library_counter")) or (0,))[0])

    def changes(self, after: int) -> list[tuple[str, int]]:
        """The documents changed since change `after`, each with its last change, oldest first."""
        return [(str(r[0]), int(r[1])) for r in self.db.read(lambda tx: tx.all(
            "SELECT doc, n FROM library_changes WHERE n > ? ORDER BY n LIMIT ?", (after, CHANGES_AT_ONCE)))]

    def states(self, doc: str | None = None) -> dict[str, tuple[int, str]]:
        """Every document's (or that one's) generation and status."""
        where, params = ("WHERE id = ?", (doc,)) if doc is not None else ("", ())
        return {str(r[0]): (int(r[1]), str(r[2])) for r in self.db.read(lambda tx: tx.all(
            f"SELECT id, gen, status FROM {DOCS} {where}", params))}

    def copy(self, doc: str) -> Copy | None:
        def get(tx: Tx) -> Copy | None:
            r = tx.one(f"SELECT {COLUMNS}, gen FROM {DOCS} WHERE id = ?", (doc,))
            if r is None:
                return None
            rows = tx.all("SELECT seq, page, text, vec FROM library_passages WHERE doc = ? ORDER BY seq", (doc,))
            return Copy(doc_row(r[:15]), int(r[15]), [Passage(int(p[0]), p[1], str(p[2])) for p in rows],
                        [None if p[3] is None else bytes(p[3]) for p in rows])
        return self.db.read(get)
