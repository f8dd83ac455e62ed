"""The library's database: documents, their passages, and each passage's embedding, in one
SQLite file in state_dir (library.sqlite3: WAL, 0600, migrated on open; store/sqlite.py).
Words are searched with FTS5, in one table per scope (the office's, and each person's own),
so that one person's documents never weigh in another's ranking: bm25's word weights are
counted per table. Each scope has two: its words by their stem (terms_*: policy finds
policies) and as written (exact_*: AED, A4, VPN, which the porter stemmer cuts to "a" or
would let a plural match). With database_url the file is the box's copy of the library
PostgreSQL holds (shared.py), kept by sync.py: searched here, changed there first."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from appliance.library.passages import Passage, terms
from appliance.store.database import Naming, Tx
from appliance.store.migrations import Migrations
from appliance.store.sqlite import SqliteDatabase

FILE_NAME = "library.sqlite3"
OFFICE = "office"  # the scope of documents the operator adds for everyone
MIGRATIONS = Migrations("library", ((
    """CREATE TABLE documents (id TEXT PRIMARY KEY, scope TEXT NOT NULL, title TEXT NOT NULL, name TEXT NOT NULL,
       kind TEXT NOT NULL, size INTEGER NOT NULL, pages INTEGER, chars INTEGER NOT NULL, truncated INTEGER NOT NULL,
       passages INTEGER NOT NULL, indexed INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, error TEXT,
       added_at REAL NOT NULL, added_by TEXT NOT NULL)""",
    "CREATE INDEX documents_scope ON documents (scope, added_at)",
    # AUTOINCREMENT: a passage id is never used again, so an id held anywhere (a search's
    # embeddings, a replaced document's) can never name another person's passage.
    """CREATE TABLE passages (id INTEGER PRIMARY KEY AUTOINCREMENT, doc TEXT NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
       seq INTEGER NOT NULL, page INTEGER, text TEXT NOT NULL, vec BLOB)""",
    "CREATE INDEX passages_doc ON passages (doc, seq)",
), (
    # Each scope's words as written (exact_*) beside its stemmed ones (terms_*): a table's name
    # is a hash SQL cannot make, so this step leaves a note and the store, once open, builds
    # the tables from the stemmed ones' words (_build_written) and drops the note.
    "CREATE TABLE build_written (what TEXT)",
    "INSERT INTO build_written VALUES ('exact_* from terms_*')",
)))
# With database_url the file is the box's cache of the library PostgreSQL holds (shared.py,
# sync.py): which generation of each document it holds from there (a document added before
# database_url has none and stays this box's own) and the last change it has taken. Made
# when a box first runs with database_url (IF NOT EXISTS: every start), so without it the
# file is what it always was; older code opening it leaves the two tables alone (deleting a
# document deletes its row here too: foreign keys are on in every connection of ours).
_CACHE = (
    "CREATE TABLE IF NOT EXISTS shared (doc TEXT PRIMARY KEY REFERENCES documents (id) ON DELETE CASCADE, "
    "gen INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shared_seen (n INTEGER NOT NULL)",
    "INSERT INTO shared_seen SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM shared_seen)",
)
# A failed read and a failed write, as the routes answer them (a 503 either way).
NAMING = Naming("library", read_code="library_unavailable", write_code="library_not_writable")
COLUMNS = "id, scope, title, name, kind, size, pages, chars, truncated, passages, indexed, status, error, added_at, added_by"


def person_scope(person_id: str) -> str:
    return "person:" + person_id


def _table(scope: str, written: bool = False) -> str:
    """The scope's FTS5 table of stemmed words (or of words as written): a name made of hex
    digits only, never of what a client sent."""
    name = "office" if scope == OFFICE else hashlib.sha256(scope.encode()).hexdigest()[:24]
    return ("exact_" if written else "terms_") + name


# The words as written: unicode61 alone. Contentless (content=''): the stemmed table holds the
# same words, which is what a delete hands back, so they are not stored a second time.
_WRITTEN = "fts5(words, content = '', tokenize = 'unicode61')"
_SCOPE_TABLE = re.compile(r"terms_(office|[0-9a-f]{24})")
# The porter stemmer as FTS5 has it, in memory: which question words it would mangle.
_STEMMER = Migrations("stems", ((
    "CREATE VIRTUAL TABLE words USING fts5(word, tokenize = 'porter unicode61')",
    "CREATE VIRTUAL TABLE stems USING fts5vocab(words, 'instance')",
),))


def _build_written(tx: Tx) -> None:
    """Migration 2, its second half: each scope's words-as-written table, from the words its
    stemmed table holds (once: the note goes in the same transaction)."""
    if tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'build_written'") is None:
        return
    for (table,) in tx.all("SELECT name FROM sqlite_master WHERE type = 'table'"):
        if _SCOPE_TABLE.fullmatch(table):
            written = "exact_" + table.removeprefix("terms_")
            tx.run(f"DROP TABLE IF EXISTS {written}")
            tx.run(f"CREATE VIRTUAL TABLE {written} USING {_WRITTEN}")
            tx.run(f"INSERT INTO {written} (rowid, words) SELECT rowid, words FROM {table}")
    tx.run("DROP TABLE build_written")


def _match(words: Sequence[str], op: str) -> str:
    # Each word quoted: only letters and digits reach here (passages.terms), never FTS5 syntax;
    # any of them (OR) or every one (AND).
    return f" {op} ".join('"' + w.replace('"', "") + '"' for w in dict.fromkeys(words))


def _asked(tx: Tx, scope: str, words: Sequence[str], written: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The scope's tables to match and the words for each: by stem in the stemmed table, as
    written in the other; none when the scope has no table yet."""
    table, exact = _table(scope), _table(scope, written=True)
    if not tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)):
        return []
    asked = [(table, list(words)), (exact, list(written))]
    if not tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (exact,)):
        asked = [(table, [*words, *written])]  # not built: opened read-only since migrated
    return [(t, w) for t, w in asked if w]


def _prefixes(chars: Sequence[str]) -> str:
    # A CJK character, never FTS5 syntax (passages.characters), as the first of any pair.
    return " OR ".join(f'"{c}"*' for c in dict.fromkeys(chars))


@dataclass(frozen=True, slots=True)
class DocRow:
    id: str
    scope: str
    title: str
    name: str
    kind: str
    size: int
    pages: int | None
    chars: int
    truncated: bool
    passages: int
    indexed: int
    status: str  # "indexing", "ready" or "failed"
    error: str | None
    added_at: float
    added_by: str

    def to_json(self) -> dict[str, Any]:
        """As the API shows it: the scope as "office" or "own" (a person id is nobody's business)."""
        body = asdict(self)
        body["scope"] = OFFICE if self.scope == OFFICE else "own"
        body["added_at"] = int(self.added_at)
        return body


@dataclass(frozen=True, slots=True)
class Found:
    """A passage as a chat cites it."""

    id: int
    doc: str
    title: str
    page: int | None
    text: str
    near: float | None = None  # its cosine to the question searched (None: not searched by meaning)


class NoRoom(Exception):
    """The scope holds its most documents (docs) or has no room for the passages (passages)."""

    def __init__(self, what: str, have: int, most: int) -> None:
        super().__init__(what)
        self.what, self.have, self.most = what, have, most


def check_room(tx: Tx, row: DocRow, passages: int, room: tuple[int, int], table: str = "documents") -> None:
    r = tx.one(f"SELECT count(*), coalesce(sum(passages), 0) FROM {table} WHERE scope = ? AND id != ?",
               (row.scope, row.id))
    docs, held = (int(r[0]), int(r[1])) if r is not None else (0, 0)
    if docs >= room[0]:
        raise NoRoom("documents", docs, room[0])
    if held + passages > room[1]:
        raise NoRoom("passages", held, room[1])


def doc_row(r: Sequence[Any]) -> DocRow:
    return DocRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]), r[9], r[10], r[11], r[12], r[13], r[14])


class LibraryStore:
    """Every read and write of the library's file, each one transaction."""

    def __init__(self, state_dir: Path | None, cache: bool = False) -> None:
        """cache: the file is this box's cache of PostgreSQL's library (database_url)."""
        self.db = SqliteDatabase(state_dir, FILE_NAME, MIGRATIONS, NAMING)
        if not self.db.read_only:  # read-only, an older file is searched by stems alone
            self.db.write(_build_written)
            if cache:
                self.db.write(lambda tx: [tx.run(sql) for sql in _CACHE])
        self._stemmer = SqliteDatabase(None, "stems", _STEMMER, NAMING)

    @property
    def trouble(self) -> str:
        return self.db.trouble

    @property
    def read_only(self) -> bool:
        """Opened read-only (the disk was at start-up): no change can be saved until a restart."""
        return self.db.read_only

    def close(self) -> None:
        self.db.close()
        self._stemmer.close()

    def _terms_table(self, tx: Tx, scope: str) -> str:
        """The scope's table, made in this transaction if it is not there (never remembered
        outside it: a transaction rolled back takes a new table with it)."""
        table, written = _table(scope), _table(scope, written=True)
        # porter: English words by their stem (policy, policies); CJK pairs pass unchanged.
        tx.run(f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5(words, tokenize = 'porter unicode61')")
        tx.run(f"CREATE VIRTUAL TABLE IF NOT EXISTS {written} USING {_WRITTEN}")
        return table

    def _put_passages(self, tx: Tx, doc: str, scope: str, passages: list[Passage],
                      vecs: Sequence[bytes | None] = ()) -> None:
        table, written = self._terms_table(tx, scope), _table(scope, written=True)
        for p, vec in zip(passages, vecs or [None] * len(passages)):
            tx.run("INSERT INTO passages (doc, seq, page, text, vec) VALUES (?, ?, ?, ?, ?)",
                   (doc, p.seq, p.page, p.text, vec))
            row = tx.one("SELECT last_insert_rowid()")
            assert row is not None
            words = " ".join(terms(p.text))
            tx.run(f"INSERT INTO {table} (rowid, words) VALUES (?, ?)", (row[0], words))
            tx.run(f"INSERT INTO {written} (rowid, words) VALUES (?, ?)", (row[0], words))

    def _drop_passages(self, tx: Tx, doc: str, scope: str) -> None:
        table, written = self._terms_table(tx, scope), _table(scope, written=True)
        # A contentless table forgets a row by being told its words: the stemmed table's.
        tx.run(f"INSERT INTO {written} ({written}, rowid, words) SELECT 'delete', rowid, words FROM {table} "
               "WHERE rowid IN (SELECT id FROM passages WHERE doc = ?)", (doc,))
        tx.run(f"DELETE FROM {table} WHERE rowid IN (SELECT id FROM passages WHERE doc = ?)", (doc,))
        tx.run("DELETE FROM passages WHERE doc = ?", (doc,))

    def _put(self, tx: Tx, row: DocRow, passages: list[Passage], gen: int | None,
             vecs: Sequence[bytes | None] = ()) -> None:
        """The row and its passages (vecs: their embeddings, PostgreSQL's copy; none: a new file's)."""
        tx.run(f"INSERT INTO documents ({COLUMNS}) VALUES ({', '.join('?' * 15)})",
               (row.id, row.scope, row.title, row.name, row.kind, row.size, row.pages, row.chars,
                int(row.truncated), row.passages, row.indexed if vecs else 0, row.status, row.error, row.added_at, row.added_by))
        self._put_passages(tx, row.id, row.scope, passages, vecs)
        if gen is not None:
            tx.run("INSERT INTO shared (doc, gen) VALUES (?, ?)", (row.id, gen))

    def add(self, row: DocRow, passages: list[Passage], replace: bool = False,
            room: tuple[int, int] | None = None, gen: int | None = None) -> DocRow:
        """A new document (or, replace: the same id's new file), its passages searchable by
        their words at once and waiting for their embeddings. room: the scope's most documents
        and passages, checked in the same transaction (two uploads at once cannot both pass).
        gen: the generation PostgreSQL gave it (database_url)."""
        def put(tx: Tx) -> DocRow:
            if room is not None:
                check_room(tx, row, len(passages), room)
            if replace:
                self._drop_passages(tx, row.id, row.scope)
                tx.run("DELETE FROM documents WHERE id = ?", (row.id,))
            self._put(tx, row, passages, gen)
            return row
        return self.db.write(put)

    def mirror(self, row: DocRow, gen: int, passages: list[Passage], vecs: list[bytes | None]) -> None:
        """PostgreSQL's copy of a document (its status and embeddings as they are there) in
        place of what this box held of it."""
        def put(tx: Tx) -> None:
            held = tx.one("SELECT scope FROM documents WHERE id = ?", (row.id,))
            if held is not None:
                self._drop_passages(tx, row.id, str(held[0]))
                tx.run("DELETE FROM documents WHERE id = ?", (row.id,))
            self._put(tx, row, passages, gen, vecs)
        self.db.write(put)

    def mirrored(self, doc: str | None = None) -> dict[str, tuple[int, str]]:
        """The documents this box holds from PostgreSQL (or that one): their generation and status."""
        where, params = ("WHERE s.doc = ?", (doc,)) if doc is not None else ("", ())
        return {str(r[0]): (int(r[1]), str(r[2])) for r in self.db.read(lambda tx: tx.all(
            f"SELECT s.doc, s.gen, d.status FROM shared s JOIN documents d ON d.id = s.doc {where}", params))}

    def seen(self) -> int:
        """The last change to PostgreSQL's library this box has taken."""
        return int((self.db.read(lambda tx: tx.one("SELECT max(n) FROM shared_seen")) or (0,))[0] or 0)

    def set_seen(self, n: int) -> None:
        self.db.write(lambda tx: tx.run("UPDATE shared_seen SET n = ?", (n,)))

    def embedded(self, doc: str) -> list[tuple[int, bytes | None]]:
        """The document's passages by their place (seq) and their embeddings (None: not yet)."""
        return [(int(r[0]), None if r[1] is None else bytes(r[1])) for r in self.db.read(lambda tx: tx.all(
            "SELECT seq, vec FROM passages WHERE doc = ? ORDER BY seq", (doc,)))]

    def delete(self, doc: DocRow) -> bool:
        def drop(tx: Tx) -> bool:
            self._drop_passages(tx, doc.id, doc.scope)
            return tx.run("DELETE FROM documents WHERE id = ?", (doc.id,)) > 0
        return self.db.write(drop)

    def doc(self, doc_id: str) -> DocRow | None:
        r = self.db.read(lambda tx: tx.one(f"SELECT {COLUMNS} FROM documents WHERE id = ?", (doc_id,)))
        return doc_row(r) if r is not None else None

    def docs(self, scopes: Sequence[str]) -> list[DocRow]:
        marks = ", ".join("?" * len(scopes))
        rows = self.db.read(lambda tx: tx.all(
            f"SELECT {COLUMNS} FROM documents WHERE scope IN ({marks}) ORDER BY added_at, id", tuple(scopes)))
        return [doc_row(r) for r in rows]

    def count(self, scope: str) -> tuple[int, int]:
        """The scope's documents and passages."""
        r = self.db.read(lambda tx: tx.one(
            "SELECT count(*), coalesce(sum(passages), 0) FROM documents WHERE scope = ?", (scope,)))
        return (int(r[0]), int(r[1])) if r is not None else (0, 0)

    def pending(self) -> list[str]:
        """Documents whose embeddings are not all made (a restart took the indexer mid-way)."""
        return [r[0] for r in self.db.read(lambda tx: tx.all(
            "SELECT id FROM documents WHERE status = 'indexing' ORDER BY added_at"))]

    def unembedded(self, doc: str, limit: int) -> list[tuple[int, str]]:
        return [(int(r[0]), str(r[1])) for r in self.db.read(lambda tx: tx.all(
            "SELECT id, text FROM passages WHERE doc = ? AND vec IS NULL ORDER BY seq LIMIT ?", (doc, limit)))]

    def set_vectors(self, doc: str, vectors: list[tuple[int, bytes]]) -> int:
        """Store embeddings made; the document's count of embedded passages (a passage gone
        meanwhile, its document replaced or deleted, is simply not there to update)."""
        def put(tx: Tx) -> int:
            for pid, vec in vectors:
                tx.run("UPDATE passages SET vec = ? WHERE id = ? AND doc = ?", (vec, pid, doc))
            tx.run("UPDATE documents SET indexed = (SELECT count(*) FROM passages WHERE doc = ? AND vec IS NOT NULL) "
                   "WHERE id = ?", (doc, doc))
            r = tx.one("SELECT indexed FROM documents WHERE id = ?", (doc,))
            return int(r[0]) if r is not None else -1
        return self.db.write(put)

    def finish_if_complete(self, doc: str) -> bool:
        """Mark the document ready if every passage it has now has its embedding (in one
        transaction: a replacement that came in meanwhile has passages without)."""
        return self.db.write(lambda tx: tx.run(
            "UPDATE documents SET status = 'ready', error = NULL WHERE id = ? AND status = 'indexing' AND NOT EXISTS "
            "(SELECT 1 FROM passages WHERE doc = ? AND vec IS NULL)", (doc, doc))) > 0

    def finish(self, doc: str, status: str, error: str | None = None) -> None:
        self.db.write(lambda tx: tx.run("UPDATE documents SET status = ?, error = ? WHERE id = ?", (status, error, doc)))

    def vectors(self, doc: str | None = None) -> list[tuple[int, str, str, bytes]]:
        """(passage, document, scope, embedding) of ready documents (or of one document)."""
        where, params = ("AND d.id = ?", (doc,)) if doc is not None else ("", ())
        return [(int(r[0]), str(r[1]), str(r[2]), bytes(r[3])) for r in self.db.read(lambda tx: tx.all(
            "SELECT p.id, p.doc, d.scope, p.vec FROM passages p JOIN documents d ON d.id = p.doc "
            f"WHERE d.status = 'ready' AND p.vec IS NOT NULL {where} ORDER BY p.id", params))]

    def _stems(self, words: list[str]) -> list[str]:
        def stem(tx: Tx) -> list[tuple[Any, ...]]:
            for i, w in enumerate(words):
                tx.run("INSERT INTO words (rowid, word) VALUES (?, ?)", (i, w))
            rows = tx.all("SELECT doc, term FROM stems WHERE \"offset\" = 0")
            tx.run("DELETE FROM words")
            return rows
        got = dict(self._stemmer.write(stem)) if words else {}
        return [str(got.get(i, w)) for i, w in enumerate(words)]

    def forms(self, words: list[str], codes: list[str]) -> tuple[list[str], list[str]]:
        """The words to search by their stem, and those to search as written: a code the
        stemmer changes (AED -> "a", SMS -> "sm") and a word it cuts to one or two letters
        (aed -> "a", its -> "it"); the stem would match words the question never asked."""
        written = [w for w, s in zip(words, self._stems(words)) if s != w and (w in codes or len(s) <= 2)]
        return [w for w in words if w not in written], written

    def keyword(self, scope: str, words: list[str], limit: int, written: Sequence[str] = ()) -> list[int]:
        """The scope's passages holding any of the words (by stem) or of `written` (as written),
        best first: the two bm25 summed, which is one query's bm25 over both (bm25 adds each
        word's share, and both tables hold the same words, so the same lengths)."""
        def find(tx: Tx) -> list[int]:
            asked = _asked(tx, scope, words, written)
            if not asked:
                return []
            union = " UNION ALL ".join(f"SELECT rowid, rank AS s FROM {t} WHERE {t} MATCH ?" for t, _ in asked)
            return [int(r[0]) for r in tx.all(
                f"SELECT rowid FROM ({union}) GROUP BY rowid ORDER BY sum(s), rowid LIMIT ?",
                (*(_match(w, "OR") for _, w in asked), limit))]
        return self.db.read(find)

    def holds_all(self, scope: str, words: Sequence[str], written: Sequence[str] = ()) -> bool:
        """Whether one of the scope's passages holds every word (by stem) and every word of
        `written` (as written): one FTS5 AND query a table, their rowids intersected."""
        def find(tx: Tx) -> bool:
            asked = _asked(tx, scope, words, written)
            if not asked:
                return False
            both = " INTERSECT ".join(f"SELECT rowid FROM {t} WHERE {t} MATCH ?" for t, _ in asked)
            return tx.one(f"{both} LIMIT 1", tuple(_match(w, "AND") for _, w in asked)) is not None
        return bool(self.db.read(find))

    def characters(self, scope: str, chars: Sequence[str], limit: int) -> list[int]:
        """The scope's passages holding any of the CJK characters, best first (bm25): each
        matched as the first of a pair (a prefix query on the stemmed table, whose CJK words
        are the pairs as written), so the passages' single characters are searched with no
        table of their own; a run's last character is found only where a pair starts with it."""
        def find(tx: Tx) -> list[int]:
            table = _table(scope)
            if not chars or not tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)):
                return []
            return [int(r[0]) for r in tx.all(
                f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rank, rowid LIMIT ?",
                (_prefixes(chars), limit))]
        return self.db.read(find)

    def found(self, ids: Sequence[int], scopes: Sequence[str]) -> dict[int, Found]:
        """The passages among `ids` that are in one of `scopes` (never another's, whatever ids
        a caller holds)."""
        marks, scope_marks = ", ".join("?" * len(ids)), ", ".join("?" * len(scopes))
        rows = self.db.read(lambda tx: tx.all(
            "SELECT p.id, p.doc, d.title, p.page, p.text FROM passages p JOIN documents d ON d.id = p.doc "
            f"WHERE p.id IN ({marks}) AND d.scope IN ({scope_marks})", (*ids, *scopes))) if ids and scopes else []
        return {int(r[0]): Found(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows}
