"""A library for tests of what reaches it, not of meaning: the real store and reader, and an
embedding model that gives every text the same vector (the meaning ranking then only keeps
the passages in the order they came) and, as the real one (English only), cannot read
Chinese. `gate`, when cleared, holds the indexer's embeddings back."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from appliance.documents.reader import DocumentReader
from appliance.library.language import cjk_share
from appliance.library.library import Library, LibraryLimits
from appliance.library.store import LibraryStore
from helpers.polling import wait_until

DIM = 8


def same(texts: list[str]) -> np.ndarray:
    return np.full((len(texts), DIM), DIM ** -0.5, np.float32)


def open_library(state: Path, limits: LibraryLimits | None = None, gate: threading.Event | None = None) -> Library:
    async def embed(texts: list[str]) -> np.ndarray:
        return same(texts)

    def embed_background(texts: list[str]) -> np.ndarray:
        if gate is not None:
            gate.wait(30)
        return same(texts)

    lib = Library(LibraryStore(state), DocumentReader(), embed, embed_background, limits, unknown_share=cjk_share)
    return lib


def indexed(lib: Library, doc: str) -> None:
    """Wait until the document's embeddings are made (the indexer thread's)."""
    def done() -> bool:
        row = lib.store.doc(doc)
        return row is not None and row.status != "indexing"
    wait_until(done, 30, f"{doc} to be indexed")
