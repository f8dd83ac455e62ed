"""The library's routes. /v1/library: what a caller may read (the office's documents, and in
people mode their own), and a signed-in person's own documents added, replaced and deleted.
/admin/library: the office's documents, for the operator (guard.py: this machine or an
admin). A file is sent as the body itself, as /v1/documents/text takes it; it is read in
the sandboxed worker and indexed in the background (202, then poll until "ready").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest, ContextLengthExceeded, Forbidden, NotFound
from appliance.http.api.appliance.documents import file_name, upload_reader
from appliance.http.guard import Caller, caller_of
from appliance.http.intake import gated
from appliance.http.prompting import Ask, Prepared, prepare
from appliance.http.state import App
from appliance.library.cite import question_of, sources, with_sources
from appliance.library.library import Library
from appliance.library.store import OFFICE, DocRow, person_scope

MAX_TITLE = 200


def library_of(app: App) -> Library:
    if app.library is None:
        raise NotFound("the library is off on this box (library = false, or no embedding model)", code="library_off")
    return app.library


def scopes_of(caller: Caller) -> list[str]:
    """The scopes a caller reads: the office's, and a signed-in person's own."""
    return [OFFICE, person_scope(caller.account.id)] if caller.account is not None else [OFFICE]


def added_by(caller: Caller) -> str:
    if caller.account is not None:
        return caller.account.name
    if caller.key is not None:
        return caller.key.label or "an API key"
    return "the operator"


def _own_scope(caller: Caller) -> str:
    if caller.account is None:
        raise Forbidden("a document of one's own needs people mode and a signed-in person; the office's "
                        "documents are added in /admin", code="library_own_needs_people")
    return person_scope(caller.account.id)


def _title(request: Request) -> str:
    title = request.query_params.get("title", "").strip()
    if len(title) > MAX_TITLE:
        raise BadRequest(f"'title' may have at most {MAX_TITLE} characters", param="title")
    return title


def _listing(rows: list[DocRow]) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [r.to_json() for r in rows]})


async def _add(app: App, request: Request, scope: str, replacing: DocRow | None) -> Response:
    library = library_of(app)
    name, title = file_name(request), _title(request)
    if not name:
        raise BadRequest("name the file: an X-File-Name header or ?name=", param="name")
    async with gated(app, request, upload_reader(library.reader.limits.max_bytes)) as (caller, data):
        row = await library.add(scope, added_by(caller), name, request.headers.get("content-type", ""), data,
                                title, replacing)
    return JSONResponse(row.to_json(), status_code=202)


async def _one(app: App, request: Request, scope: str) -> Response:
    library = library_of(app)
    row = library.document(request.path_params["doc"], scope)
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
        return _listing(library_of(app).documents(scopes_of(caller)))
    return await _add(app, request, _own_scope(caller), None)


async def one(app: App, request: Request) -> Response:
    """GET, PUT (a new file, indexed again) or DELETE one of the caller's own documents."""
    caller = caller_of(request.scope["state"])
    if request.method == "GET":  # an office document too, as the caller reads it
        for scope in scopes_of(caller):
            row = library_of(app).document(request.path_params["doc"], scope)
            if row is not None:
                return JSONResponse(row.to_json())
        raise NotFound("no such document in this library", code="document_not_found")
    return await _one(app, request, _own_scope(caller))


async def office(app: App, request: Request) -> Response:
    """GET /admin/library: the office's documents; POST: add one."""
    if request.method == "GET":
        return _listing(library_of(app).documents([OFFICE]))
    return await _add(app, request, OFFICE, None)


async def office_one(app: App, request: Request) -> Response:
    return await _one(app, request, OFFICE)


Msgs = list[dict[str, Any]]


async def prepare_cited(app: App, caller: Caller, messages: Msgs, library: bool,
                        ask: Callable[[Msgs], Ask]) -> tuple[Prepared, list[dict[str, Any]] | None]:
    """The chat's prompt, with the library's sources when asked for (None: not asked). Sources
    that would not fit the context are left out whole, rather than the request refused for
    what the server added."""
    if not library:
        return await prepare(app.engine, ask(messages)), None
    cited_messages, cited = await consult(app, caller, messages)
    try:
        return await prepare(app.engine, ask(cited_messages)), cited
    except ContextLengthExceeded:
        if not cited:
            raise
        return await prepare(app.engine, ask(messages)), []


async def consult(app: App, caller: Caller, messages: Msgs) -> tuple[Msgs, list[dict[str, Any]]]:
    """A chat's `"library": true`: the passages that answer its last message among what the
    caller may read, put before the question in that message, and the sources to show."""
    library = library_of(app)
    question = question_of(messages)
    if question is None:
        return messages, []
    found = await library.search(scopes_of(caller), question)
    return with_sources(messages, found), sources(found)
