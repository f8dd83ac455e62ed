"""A library for in-process tests: a fake embedding model of hashed words (the real
document reader and library store), and uploading to it as a client does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from starlette.testclient import TestClient

from appliance.documents.reader import DocumentReader
from appliance.library.library import Library
from appliance.library.passages import terms
from appliance.library.store import LibraryStore

DIM = 32


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
