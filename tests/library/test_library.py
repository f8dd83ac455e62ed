"""The library on a fake embedding model (words hashed into a vector) and the real document
reader: passages cut at pages, words and meaning fused, scopes kept apart, documents added,
replaced, deleted and taken up again after a restart, and a read-only disk refused clearly;
codes and short words matched as written (AED, A4, VPN, B2) beside the stemmed words, and a
library file written before they were (version 1) opened with nothing lost."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.documents import pdf_bytes
from helpers.embedding import HANDBOOK, FakeEmbedder, fake_vectors, wait_ready

from appliance.documents.document import Document
from appliance.documents.reader import DocumentReader
from appliance.errors import Conflict, PayloadTooLarge, Unavailable
from appliance.library.cite import question_of, sources, with_sources
from appliance.library.library import Library, LibraryLimits, fuse
from appliance.library.passages import codes, html_text, split, terms
from appliance.library.store import FILE_NAME, MIGRATIONS, OFFICE, LibraryStore, person_scope
from appliance.store import sqlite as db


def make(state: Path | None, limits: LibraryLimits | None = None) -> tuple[Library, FakeEmbedder]:
    fake = FakeEmbedder()
    lib = Library(LibraryStore(state), DocumentReader(), fake.embed, fake.embed_sync, limits, clock=lambda: 1000.0)
    lib.start()
    return lib, fake


def test_a_pdf_is_cut_into_passages_each_on_one_page() -> None:
    text = "\n\n".join(HANDBOOK)
    starts, at = [], 0
    for n, page in enumerate(HANDBOOK, 1):
        starts.append((n, at))
        at += len(page) + 2
    doc = Document("pdf", text, 10, len(text), False, starts)
    passages = split(doc)
    linden = [p for p in passages if "Linden" in p.text]
    assert [p.page for p in linden] == [7]
    assert all(p.page is not None for p in passages) and len({p.page for p in passages}) == 10


def test_chinese_is_searched_by_character_pairs_and_html_by_its_text() -> None:
    assert terms("三月会议 chose Nordlicht") == ["三月", "月会", "会议", "chose", "nordlicht"]
    assert html_text("<p>One &amp; two</p><script>alert(1)</script><div>Three</div>") == "One & two\n\nThree"


def test_fusion_ranks_what_both_lists_agree_on_first() -> None:
    assert fuse([[1, 2, 3], [3, 1, 4]]) == [1, 3, 2, 4]
    assert fuse([]) == []


def test_sources_go_into_the_last_user_message_only() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where do we gather?"}]
    from appliance.library.store import Found
    found = [Found(1, "lib_x", "Handbook", 7, "The assembly point is behind the Linden bakery.")]
    out = with_sources(messages, found)
    assert out[0] == messages[0] and "[1] Handbook, page 7:" in out[1]["content"]
    assert out[1]["content"].endswith("Question: Where do we gather?")
    assert sources(found)[0] == {"n": 1, "document": "lib_x", "title": "Handbook", "page": 7,
                                 "text": "The assembly point is behind the Linden bakery."}
    assert question_of([{"role": "assistant", "content": "hi"}]) is None


def test_a_pdf_is_found_by_words_at_once_and_by_meaning_once_indexed(tmp_path: Path) -> None:
    lib, fake = make(tmp_path)
    fake.gate.clear()  # the indexer waits: only words find it yet
    try:
        row = asyncio.run(lib.add(OFFICE, "the operator", "handbook.pdf", "application/pdf", pdf_bytes(HANDBOOK)))
        assert row.status == "indexing" and row.pages == 10 and row.kind == "pdf"
        found = asyncio.run(lib.search([OFFICE], "Linden bakery"))
        assert found and found[0].page == 7 and found[0].title == "handbook"
        fake.gate.set()
        wait_ready(lib, row.id)
        ready = lib.store.doc(row.id)
        assert ready is not None and ready.status == "ready" and ready.indexed == ready.passages == row.passages
        assert len(lib.vectors) == row.passages
        found = asyncio.run(lib.search([OFFICE], "where is the assembly point for emergencies?"))
        assert found[0].page == 7
    finally:
        lib.stop()


def test_a_persons_own_document_is_never_found_for_anyone_else(tmp_path: Path) -> None:
    lib, _ = make(tmp_path)
    try:
        ann, ben = person_scope("ann"), person_scope("ben")
        own = asyncio.run(lib.add(ben, "Ben", "notes.txt", "text/plain", b"Codename Bluefinch: my salary review."))
        wait_ready(lib, own.id)
        assert asyncio.run(lib.search([OFFICE, ann], "Bluefinch salary review")) == []
        assert [f.doc for f in asyncio.run(lib.search([OFFICE, ben], "Bluefinch salary review"))] == [own.id]
        assert lib.document(own.id, ann) is None and lib.document(own.id, OFFICE) is None
        assert [d.id for d in lib.documents([OFFICE, ann])] == []
        # Words are ranked per scope: Ben's file is in a table of its own, not the office's.
        assert lib.store.keyword(OFFICE, ["bluefinch"], 5) == []
    finally:
        lib.stop()


def test_replace_and_delete_leave_nothing_of_the_old_file(tmp_path: Path) -> None:
    lib, _ = make(tmp_path)
    try:
        row = asyncio.run(lib.add(OFFICE, "op", "menu.md", "text/markdown", b"# Menu\n\nSoup of the day: tomato."))
        wait_ready(lib, row.id)
        new = asyncio.run(lib.add(OFFICE, "op", "menu.md", "text/markdown", b"# Menu\n\nSoup of the day: lentil.",
                                  replacing=row))
        assert new.id == row.id and new.kind == "markdown"
        wait_ready(lib, row.id)
        texts = [f.text for f in asyncio.run(lib.search([OFFICE], "soup of the day"))]
        assert texts and all("lentil" in t for t in texts) and not any("tomato" in t for t in texts)
        asyncio.run(lib.delete(new))
        assert lib.documents([OFFICE]) == [] and len(lib.vectors) == 0
        assert asyncio.run(lib.search([OFFICE], "soup lentil")) == []
    finally:
        lib.stop()


def test_the_library_is_bounded_before_a_file_is_read(tmp_path: Path) -> None:
    lib, _ = make(tmp_path, LibraryLimits(person_documents=1, person_passages=3))
    me = person_scope("ann")
    try:
        asyncio.run(lib.add(me, "Ann", "a.txt", "text/plain", b"one short note"))
        with pytest.raises(Conflict, match="delete one first"):
            asyncio.run(lib.add(me, "Ann", "b.txt", "text/plain", b"another"))
        big = "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(10)).encode()
        with pytest.raises(PayloadTooLarge, match="room for"):
            asyncio.run(lib.add(person_scope("cat"), "Cat", "big.txt", "text/plain", big))
    finally:
        lib.stop()


def test_a_restart_takes_up_the_documents_it_had_not_finished(tmp_path: Path) -> None:
    lib, fake = make(tmp_path)
    fake.gate.clear()
    row = asyncio.run(lib.add(OFFICE, "op", "faq.txt", "text/plain", b"The wifi password is on the fridge."))
    fake.gate.set()
    lib.indexer.stop()  # may or may not have finished: the next start must finish it either way
    lib.store.close()
    again, _ = make(tmp_path)
    try:
        wait_ready(again, row.id)
        found = asyncio.run(again.search([OFFICE], "wifi password"))
        assert [f.doc for f in found] == [row.id] and len(again.vectors) >= 1
    finally:
        again.stop()


def test_a_read_only_library_refuses_changes_and_still_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib, _ = make(tmp_path)
    row = asyncio.run(lib.add(OFFICE, "op", "faq.txt", "text/plain", b"The wifi password is on the fridge."))
    wait_ready(lib, row.id)
    lib.stop()

    def read_only_disk(*_: object) -> Path:  # what opening the file for writing meets on a failed SD card
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(db, "private_file", read_only_disk)
    ro, _ = make(tmp_path)
    try:
        assert "read-only" in ro.store.trouble
        assert [f.doc for f in asyncio.run(ro.search([OFFICE], "wifi password"))] == [row.id]
        assert [d.id for d in ro.documents([OFFICE])] == [row.id]
        with pytest.raises(Unavailable, match="cannot be changed"):
            asyncio.run(ro.add(OFFICE, "op", "b.txt", "text/plain", b"more"))
        with pytest.raises(Unavailable, match="cannot be changed"):
            asyncio.run(ro.delete(row))
    finally:
        ro.stop()


def test_the_library_reads_files_in_a_niced_worker() -> None:
    from appliance.config import Config
    from appliance.ops.library import library_reader

    limits = library_reader(Config()).limits
    assert limits.nice == 10 and limits.max_chars == 2_000_000 and limits.wall_s >= 120
    code = ("import os; from appliance.documents.document import DocumentLimits; "
            "from appliance.documents.worker import apply_limits; "
            "before = os.nice(0); apply_limits(DocumentLimits(nice=10)); print(os.nice(0) - before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "10"


def test_while_the_chats_run_indexing_takes_a_tenth_of_a_core() -> None:
    from appliance.library.indexer import BATCH, BUSY_BATCH, SHARE, Indexer
    from appliance.library.vectors import Vectors

    store = LibraryStore(None)
    lib = Library(store, DocumentReader(), FakeEmbedder().embed, fake_vectors)
    row = asyncio.run(lib.add(OFFICE, "op", "a.txt", "text/plain",
                              "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(8)).encode()))
    now = [0.0]
    sizes: list[int] = []

    def embed(texts: list[str]) -> np.ndarray:  # each text "takes" 0.05 s of the injected clock
        sizes.append(len(texts))
        now[0] += 0.05 * len(texts)
        return fake_vectors(texts)

    busy = [True]
    indexer = Indexer(store, Vectors(), embed, busy=lambda: busy[0], clock=lambda: now[0])
    indexer._stopping.wait = lambda pause: False  # type: ignore[method-assign]  # the pause is counted, not slept
    indexer._index(row.id)
    assert sizes == [BUSY_BATCH] * (row.passages // BUSY_BATCH) and row.passages == 8
    worked = 0.05 * row.passages
    assert abs(indexer.paused_s - worked * (1 / SHARE - 1)) < 1e-9  # worked / (worked + paused) == SHARE
    busy[0] = False
    store.finish(row.id, "indexing")
    store.db.write(lambda tx: tx.run("UPDATE passages SET vec = NULL"))
    sizes.clear()
    indexer._index(row.id)
    assert sizes == [min(BATCH, row.passages)] and store.doc(row.id).status == "ready"  # type: ignore[union-attr]
    store.close()


def test_passage_ids_are_never_reused_and_found_only_in_the_callers_scopes(tmp_path: Path) -> None:
    """A search holding an old id (a replaced document's embeddings) can never name another
    person's passage: ids are not used again, and `found` keeps to the caller's scopes."""
    lib, _ = make(tmp_path)
    try:
        ann, ben = person_scope("ann"), person_scope("ben")
        mine = asyncio.run(lib.add(ann, "Ann", "a.txt", "text/plain", b"First.\n\nSecond.\n\nThird."))
        wait_ready(lib, mine.id)
        old = [r[0] for r in lib.store.vectors(mine.id)]
        asyncio.run(lib.delete(mine))
        theirs = asyncio.run(lib.add(ben, "Ben", "b.txt", "text/plain", b"Codename Bluefinch."))
        wait_ready(lib, theirs.id)
        new = [r[0] for r in lib.store.vectors(theirs.id)]
        assert min(new) > max(old)
        assert lib.store.found(new, [OFFICE, ann]) == {} and set(lib.store.found(new, [ben])) == set(new)
    finally:
        lib.stop()


def test_two_uploads_at_once_cannot_both_pass_the_limit(tmp_path: Path) -> None:
    lib, _ = make(tmp_path, LibraryLimits(person_documents=1))
    me = person_scope("ann")

    async def both() -> list[object]:
        return await asyncio.gather(lib.add(me, "Ann", "a.txt", "text/plain", b"one"),
                                    lib.add(me, "Ann", "b.txt", "text/plain", b"two"), return_exceptions=True)
    try:
        results = asyncio.run(both())
        assert sum(isinstance(r, Conflict) for r in results) == 1 and len(lib.documents([me])) == 1
    finally:
        lib.stop()


def test_a_replacement_while_its_document_is_embedded_is_embedded_and_loaded_too() -> None:
    from appliance.library.indexer import Indexer
    from appliance.library.vectors import Vectors

    store = LibraryStore(None)
    lib = Library(store, DocumentReader(), FakeEmbedder().embed, fake_vectors)
    row = asyncio.run(lib.add(OFFICE, "op", "a.txt", "text/plain", b"Old text about soup."))
    new_text = b"New text about lentils.\n\nAnd bread."
    replaced = []

    def embed(texts: list[str]) -> np.ndarray:  # the PUT lands while the old passages are embedded
        if not replaced:
            replaced.append(asyncio.run(lib.add(OFFICE, "op", "a.txt", "text/plain", new_text, replacing=row)))
        return fake_vectors(texts)

    vectors = Vectors()
    Indexer(store, vectors, embed)._index(row.id)
    done = store.doc(row.id)
    assert done is not None and done.status == "ready" and done.indexed == done.passages == replaced[0].passages
    assert len(vectors) == done.passages and all("soup" not in f.text for f in store.found(
        [r[0] for r in store.vectors(row.id)], [OFFICE]).values())
    store.close()


AED = "The AED hangs on the wall beside reception, next to the first-aid kit."
# Passages holding "a" (what the stemmer makes of "AED") and where, is, the: by stems,
# "where is the AED" found these before the AED's (as the office's "A 号楼梯" in issue 49).
OTHERS = [f"Where is the A {n} 号楼梯? It is the staircase at the A entrance, door {n}." for n in range(1, 25)] + [
    "Print on A4 paper only; A3 needs a manager's approval.",
    "Connect to the VPN before you open the intranet.",
    "Meeting room B2 is on the second floor, B3 on the third.",
    "The travel policy covers a train ticket and a hotel night.",
    "差旅政策：出差住宿标准为每晚五百元。",
]


def library(tmp_path: Path) -> Library:
    lib, _ = make(tmp_path)
    for n, text in enumerate([*OTHERS[:12], AED, *OTHERS[12:]]):
        row = asyncio.run(lib.add(OFFICE, "op", f"d{n}.txt", "text/plain", text.encode()))
        wait_ready(lib, row.id)
    return lib


def first(lib: Library, question: str, ways: tuple[str, ...] = ("words", "meaning")) -> str:
    found = asyncio.run(lib.search([OFFICE], question, ways=ways))
    assert found, question
    return found[0].text


def test_codes_are_the_words_in_capitals_or_of_letters_and_digits() -> None:
    assert codes("Where is the AED? A4 or b2, ISO9001, 15 days, the 3rd floor, VPN怎么连") == \
        ["aed", "a4", "b2", "iso9001", "vpn"]
    assert codes("policies of the office; tell IT or HR") == []


def test_the_stemmer_never_reads_aed_as_a(tmp_path: Path) -> None:
    lib = library(tmp_path)
    try:
        words = terms("where is the AED")
        stemmed, written = lib.store.forms(words, codes("where is the AED"))
        assert written == ["aed"] and "aed" not in stemmed
        # By words alone, only the passage holding "AED" has it: not the 24 staircases with "a".
        aed = lib.store.keyword(OFFICE, [], 50, written)
        assert [f.text for f in lib.store.found(aed, [OFFICE]).values()] == [AED]
        assert first(lib, "where is the AED") == AED
        assert first(lib, "where is the AED", ways=("words",)) == AED
        # Written small it is no code, but the stemmer would cut it to "a": matched as written.
        assert first(lib, "where is the aed", ways=("words",)) == AED
    finally:
        lib.stop()


def test_codes_find_their_passage_and_stems_still_work(tmp_path: Path) -> None:
    lib = library(tmp_path)
    try:
        assert first(lib, "A4 paper").startswith("Print on A4 paper")
        assert first(lib, "VPN").startswith("Connect to the VPN")
        assert first(lib, "B2").startswith("Meeting room B2")
        assert first(lib, "policies for trips", ways=("words",)).startswith("The travel policy")
        assert first(lib, "出差住宿标准").startswith("差旅政策")
        assert first(lib, "差旅政策", ways=("words",)).startswith("差旅政策")
        # A question without codes or mangled words is searched as before: one stemmed ranking.
        for question in ("出差住宿标准", "policies for trips"):
            assert lib._words([OFFICE], question) == ([lib.store.keyword(OFFICE, terms(question), 20)], [1.0])
    finally:
        lib.stop()


def test_a_replaced_or_deleted_passage_leaves_the_written_words_too(tmp_path: Path) -> None:
    lib, _ = make(tmp_path)
    try:
        row = asyncio.run(lib.add(OFFICE, "op", "kit.txt", "text/plain", AED.encode()))
        new = asyncio.run(lib.add(OFFICE, "op", "kit.txt", "text/plain", b"The defibrillator is upstairs.",
                                  replacing=row))
        assert lib.store.keyword(OFFICE, [], 5, ["aed"]) == []
        asyncio.run(lib.delete(new))
        assert lib.store.keyword(OFFICE, ["defibrillator"], 5, ["upstairs", "the"]) == []
        # FTS5's own check of the index: a contentless table told the wrong words would fail it.
        lib.store.db.write(lambda tx: tx.run("INSERT INTO exact_office (exact_office) VALUES ('integrity-check')"))
        assert lib.store.keyword(OFFICE, [], 5, ["the"]) == []
    finally:
        lib.stop()


def old_library(state: Path, docs: dict[str, tuple[str, list[str]]]) -> None:
    """library.sqlite3 as the code before this change wrote it (version 1): documents, their
    passages with embeddings, and each scope's stemmed table alone."""
    state.mkdir(mode=0o700, exist_ok=True)
    with sqlite3.connect(state / FILE_NAME) as conn:
        for sql in MIGRATIONS.steps[0]:
            conn.execute(sql)
        for doc, (scope, texts) in docs.items():
            table = "terms_office" if scope == OFFICE else "terms_" + hashlib.sha256(scope.encode()).hexdigest()[:24]
            conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5(words, tokenize = 'porter unicode61')")
            conn.execute("INSERT INTO documents VALUES (?, ?, ?, ?, 'text', 1, NULL, 1, 0, ?, ?, 'ready', NULL, 1.0, 'op')",
                         (doc, scope, doc, doc + ".txt", len(texts), len(texts)))
            for seq, text in enumerate(texts):
                cur = conn.execute("INSERT INTO passages (doc, seq, page, text, vec) VALUES (?, ?, NULL, ?, ?)",
                                   (doc, seq, text, fake_vectors([text])[0].tobytes()))
                conn.execute(f"INSERT INTO {table} (rowid, words) VALUES (?, ?)", (cur.lastrowid, " ".join(terms(text))))
        conn.execute("PRAGMA user_version = 1")
    (state / FILE_NAME).chmod(0o600)


def test_a_library_from_before_is_migrated_with_nothing_lost(tmp_path: Path) -> None:
    ben = person_scope("ben")
    old_library(tmp_path, {"lib_office": (OFFICE, [*OTHERS, AED]), "lib_ben": (ben, ["My VPN token is in the drawer."])})
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        before = conn.execute("SELECT id, doc, seq, text, vec FROM passages ORDER BY id").fetchall()
    store = LibraryStore(tmp_path)
    try:
        assert store.db.version == len(MIGRATIONS.steps) == 2  # type: ignore[attr-defined]
        assert store.db.read(lambda tx: tx.all("SELECT id, doc, seq, text, vec FROM passages ORDER BY id")) == before
        assert {d.id for d in store.docs([OFFICE, ben])} == {"lib_ben", "lib_office"}
        assert len(store.vectors()) == len(before)
        found = store.found(store.keyword(OFFICE, [], 5, ["aed"]), [OFFICE])
        assert [f.text for f in found.values()] == [AED]
        policy = store.found(store.keyword(OFFICE, ["policies"], 5), [OFFICE])
        assert [f.text for f in policy.values()] == [OTHERS[-2]]
        # Each scope's own table: Ben's VPN is in his, the office's in the office's.
        assert len(store.keyword(ben, [], 5, ["vpn"])) == 1 and len(store.keyword(OFFICE, [], 5, ["vpn"])) == 1
        assert store.db.read(lambda tx: tx.one(
            "SELECT count(*) FROM sqlite_master WHERE name = 'build_written'")) == (0,)
    finally:
        store.close()
    again = LibraryStore(tmp_path)  # opened again: the same, the note gone
    try:
        assert len(again.keyword(OFFICE, [], 50, ["aed"])) == 1
    finally:
        again.close()

