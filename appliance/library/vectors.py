"""The passages' embeddings in memory, one matrix a document, searched by cosine: 384 floats
(1.5 KiB) a passage, so 10,000 passages (a shelf of 25 100-page PDFs) take 15 MiB and a
search ~2 ms on one core."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Shelf:
    """One document's passages: their ids and unit-length embeddings, row for row."""

    scope: str
    ids: np.ndarray  # int64
    matrix: np.ndarray  # float32, (n, dim)


class Vectors:
    """Documents' embeddings, swapped whole under a lock (the indexer adds, routes delete,
    searches read a snapshot)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shelves: dict[str, Shelf] = {}

    def load(self, rows: Iterable[tuple[int, str, str, bytes]]) -> None:
        """Every ready document's embeddings, from the store at start-up."""
        by_doc: dict[str, tuple[str, list[int], list[bytes]]] = {}
        for pid, doc, scope, vec in rows:
            entry = by_doc.setdefault(doc, (scope, [], []))
            entry[1].append(pid)
            entry[2].append(vec)
        for doc, (scope, ids, vecs) in by_doc.items():
            self.put(doc, scope, ids, vecs)

    def put(self, doc: str, scope: str, ids: list[int], vecs: list[bytes]) -> None:
        matrix = np.stack([np.frombuffer(v, dtype=np.float32) for v in vecs]) if vecs else np.zeros((0, 0), np.float32)
        shelf = Shelf(scope, np.asarray(ids, dtype=np.int64), matrix)
        with self._lock:
            self._shelves[doc] = shelf

    def drop(self, doc: str) -> None:
        with self._lock:
            self._shelves.pop(doc, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(s.ids) for s in self._shelves.values())

    def search(self, scopes: frozenset[str], query: np.ndarray, limit: int) -> list[int]:
        """The ids of the passages nearest `query` (unit length) among the scopes' documents."""
        with self._lock:
            shelves = [s for s in self._shelves.values() if s.scope in scopes and len(s.ids)]
        if not shelves:
            return []
        ids = np.concatenate([s.ids for s in shelves])
        scores = np.concatenate([s.matrix @ query for s in shelves])
        top = np.argsort(-scores, kind="stable")[:limit]
        return [int(ids[i]) for i in top]

    def near(self, query: np.ndarray, passages: Iterable[tuple[str, int]]) -> dict[int, float]:
        """The cosine of `query` (unit length) to each of these (document, passage) that has
        its embedding here."""
        with self._lock:
            shelves = dict(self._shelves)
        out: dict[int, float] = {}
        for doc, pid in passages:
            shelf = shelves.get(doc)
            if shelf is None:
                continue
            rows = np.flatnonzero(shelf.ids == pid)
            if len(rows):
                out[pid] = float(shelf.matrix[rows[0]] @ query)
        return out

    def first(self, doc: str, n: int) -> list[int]:
        """The ids of a document's first n embedded passages (none while it is indexed)."""
        with self._lock:
            shelf = self._shelves.get(doc)
        return [int(i) for i in shelf.ids[:n]] if shelf is not None else []
