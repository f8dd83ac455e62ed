"""Libraries for in-process tests, on the real document reader and library store: one with a
fake embedding model of hashed words, and uploading to it as a client does; and one for
tests of what reaches it, not of meaning (`open_library`), whose embedding model gives every
text the same vector (the meaning ranking then only keeps the passages in the order they
came) and, as the real one (English only), cannot read Chinese. `gate`, when cleared, holds
its indexer's embeddings back."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from starlette.testclient import TestClient

from appliance.documents.reader import DocumentReader
from appliance.library.language import cjk_share
from appliance.library.library import Library, LibraryLimits
from appliance.library.passages import terms
from appliance.library.store import LibraryStore
from helpers.polling import wait_until

DIM = 32
SAME_DIM = 8


class FakeEmbedService:
    """The EmbedService's face: words hashed into DIM dimensions, unit length."""

    dim, max_tokens, model_id = DIM, 256, "fake-embedder"

    def vectors(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            for w in terms(t):
                out[i, sum(w.encode()) % DIM] += 1
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-6)
        return out

    def count_tokens(self, text: str) -> int:
        return len(terms(text)) + 2

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.vectors(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        return self.vectors(texts)

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def workers(self) -> list[Any]: return []


def library_of(state: Path, service: FakeEmbedService) -> Library:
    return Library(LibraryStore(state), DocumentReader(), service.embed, service.embed_sync)


def upload(client: TestClient, path: str, name: str, body: bytes, headers: dict[str, str] | None = None,
           method: str = "POST") -> Any:
    return client.request(method, path, content=body, headers={"content-type": "text/plain", "x-file-name": name,
                                                               **(headers or {})})


def ready(client: TestClient, path: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    for _ in range(2000):  # the indexer thread: a condition, not a time
        docs = client.get(path, headers=headers).json()["data"]
        if all(d["status"] != "indexing" for d in docs):
            return list(docs)
    raise AssertionError("indexing never finished")


def same(texts: list[str]) -> np.ndarray:
    return np.full((len(texts), SAME_DIM), SAME_DIM ** -0.5, np.float32)


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
