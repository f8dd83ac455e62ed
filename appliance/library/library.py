"""The library as the routes use it: add, replace, list and delete documents in a scope (the
office's, or a person's own), and find the passages that answer a question among the scopes
a caller may read. Words (FTS5, per scope) and meaning (embeddings) each rank candidates;
reciprocal rank fusion joins the lists, and the best passages are kept within a budget."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from appliance.documents.document import Document
from appliance.documents.reader import DocumentReader
from appliance.errors import Conflict, PayloadTooLarge, Unavailable, UnprocessableEntity
from appliance.library.cite import keep
from appliance.library.errors import EmbedBusy, EmbedStopped
from appliance.library.indexer import Indexer
from appliance.library.language import SAMPLE, Lang, Languages, crossing, language, leads, written_as_name
from appliance.library.lexicon import LEXICON, NO_GLOSS, Gloss
from appliance.library.passages import (
    MAX_QUERY_CHARACTERS,
    MAX_QUERY_TERMS,
    Passage,
    characters,
    codes,
    estimate_tokens,
    html_text,
    split,
    terms,
)
from appliance.library.shared import SharedLibrary
from appliance.library.store import OFFICE, DocRow, Found, LibraryStore, NoRoom
from appliance.library.sync import Publish, Sync
from appliance.library.vectors import Vectors
from appliance.workers import Worker

log = logging.getLogger(__name__)
# Reciprocal rank fusion's constant: a rank counts 1 / (RRF_K + rank). Cormack et al. (2009)
# took 60 for TREC's lists of 1,000 documents; over our 20 candidates a list's first place
# then counts only 1.3 times its 20th (1/61 vs 1/80), so a passage in the middle of both lists
# outranks the one a list is surest of (the passage first by meaning that words miss, its
# words put otherwise). At 10 the first counts 2.7 times the 20th, and agreeing still counts:
# second in both lists (2/12 + 1/12) beats first in meaning alone (2/11). On the evaluation set
# (bench/library/eval.py retrieval) same-language hit@3 went from 0.898 to 0.939 (English 0.88
# to 0.96; hit@1 and Chinese, ranked by words alone, unchanged), the same at 3 to 10 (and to 30
# with 40 candidates); at 1, English hit@1 fell to 0.80.
RRF_K = 10
MAX_QUESTION = 2000  # characters of a question searched for


MOST_THINGS = 8  # of a question's things looked for (lexicon.things): bounded before it starts


@dataclass(frozen=True, slots=True)
class LibraryLimits:
    office_documents: int = 500
    person_documents: int = 100
    office_passages: int = 100_000  # 150 MiB of embeddings in RAM at most (1.5 KiB a passage)
    person_passages: int = 10_000
    candidates: int = 20  # passages each ranking gives to the fusion
    top_k: int = 4  # passages a chat is given at most...
    budget_tokens: int = 700  # ...and at most this many tokens of them (bench/library/eval.py measured it)
    # The meaning ranking's weight in the fusion (words: 1). On the evaluation set (RRF_K 10),
    # English hit@1 / hit@3 is 0.68 / 0.92 at 1, 0.80 / 0.96 at 1.5, 0.84 / 0.96 at 2 and 3.
    meaning_weight: float = 2.0
    # A question's codes (AED, A4, VPN) as a ranking of their own, weighted as meaning is: the
    # passage that has the code, first by words and by codes, scores 1/11 + 2/11 = 0.273, as
    # much as one first by words and meaning; a passage not first by words has at most
    # 1/12 + 2/11 = 0.265. At 1 (its 2/11 = 0.182), a passage first by meaning alone (0.182)
    # or by meaning and second by words (0.265) would tie or beat it.
    code_weight: float = 2.0
    # A question's CJK characters one by one (store.characters) as a ranking of their own,
    # beside its pairs: Chinese words are of one or two characters and are written more than
    # one way (薪水, 工资; 几号, 15日), so single characters with pairs search Chinese better
    # than pairs alone (as Chinese retrieval has long found). The embedding model reads no
    # Chinese, so this is the ranking a Chinese question's pairs meet. Weighted below them: a
    # character is weaker evidence than a pair. On the evaluation set, Chinese same-language
    # hit@1 / hit@3 went from 0.667 / 0.917 to 0.875 / 0.958 at 0.75 to 1.5 (0.75 / 0.958 at
    # 0.25; 0.833 at 0.5), English unchanged; the passage holding the fact came first for 20
    # of 24 Chinese questions (14 before), the tables' for 8 of 8 (7 at 1 and 1.5).
    character_weight: float = 0.75
    most_unknown: float = 0.3  # a question with more of its word pieces unknown to the embedding model is searched by words only
    # A question is also searched in the other language, put into it by the chat model, when
    # the documents searched hold some in it (http/translate.py); every translated_every-th
    # place goes to that search's best. On the evaluation set (bench/library/crossing.py), at 3
    # the other-language questions' hit@3 and hit@4 went from 0 to 0.5, the others' hit@1
    # stayed 0.79 (hit@3 0.91 -> 0.88, hit@4 0.95 -> 0.91); at 2, hit@4 0.6 but the others'
    # 0.88. Fused into one ranking instead, the languages' scores do not compare: at the
    # weight that found 5 of 10 first, the same-language questions' hit@1 fell from 0.79 to 0.39.
    translate: bool = True
    translated_every: int = 3
    # The question's words put into the other language by a dictionary (lexicon.py) rank that
    # language's passages too, fused with the translation's rankings; the names among them
    # (Tibet: 西藏) as a ranking of their own, weighted as codes are. On the evaluation set
    # (bench/library/crossing.py, the same translations), the other-language questions' hit@1 /
    # hit@4 went from 0.2 / 0.6 to 0.4 / 0.7 (gloss 0.5 or 1; names 2: 0.3 / 0.7 at 1), the
    # others' stayed 0.877 / 0.965; the dictionary alone, no translation, 0.3 / 0.7.
    gloss_weight: float = 1.0
    name_weight: float = 2.0


class Library:
    def __init__(self, store: LibraryStore, reader: DocumentReader,
                 embed: Callable[[list[str]], Awaitable[np.ndarray]],
                 embed_background: Callable[[list[str]], np.ndarray],
                 limits: LibraryLimits | None = None, clock: Callable[[], float] = time.time,
                 unknown_share: Callable[[str], float] = lambda text: 0.0,
                 busy: Callable[[], bool] = lambda: False, shared: SharedLibrary | None = None,
                 sync_s: float = 2.0) -> None:
        self.store = store
        self.reader = reader
        self.limits = limits or LibraryLimits()
        self.vectors = Vectors()
        # shared (database_url): PostgreSQL holds the library, `store` is this box's cache of it.
        self.shared = shared
        self.indexer = Indexer(store, self.vectors, embed_background, busy,
                               publish=Publish(store, shared) if shared is not None else None)
        self.sync = Sync(store, shared, self.vectors, self.indexer.load, sync_s,
                         resume=self.indexer.submit) if shared is not None else None
        self.languages = Languages(self._sample)
        self._embed = embed
        self._unknown_share = unknown_share
        self._clock = clock

    def start(self) -> None:
        self.vectors.load(self.store.vectors())
        if len(self.vectors):
            self._warm()
        self.indexer.start(resume=self.sync is None)
        if self.sync is not None:
            self.sync.start()  # its first round compares the cache with PostgreSQL, in the background

    def stop(self) -> None:
        if self.sync is not None:
            self.sync.stop()
        self.indexer.stop()
        if self.shared is not None:
            self.shared.close()
        self.store.close()

    def workers(self) -> list[Worker[Any]]:
        """Its background threads, for /admin/status: the indexer, and with database_url the sync."""
        return [self.indexer, *([self.sync] if self.sync is not None else [])]

    # -- documents ----------------------------------------------------------------------
    def documents(self, scopes: list[str]) -> list[DocRow]:
        return self.store.docs(scopes)  # a StoreError is the route's 503 as it is

    def document(self, doc_id: str, scope: str) -> DocRow | None:
        """The document if it is in `scope` (None otherwise, as if it did not exist)."""
        row = self.store.doc(doc_id)
        return row if row is not None and row.scope == scope else None

    def _most(self, scope: str) -> tuple[int, int]:
        """The documents and passages the scope may hold."""
        if scope == OFFICE:
            return self.limits.office_documents, self.limits.office_passages
        return self.limits.person_documents, self.limits.person_passages

    def _room(self, scope: str, replacing: DocRow | None) -> int:
        """The passages the scope has room for; refused when it holds its most documents."""
        docs, passages = (self.shared or self.store).count(scope)
        most_docs, most_passages = self._most(scope)
        if replacing is None and docs >= most_docs:
            raise Conflict(f"the library holds {docs:,} documents here, the most it takes: delete one first",
                           code="library_full")
        return most_passages - passages + (replacing.passages if replacing else 0)

    async def add(self, scope: str, added_by: str, name: str, content_type: str, data: bytes,
                  title: str = "", replacing: DocRow | None = None) -> DocRow:
        """Read the file (in the sandboxed worker), cut it into passages, store them (their words
        searchable at once) and queue their embeddings."""
        if self.store.read_only:
            raise Unavailable(f"the library cannot be changed now: {self.store.trouble}", code="library_not_writable")
        room = await asyncio.to_thread(self._room, scope, replacing)
        doc = await self.reader.read(data, name, content_type)
        # Off the event loop: 2,000,000 characters take a second or two to cut.
        text, passages = await asyncio.to_thread(_passages, doc, name)
        if not passages:
            raise UnprocessableEntity("the document holds no text to search", code="no_text_found")
        if len(passages) > room:
            raise PayloadTooLarge(f"the document has {len(passages):,} passages and the library has room for "
                                  f"{max(room, 0):,} more", code="library_full")
        row = DocRow(replacing.id if replacing else "lib_" + secrets.token_hex(8), scope,
                     (title or PurePosixPath(name).stem or name)[:200], name, _kind(doc, name), len(data), doc.pages,
                     len(text), doc.truncated, len(passages), 0, "indexing", None,
                     replacing.added_at if replacing else self._clock(), added_by)
        if replacing is not None:
            self.vectors.drop(row.id)
        try:
            await asyncio.to_thread(self._store, row, passages, replacing is not None)
        except NoRoom as e:  # another upload to the scope came in while this one was read
            raise Conflict(f"the library has room for no more {e.what} here ({e.have:,} of {e.most:,})",
                           code="library_full") from None
        self.indexer.submit(row.id)
        self._warm()
        return row

    def _warm(self) -> None:
        """Read the dictionary (lexicon.py) in a thread of its own once the library holds a
        document, so that the first chat that needs it does not wait the 1.5 s."""
        if self.limits.translate and self.limits.gloss_weight > 0 and not LEXICON.ready:
            LEXICON.warm()

    def _store(self, row: DocRow, passages: list[Passage], replace: bool) -> None:
        """Into this box's file, and first into PostgreSQL's (database_url), which checks the
        room of every box's uploads (refused with its 503 while it cannot be reached)."""
        if self.shared is None:
            self.store.add(row, passages, replace, self._most(row.scope))
            return
        gen = self.shared.add(row, passages, replace, self._most(row.scope))
        # As a replacement: the sync may have copied it here already.
        self.store.add(row, passages, True, None, gen)

    async def delete(self, row: DocRow) -> None:
        if self.shared is not None:  # PostgreSQL first: the other boxes forget it from there
            await asyncio.to_thread(self.shared.delete, row.id)
        await asyncio.to_thread(self.store.delete, row)
        self.vectors.drop(row.id)

    def _keyword(self, scope: str, words: list[str], written: list[str]) -> list[int]:
        return self.store.keyword(scope, words, self.limits.candidates, written)

    def _words(self, scopes: list[str], question: str) -> tuple[list[list[int]], list[float]]:
        """The rankings by words: each scope's (words by stem, or as written where the stemmer
        would mangle them), then each scope's by the question's codes alone (code_weight)."""
        words = terms(question, MAX_QUERY_TERMS)
        asked = [c for c in codes(question) if c in words]
        stemmed, written = self.store.forms(words, asked)
        lists = [self._keyword(scope, stemmed, written) for scope in scopes]
        weights = [1.0] * len(lists)
        if asked:
            lists += [self._keyword(scope, [], asked) for scope in scopes]
            weights += [self.limits.code_weight] * len(scopes)
        return lists, weights

    def _written(self, scopes: list[str], question: str) -> tuple[list[list[int]], list[float]]:
        """The rankings by what the question writes: its words (_words), then each scope's by
        its CJK characters one by one (character_weight), when it has any."""
        lists, weights = self._words(scopes, question)
        chars = characters(question, MAX_QUERY_CHARACTERS)
        if chars:
            lists += [self.store.characters(scope, chars, self.limits.candidates) for scope in scopes]
            weights += [self.limits.character_weight] * len(scopes)
        return lists, weights

    def _found(self, ids: list[int], scopes: list[str]) -> dict[int, Found]:
        return self.store.found(ids, scopes)

    def _readable(self, question: str, ways: tuple[str, ...]) -> bool:
        """Whether the embedding model can read the question (the evaluation's "meaning" alone
        is asked even where it cannot, to measure it)."""
        try:
            return ways == ("meaning",) or self._unknown_share(question) <= self.limits.most_unknown
        except EmbedStopped:
            return False

    # -- search -------------------------------------------------------------------------
    async def search(self, scopes: list[str], question: str, top_k: int | None = None, budget: int | None = None,
                     ways: tuple[str, ...] = ("words", "meaning"), also: str = "", gloss: bool = True) -> list[Found]:
        """The passages that best answer `question` among the scopes' documents, best first,
        at most top_k and budget_tokens of them (ways: the rankings fused; the evaluation
        compares each alone). `also`: the question in the other language (crossing), its
        ranking interleaved with the question's own, or leading it when the question names
        what only the other language's documents hold (language.leads)."""
        top_k = top_k or self.limits.top_k
        budget = budget if budget is not None else self.limits.budget_tokens
        lists, weights, query = await self._rankings(scopes, question[:MAX_QUESTION], ways)
        ranked = fuse(lists, weights)
        queries = [query]
        glossed = await self._glossed(scopes, question[:MAX_QUESTION], also) if gloss and "words" in ways else NO_GLOSS
        if also.strip() or glossed.words:
            more, theirs, translated = await self._rankings(scopes, also[:MAX_QUESTION], ways)
            if glossed.words:  # the dictionary's words for the question's, beside the model's translation
                words, weights = await asyncio.to_thread(self._words, scopes, glossed.words)
                more, theirs = more + words, theirs + [self.limits.gloss_weight * w for w in weights]
            if glossed.names:  # and its names apart, weighted as codes are: they tell one place's papers apart
                words, weights = await asyncio.to_thread(self._words, scopes, glossed.names)
                more, theirs = more + words, theirs + [self.limits.name_weight * w for w in weights]
            other = fuse(more, theirs)
            if await asyncio.to_thread(leads, question[:MAX_QUESTION], also, lambda name: self._held(scopes, name)):
                ranked, other = other, ranked  # the translated search's best first, the question's own every 3rd
            ranked = interleave(ranked, other, self.limits.translated_every)
            queries.append(translated)
        found = await asyncio.to_thread(self._found, ranked[: top_k * 3], scopes)
        best = [found[pid] for pid in ranked if pid in found]
        return self._near(keep(best, [estimate_tokens(f.text) for f in best], top_k, budget), queries)

    async def _glossed(self, scopes: list[str], question: str, also: str) -> Gloss:
        """The question's words in the library's other language by the dictionary (lexicon.py),
        when it is searched there too: its translation's language, else the other one when
        the scopes hold documents in it (the translation may not have come in time)."""
        into = language(also) if also.strip() else await self.crossing(scopes, question)
        if into is None or self.limits.gloss_weight <= 0:
            return NO_GLOSS
        return await asyncio.to_thread(LEXICON.gloss, question, into)

    async def unmentioned(self, scopes: list[str], question: str) -> list[str]:
        """The things the question names (lexicon.things) that no document of the scopes
        mentions, in either language, by any word the dictionary gives for them (lexicon.kin):
        what the library cannot say, whatever its nearest passage is about ("jury service"
        asked, the holiday page found). Empty when the dictionary is off (library_translate)."""
        if not self.limits.translate or self.limits.gloss_weight <= 0:
            return []
        return await asyncio.to_thread(self._unmentioned, scopes, question[:MAX_QUESTION])

    def _unmentioned(self, scopes: list[str], question: str) -> list[str]:
        return [w for w in LEXICON.things(question)[:MOST_THINGS]
                if not self._mentions(scopes, w) and not any(self._mentions(scopes, k) for k in LEXICON.kin(w.lower()))]

    def _mentions(self, scopes: list[str], phrase: str) -> bool:
        """Whether a passage of the scopes holds all the phrase's words (as the words ranking
        finds them: an English word by its stem, Chinese by its pairs); a phrase of none is."""
        words = terms(phrase, MAX_QUERY_TERMS)
        if not words:
            return True
        stemmed, written = self.store.forms(words, [])
        return any(self.store.holds_all(scope, stemmed, written) for scope in scopes)

    def _held(self, scopes: list[str], name: str) -> dict[Lang, bool]:
        """The languages of the documents whose passages hold the word (of its first
        `candidates` passages in each scope, by words), each with whether they write it as a
        name (language.leads)."""
        ids = [pid for scope in scopes for pid in self._keyword(scope, [name], [name])]
        texts: dict[Lang, list[str]] = {}
        for f in self._found(ids, scopes).values():
            row = self.store.doc(f.doc)
            if row is not None and (lang := self.languages.of(row)) is not None:
                texts.setdefault(lang, []).append(f.text)
        return {lang: written_as_name(name, held) for lang, held in texts.items()}

    def _near(self, kept: list[Found], queries: list[np.ndarray | None]) -> list[Found]:
        """The passages with their cosine to the question, or to its translation when closer
        (how close the search came: library/grounding.py); None when neither was embedded."""
        near: dict[int, float] = {}
        for query in queries:
            if query is not None:
                for pid, cos in self.vectors.near(query, [(f.doc, f.id) for f in kept]).items():
                    near[pid] = max(cos, near.get(pid, cos))
        return [dataclasses.replace(f, near=near.get(f.id)) for f in kept] if near else kept

    async def _rankings(self, scopes: list[str], question: str,
                        ways: tuple[str, ...]) -> tuple[list[list[int]], list[float], np.ndarray | None]:
        """The question's rankings (by words, by meaning when the embedding model can read it)
        and their weights in the fusion."""
        lists, weights = await asyncio.to_thread(self._written, scopes, question) if "words" in ways else ([], [])
        query = None
        if len(self.vectors) and question.strip() and "meaning" in ways and self._readable(question, ways):
            try:
                query = (await self._embed([question]))[0]
                lists.append(self.vectors.search(frozenset(scopes), query, self.limits.candidates))
                weights.append(self.limits.meaning_weight)
            except (EmbedBusy, EmbedStopped):  # 256 texts waiting, or stopping: words alone rank this one
                log.warning("library: the embedding model is busy or stopping; searched by words only")
        return lists, weights, query

    async def crossing(self, scopes: list[str], question: str) -> Lang | None:
        """The language the question should also be searched in (language.crossing): the
        other one, when the scopes hold documents in it; None when translating is off."""
        if not self.limits.translate:
            return None

        def holds(lang: Lang) -> bool:
            return self.languages.holds(self.store.docs(scopes), lang)
        return await asyncio.to_thread(crossing, question[:MAX_QUESTION], holds)

    def _sample(self, row: DocRow) -> list[str]:
        """A document's first passages: of its embeddings in memory, else of those not yet made."""
        ids = self.vectors.first(row.id, SAMPLE)
        if ids:
            return [f.text for f in self.store.found(ids, [row.scope]).values()]
        return [text for _, text in self.store.unembedded(row.id, SAMPLE)]


def fuse(lists: list[list[int]], weights: list[float] | None = None) -> list[int]:
    """Reciprocal rank fusion: the ids of all lists, by the sum of weight / (RRF_K + rank)."""
    score: dict[int, float] = {}
    for ranking, weight in zip(lists, weights or [1.0] * len(lists)):
        for rank, pid in enumerate(ranking, 1):
            score[pid] = score.get(pid, 0.0) + weight / (RRF_K + rank)
    return sorted(score, key=lambda pid: (-score[pid], pid))


def interleave(own: list[int], other: list[int], every: int) -> list[int]:
    """`own`'s ids in order, every `every`-th place given to `other`'s best not yet placed
    (each id once): the other language's search can neither push the question's own best
    passages out nor be outranked by them, since their scores do not compare."""
    out: list[int] = []
    lists = [list(reversed(own)), list(reversed(other))]  # popped from the end: best first
    while lists[0] or lists[1]:
        turn = 1 if (lists[1] and (len(out) + 1) % every == 0) or not lists[0] else 0
        pid = lists[turn].pop()
        if pid not in out:
            out.append(pid)
    return out


def _passages(doc: Document, name: str) -> tuple[str, list[Passage]]:
    """The text searched (an HTML page's readable text) and its passages."""
    html = PurePosixPath(name.lower()).suffix in (".html", ".htm")
    text = html_text(doc.text) if html else doc.text
    return text, split(doc if not html else Document(doc.kind, text, doc.pages, len(text), doc.truncated), text)


def _kind(doc: Document, name: str) -> str:
    if doc.kind != "text":
        return doc.kind
    suffix = PurePosixPath(name.lower()).suffix
    return {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}.get(suffix, "text")
