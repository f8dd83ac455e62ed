"""The library's parts as `appliance serve` builds them from the config: the embedding model's
service and the library over the state directory (with database_url, a cache of the library
PostgreSQL holds for every box), or neither (library = false, or the embedding model not
fetched: the journal says how to fetch it and chats go on without)."""

from __future__ import annotations

import logging
from pathlib import Path

from appliance.config import Config
from appliance.documents.document import DocumentLimits, MiB
from appliance.documents.reader import DocumentReader
from appliance.engine.engine import Engine
from appliance.library.embedder import EmbedService
from appliance.library.library import Library, LibraryLimits
from appliance.library.shared import MIGRATIONS, SharedLibrary
from appliance.library.store import NAMING, LibraryStore
from appliance.model.embedding import embedding_model_path
from appliance.model.gguf import ModelFileError
from appliance.store.database import Database
from appliance.store.errors import StoreError

log = logging.getLogger(__name__)


def library_reader(cfg: Config) -> DocumentReader:
    """The library's own reader: a whole handbook, not a chat attachment. 2,000,000 characters
    is ~800 pages of prose; a 100-page PDF reads in ~4 s of one core (pypdf), niced to 10
    beside busy chats: the wall-clock limit leaves it room to wait for the cores."""
    limits = DocumentLimits(max_bytes=cfg.document_max_mb * MiB, max_pages=cfg.document_max_pages,
                            max_chars=2_000_000, wall_s=max(120.0, cfg.document_timeout_s),
                            cpu_s=max(30, int(cfg.document_timeout_s / 2)), nice=10)
    return DocumentReader(limits, workers=1, queue=4)


def engine_busy(engine: Engine) -> bool:
    """The chat engine has turns running or waiting (its published snapshot, any thread)."""
    snap = engine.snapshot
    return snap.running > 0 or bool(snap.waiting)


def shared_library(database_url: str) -> SharedLibrary | None:
    """The library's tables on PostgreSQL (database_url), connected when first used."""
    if not database_url:
        return None

    def connect() -> Database:
        from appliance.store.postgres import PgDatabase  # psycopg only where it is asked for
        return PgDatabase(database_url, (MIGRATIONS,), NAMING)
    return SharedLibrary(connect)


def build_library(cfg: Config, engine: Engine) -> tuple[Library | None, EmbedService | None]:
    if not cfg.library:
        return None, None
    try:
        service = EmbedService(embedding_model_path(fetch=False))
    except ModelFileError as e:
        log.error("library and /v1/embeddings off: %s", e)
        return None, None
    try:
        store = LibraryStore(Path(cfg.state_dir) if cfg.state_dir else None, cache=bool(cfg.database_url))
    except StoreError as e:
        log.error("library off (/v1/embeddings stays on): %s", e)
        return None, service
    limits = LibraryLimits(budget_tokens=cfg.library_budget_tokens, translate=cfg.library_translate)
    library = Library(store, library_reader(cfg), service.embed, service.embed_sync, limits,
                      unknown_share=service.unknown_share, busy=lambda: engine_busy(engine),
                      shared=shared_library(cfg.database_url), sync_s=cfg.library_sync_s)
    return library, service
