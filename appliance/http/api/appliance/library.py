"""The library's routes. /v1/library: what a caller may read (the office's documents, and in
people mode their own), and a signed-in person's own documents added, replaced and deleted.
/admin/library: the office's documents, for the operator (guard.py: this machine or an
admin). A file is sent as the body itself, as /v1/documents/text takes it; it is read in
the sandboxed worker and indexed in the background (202, then poll until "ready").
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest, NotFound
from appliance.http.api.appliance.documents import file_name, upload_reader
from appliance.http.guard import Caller, caller_of
from appliance.http.intake import gated
from appliance.http.state import App
from appliance.library.scopes import own, readable, required
from appliance.library.store import OFFICE, DocRow

MAX_TITLE = 200


def added_by(caller: Caller) -> str:
    if caller.account is not None:
        return caller.account.name
    if caller.key is not None:
        return caller.key.label or "an API key"
    return "the operator"


def _person(caller: Caller) -> str | None:
    """The signed-in person's id, whose scopes library/scopes.py decides (None: nobody)."""
    return caller.account.id if caller.account is not None else None


def _title(request: Request) -> str:
    title = request.query_params.get("title", "").strip()
    if len(title) > MAX_TITLE:
        raise BadRequest(f"'title' may have at most {MAX_TITLE} characters", param="title")
    return title


def _listing(rows: list[DocRow]) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [r.to_json() for r in rows]})


async def _add(app: App, request: Request, scope: str, replacing: DocRow | None) -> Response:
    library = required(app.library)
    name, title = file_name(request), _title(request)
    if not name:
        raise BadRequest("name the file: an X-File-Name header or ?name=", param="name")
    async with gated(app, request, upload_reader(library.reader.limits.max_bytes)) as (caller, data):
        pass  # the body is in: the parse places go back before the file is read (seconds, in the
        # library reader's own bounded worker queue: 429 documents_busy beyond it)
    row = await library.add(scope, added_by(caller), name, request.headers.get("content-type", ""), data,
                            title, replacing)
    return JSONResponse(row.to_json(), status_code=202)


async def _one(app: App, request: Request, scope: str) -> Response:
    library = required(app.library)
    row = await asyncio.to_thread(library.document, request.path_params["doc"], scope)
    if row is None:
        raise NotFound("no such document in this library", code="document_not_found")
    if request.method == "GET":
        return JSONResponse(row.to_json())
    if request.method == "PUT":
        return await _add(app, request, scope, row)
    await library.delete(row)
    return Response(status_code=204)


async def collection(app: App, request: Request) -> Response:
    """GET /v1/library: the documents the caller may read; POST: a person's own document."""
    caller = caller_of(request.scope["state"])
    if request.method == "GET":
        return _listing(await asyncio.to_thread(required(app.library).documents, readable(_person(caller))))
    return await _add(app, request, own(_person(caller)), None)


async def one(app: App, request: Request) -> Response:
    """GET, PUT (a new file, indexed again) or DELETE one of the caller's own documents."""
    caller = caller_of(request.scope["state"])
    if request.method == "GET":  # an office document too, as the caller reads it
        for scope in readable(_person(caller)):
            row = await asyncio.to_thread(required(app.library).document, request.path_params["doc"], scope)
            if row is not None:
                return JSONResponse(row.to_json())
        raise NotFound("no such document in this library", code="document_not_found")
    return await _one(app, request, own(_person(caller)))


async def office(app: App, request: Request) -> Response:
    """GET /admin/library: the office's documents; POST: add one."""
    if request.method == "GET":
        return _listing(await asyncio.to_thread(required(app.library).documents, [OFFICE]))
    return await _add(app, request, OFFICE, None)


async def office_one(app: App, request: Request) -> Response:
    return await _one(app, request, OFFICE)
