"""A fake embedding model for the library's tests (words hashed into a vector: texts sharing
words are near, as meaning would be), a handbook's pages, and the wait for a document's indexing."""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from appliance.library.library import Library
from appliance.library.passages import terms

DIM = 64


def fake_vectors(texts: list[str]) -> np.ndarray:
    """Each word hashed to a dimension: texts sharing words are near, as meaning would be."""
    out = np.zeros((len(texts), DIM), np.float32)
    for i, t in enumerate(texts):
        for w in terms(t):
            out[i, int(hashlib.sha256(w.encode()).hexdigest(), 16) % DIM] += 1.0
        out[i] /= max(float(np.linalg.norm(out[i])), 1e-6)
    return out


class FakeEmbedder:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    async def embed(self, texts: list[str]) -> np.ndarray:
        return fake_vectors(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        self.gate.wait(timeout=30)
        self.calls += 1
        return fake_vectors(texts)


def wait_ready(lib: Library, doc: str) -> None:
    for _ in range(3000):  # a condition, not a time: each turn gives the indexer thread the GIL
        row = lib.store.doc(doc)
        if row is not None and row.status != "indexing":
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{doc} never finished indexing")


HANDBOOK = [f"Page {n} of the handbook. " + ("Parking permits are issued by reception. " if n == 3 else "")
            + ("The emergency assembly point is the car park behind the Linden bakery." if n == 7 else
               f"General rules number {n} about desks, lockers and coffee.") for n in range(1, 11)]
