"""The evaluation set's documents in a library in this process, on the real embedding model
(no chat model), each added as text, its pages parted by form feeds, and indexed: what
bench/library/crossing.py and closest.py search."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any


@asynccontextmanager
async def set_library(data: dict[str, Any]) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    """The library holding the set's documents, once indexed, and the set's id of each
    document by the library's."""
    from appliance.documents.reader import DocumentReader
    from appliance.library.embedder import EmbedService
    from appliance.library.library import Library, LibraryLimits
    from appliance.library.store import OFFICE, LibraryStore
    from appliance.model.embedding import embedding_model_path

    service = EmbedService(embedding_model_path(fetch=False))
    service.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lib = Library(LibraryStore(Path(tmp)), DocumentReader(), service.embed, service.embed_sync,
                          LibraryLimits(), unknown_share=service.unknown_share)
            lib.start()
            try:
                ids = {}
                for d in data["documents"]:
                    doc = await lib.add(OFFICE, "bench", d["id"] + ".txt", "text/plain",
                                        "\f".join(d["pages"]).encode(), d["title"])
                    ids[doc.id] = d["id"]
                while any(r.status == "indexing" for r in lib.documents([OFFICE])):
                    await asyncio.sleep(0.05)
                yield lib, ids
            finally:
                lib.stop()
    finally:
        service.stop()
