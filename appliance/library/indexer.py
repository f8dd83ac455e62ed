"""The indexer: one thread that embeds documents' passages in the background, a batch at a
time, through the embedding service's background context, and while the chat engine
has work, in small batches with pauses (SHARE of one core). A document becomes searchable by
meaning when its last batch is stored; its words are searchable from the moment it is added.
With database_url, the embeddings go to PostgreSQL (`publish`, sync.py) before the document is
ready here: every other box takes them from there instead of computing them again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from appliance.library.store import LibraryStore
from appliance.library.vectors import Vectors
from appliance.store.errors import StoreError
from appliance.workers import Worker, WorkerStopped

log = logging.getLogger(__name__)
BATCH = 16  # passages an embedding call while the chats rest: ~0.9 s of one core (16 x ~58 ms)
BUSY_BATCH = 2  # ...and while they run: ~0.12 s, then a pause (SHARE)
# While the chat engine has work, indexing takes at most this share of one core. Niceness is
# no substitute: beside 8 chatting clients an indexer niced to 19 working on cost them 32% of
# their tokens/s (68.7 -> 46.7) and TTFT p95 1.48x (bench/library/indexing.sh), as llama.cpp's
# threads meet at a barrier after every operation of a step, and each wait for a core the
# indexer holds delays both.
SHARE = 0.10
Embed = Callable[[list[str]], np.ndarray]


class Publisher(Protocol):
    """Where a document's embeddings go beside this box's file (sync.Publish: PostgreSQL)."""

    def ready(self, doc: str) -> None: ...
    def failed(self, doc: str, error: str) -> None: ...


class Indexer(Worker[str]):
    """The thread and its queue of document ids. Stopping cancels: the document being
    embedded stops at its next batch, and what waits stays "indexing" for the next start."""

    DRAIN = False

    def __init__(self, store: LibraryStore, vectors: Vectors, embed: Embed,
                 busy: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic,
                 publish: Publisher | None = None) -> None:
        super().__init__("library-indexer")
        self.publish = publish
        self.store = store
        self.vectors = vectors
        self.embed = embed
        self.busy_engine = busy  # the chat engine has running or waiting turns (its snapshot)
        self.clock = clock
        self.paused_s = 0.0  # time spent pausing for the chats (tests and the bench read it)
        self.busy = threading.Event()  # set while a document is being embedded (tests wait on it)

    def start(self, resume: bool = True) -> None:
        """resume: take up what a restart interrupted now (with database_url, the sync does
        once it has compared this box's copy with PostgreSQL's: what finished elsewhere
        meanwhile is not embedded again)."""
        super().start()
        for doc in self.store.pending() if resume else ():  # what a restart interrupted
            self.submit(doc)

    def submit(self, doc: str, weight: int = 1) -> None:
        try:
            super().submit(doc, weight)
        except WorkerStopped:  # not running: the document stays "indexing", taken up at the next start
            pass

    def stop(self, timeout: float | None = 30) -> None:
        super().stop(timeout)

    def handle(self, doc: str) -> None:
        self.busy.set()
        try:
            self._index(doc)
        except StoreError as e:  # the disk: the document stays "indexing" and is taken up at the next start
            log.error("library: indexing %s stopped: %s", doc, e)
        except Exception:  # one document's fault never ends the thread
            log.exception("library: indexing %s failed", doc)
            self._finish(doc, "failed", "indexing failed; see the server log")
        finally:
            self.busy.clear()

    def _index(self, doc: str) -> None:
        """Embed the document's passages; once none is left without, mark it ready (in one
        transaction with that check: a replacement that came in meanwhile is embedded too)
        and load its embeddings for search."""
        while True:
            if not self._embed_all(doc):
                return  # deleted meanwhile, or stopping: taken up again at the next start
            if self.publish is not None:  # PostgreSQL first: away, the document stays "indexing" till the next start
                self.publish.ready(doc)
            if self.store.finish_if_complete(doc):
                break
            row = self.store.doc(doc)
            if row is None:
                return
            if row.status != "indexing":
                break  # ready already (another run finished it): load what it holds
        self.load(doc)

    def _embed_all(self, doc: str) -> bool:
        while not self._stopping.is_set() and (batch := self.store.unembedded(doc, self._batch_size())):
            start = self.clock()
            vecs = self.embed([text for _, text in batch])
            took = self.clock() - start
            done = self.store.set_vectors(doc, [(pid, np.ascontiguousarray(v, np.float32).tobytes())
                                                for (pid, _), v in zip(batch, vecs)])
            if done < 0:
                return False
            if self.busy_engine():
                pause = took * (1 / SHARE - 1)
                self.paused_s += pause
                self._stopping.wait(pause)
        return not self._stopping.is_set()

    def load(self, doc: str) -> None:
        """A ready document's embeddings, into the vectors searched."""
        row = self.store.doc(doc)
        rows = self.store.vectors(doc)  # a ready document's only
        if row is None or not rows:
            return
        self.vectors.put(doc, row.scope, [r[0] for r in rows], [r[3] for r in rows])
        again = self.store.doc(doc)
        if again is None or again.status != "ready":  # deleted, or replaced, while they were loaded
            self.vectors.drop(doc)
        log.info("library: %s (%s) indexed, %d passages", doc, row.name, len(rows))

    def _batch_size(self) -> int:
        return BUSY_BATCH if self.busy_engine() else BATCH

    def _finish(self, doc: str, status: str, error: str) -> None:
        # PostgreSQL first, as for a ready document: once this box shows it failed, every
        # box's next sync does too (the other order left a window another box synced in).
        try:
            if self.publish is not None:
                self.publish.failed(doc, error)
        except StoreError as e:
            log.error("library: cannot mark %s %s for the other boxes: %s", doc, status, e)
        try:
            self.store.finish(doc, status, error)
        except StoreError as e:
            log.error("library: cannot mark %s %s: %s", doc, status, e)
