"""A request's body in: read within its bound (a JSON body's, or a document's own reader)
and parsed, under the parse gate, which stays held while the front-end builds its prompt
(prompting.prepare): reading, parsing and tokenizing are bounded per client and in all
before they start. A refusal raised here is counted where every route's is (app.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from starlette.requests import Request

from appliance.errors import ApplianceError, PayloadTooLarge
from appliance.http.guard import Caller, caller_of
from appliance.http.lanes import lane_of
from appliance.http.state import App
from appliance.http.validate import MAX_BODY_BYTES, parse_json, precheck

THREAD_PARSE_BYTES = 64 * 1024  # larger bodies are parsed off the event loop
T = TypeVar("T")


@asynccontextmanager
async def intake(app: App, request: Request, parse: Callable[[dict[str, Any]], T]) -> AsyncIterator[tuple[Caller, T]]:
    """The caller and its body, read and parsed (`parse` validates the JSON object) under the
    parse gate; the gate stays held for the block, where the front-end builds its prompt
    (prompting.prepare)."""
    async with gated(app, request, read_body) as (caller, body):
        precheck(body, app.bounds.max_messages)  # a few ms for 4 MiB, and no GIL held for long

        def parsed() -> T:
            data = parse_json(body)
            if isinstance(data, dict):  # the lane the job will run in (respond reads it)
                request.scope.setdefault("state", {})["lane"] = lane_of(caller, request.headers, data)
            return parse(data)

        # A 4 MiB body takes tens of ms to parse and check: not on the event loop.
        yield caller, await asyncio.to_thread(parsed) if len(body) > THREAD_PARSE_BYTES else parsed()


@asynccontextmanager
async def gated(app: App, request: Request, read: Callable[[Request], Awaitable[bytes]]) -> AsyncIterator[tuple[Caller, bytes]]:
    """The caller and its body as `read` reads it, under the parse gate: reading, parsing and
    tokenizing are bounded per client and in all before they start. The body arrives under
    the client's own places only, and the shared pool is taken once it is in, so a slow
    sender (weak Wi-Fi, or on purpose) holds nothing another client needs (throttle.py).
    A JSON body is read by read_body; a document's file by its own reader
    (api/appliance/documents.py)."""
    caller = caller_of(request.scope["state"])
    async with app.gate.own(caller.client):
        body = await read(request)
        async with app.gate.shared():
            yield caller, body


async def read_body(request: Request) -> bytes:
    return await read_capped(request, MAX_BODY_BYTES, lambda: PayloadTooLarge(
        f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", code="body_too_large"))


async def read_capped(request: Request, max_bytes: int, too_large: Callable[[], ApplianceError]) -> bytes:
    """The body, refused from its Content-Length before any byte is read, or as soon as the
    stream passes the cap (a chunked upload declares no length)."""
    declared = request.headers.get("content-length") or "0"
    if not declared.isdigit() or int(declared) > max_bytes:
        raise too_large()
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise too_large()
    return bytes(body)
