"""The process's services in the order they start, stopped in reverse (an AsyncExitStack in
Starlette's lifespan): the people store (its hash thread and pruner), the usage writer, the
engine, the embedding model, the library's indexer. The HTTP server is up before the model
loads: /health says "loading" meanwhile.

Reverse order is what shutdown needs: the library stops before the embedder it calls, the
engine before the usage writer that writes the last request's counts, and the usage writer
before the store it may write them to (database_url: several boxes' one table)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from appliance.http.state import App

log = logging.getLogger(__name__)


@asynccontextmanager
async def running(app: App) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        if app.store is not None:
            if app.store is app.people:
                app.store.start()  # its hash thread (a store kept only for the shared usage table hashes nothing)
            stack.push_async_callback(asyncio.to_thread, app.store.close)
        app.usage.ledger.start()  # the usage writer thread
        stack.push_async_callback(asyncio.to_thread, app.usage.ledger.close)  # after the last request's counts
        app.engine.start(asyncio.get_running_loop())
        stack.push_async_callback(asyncio.to_thread, app.engine.stop)
        start_library(app, stack)
        if app.announcer is not None:  # last, so its goodbye goes out first at shutdown
            app.announcer.start()  # announcing itself runs on its thread: the start never waits for the LAN
            stack.push_async_callback(asyncio.to_thread, app.announcer.stop)
        yield


def start_library(app: App, stack: AsyncExitStack) -> None:
    """The embedding model (~0.2 s to load) and the library's indexer; a failure turns both
    off with a journal line, and chats go on."""
    embedder, library = app.embedder, app.library
    try:
        if embedder is not None:
            embedder.start()
            stack.push_async_callback(asyncio.to_thread, embedder.stop)
        if library is not None:
            library.start()
            stack.push_async_callback(asyncio.to_thread, library.stop)
    except Exception as e:
        log.error("library and /v1/embeddings off: %s", e)
        if embedder is not None:
            embedder.stop()  # its threads and model, if it was the library that failed (stopping twice is harmless)
        app.library = app.embedder = None
