"""A box's library as a cache of PostgreSQL's (`database_url`, shared.py): a thread that
takes the changes other boxes made every few seconds (library_sync_s) and at start, and
the indexer's hand-over of the embeddings this box made.

Each change names a document: the box copies it whole from PostgreSQL into its SQLite file
(words searchable at once, embeddings loaded once it is ready there) or forgets it when it is
gone. A document whose generation and status the box already holds is left as it is (its own
uploads come back as changes too). At start the whole list is compared instead, as the box
may have been off, or its file from another database. A box whose PostgreSQL is away goes on
searching what it holds and tries again at the next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from appliance.library.shared import SharedLibrary
from appliance.library.store import LibraryStore
from appliance.library.vectors import Vectors
from appliance.store.errors import StoreError
from appliance.workers import Worker

log = logging.getLogger(__name__)


class Sync(Worker[bool]):
    """The cache's keeper: `submit(True)` compares everything, `submit(False)` (and every
    `every` seconds idle) takes the changes since the last one taken. `synced` is notified
    after each round (tests wait on it)."""

    def __init__(self, store: LibraryStore, shared: SharedLibrary, vectors: Vectors, load: Callable[[str], None],
                 every: float, resume: Callable[[str], None] = lambda doc: None) -> None:
        super().__init__("library-sync", every=every)
        self.store, self.shared, self.vectors, self.load = store, shared, vectors, load
        # After the first comparison, the indexer takes up what this box had left unembedded
        # and no box has finished since (what another box is embedding now is left to it).
        self.resume = resume
        self.first = True
        self.whole = True  # the next round compares everything (at start, and until that has worked once)
        self.rounds = 0
        self.synced = threading.Condition()
        self.trouble = ""  # the last round's failure ("" once one works)

    def start(self) -> None:
        super().start()
        self.submit(True)

    def handle(self, whole: bool) -> None:
        self.round(whole)

    def tick(self) -> bool:
        self.round(False)
        return True

    def round(self, whole: bool = False) -> int:
        """One round; the documents it copied or forgot."""
        try:
            done = self.reconcile() if whole or self.whole else self.catch_up()
            if self.trouble:
                log.warning("library: PostgreSQL's library is taken again")
            self.trouble = ""
            return done
        except StoreError as e:  # PostgreSQL away or the disk: one journal line an outage, and the next tick
            if not self.trouble:
                log.error("library: %s; this box searches the copy it has, and takes no document", e)
            self.trouble = str(e)
        except Exception:  # a fault of one round never ends the thread
            log.exception("library: a sync round failed")
        finally:
            with self.synced:
                self.rounds += 1
                self.synced.notify_all()
        return 0

    def catch_up(self) -> int:
        changes = self.shared.changes(self.store.seen())
        done = sum(self.mirror(doc) for doc in dict.fromkeys(doc for doc, _ in changes))
        if changes:
            self.store.set_seen(changes[-1][1])
        return done

    def reconcile(self) -> int:
        """Every document against PostgreSQL's list: a box's own from before database_url
        (no generation) is left alone."""
        last = self.shared.last()  # first: a change made while this round runs is taken by the next
        left = set(self.store.pending()) if self.first else set()
        theirs, mine = self.shared.states(), self.store.mirrored()
        done = sum(self.forget(doc) for doc in mine.keys() - theirs.keys())
        done += sum(self.mirror(doc) for doc, state in theirs.items() if mine.get(doc) != state)
        self.store.set_seen(last)
        for doc in left & set(self.store.pending()):
            self.resume(doc)
        self.whole = self.first = False
        return done

    def mirror(self, doc: str) -> bool:
        """The document as PostgreSQL holds it now; False if the box holds that already."""
        theirs = self.shared.states(doc).get(doc)
        if theirs is not None and self.store.mirrored(doc).get(doc) == theirs:
            return False
        copy = self.shared.copy(doc) if theirs is not None else None
        if copy is None:
            return self.forget(doc)
        self.vectors.drop(doc)
        self.store.mirror(copy.row, copy.gen, copy.passages, copy.vecs)
        if copy.row.status == "ready":
            self.load(doc)
        return True

    def forget(self, doc: str) -> bool:
        """A document deleted on another box (only one that came from PostgreSQL)."""
        if doc not in self.store.mirrored(doc):
            return False
        row = self.store.doc(doc)
        if row is not None:
            self.store.delete(row)
        self.vectors.drop(doc)
        log.info("library: %s deleted on another box", doc)
        return True


class Publish:
    """The indexer's hand-over, on the box that took the upload: the embeddings it made go
    to PostgreSQL (for every box) before the document is ready on this one."""

    def __init__(self, store: LibraryStore, shared: SharedLibrary) -> None:
        self.store, self.shared = store, shared

    def _gen(self, doc: str) -> int | None:
        held = self.store.mirrored(doc).get(doc)
        return held[0] if held is not None else None  # None: a box's own from before database_url

    def ready(self, doc: str) -> None:
        gen, vecs = self._gen(doc), self.store.embedded(doc)
        if gen is None or any(v is None for _, v in vecs):
            return  # a replacement came in: the indexer embeds it too
        self.shared.publish(doc, gen, [(seq, v) for seq, v in vecs if v is not None])

    def failed(self, doc: str, error: str) -> None:
        gen = self._gen(doc)
        if gen is not None:
            self.shared.finish(doc, gen, "failed", error)
