"""A signed-in person's chats on the box: GET/POST /v1/chats (list, search with ?q=, create),
GET/PUT/PATCH/DELETE /v1/chats/{id} (PUT creates or replaces: the page names its chats), POST/DELETE /v1/chats/{id}/share, and GET
/v1/shared/{token} (a chat shared with the signed-in people of the box, read-only).
Anything not the caller's is a 404, the same as what never was.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest, Conflict, NotFound
from appliance.http.api.people.common import body, chats_of, run, signed_in, text
from appliance.http.guard import caller_of
from appliance.http.reach import origin
from appliance.http.state import App
from appliance.people.chats import CHAT_ID, MAX_MESSAGES, ChatChanged, Message

NO_CHAT = "no such chat"


def _messages(data: dict[str, Any]) -> list[Message]:
    raw = data.get("messages", [])
    if not isinstance(raw, list):
        raise BadRequest("'messages' must be a list", param="messages")
    if len(raw) > MAX_MESSAGES:
        raise BadRequest(f"a chat keeps at most {MAX_MESSAGES} messages", param="messages")
    try:
        return [Message.parse(m) for m in raw]
    except ValueError as e:
        raise BadRequest(str(e), param="messages") from None


def _meta(data: dict[str, Any]) -> dict[str, Any]:
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise BadRequest("'meta' must be an object", param="meta")
    return meta


def _cid(request: Request) -> str:
    cid = str(request.path_params["cid"])
    if not CHAT_ID.fullmatch(cid):
        raise NotFound(NO_CHAT, code="chat_not_found")
    return cid


def _no_store(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


async def collection(app: App, request: Request) -> Response:
    _, account = signed_in(app, request)
    chats = chats_of(app)
    if request.method == "GET":
        return _no_store({"chats": await run(chats.listed, account.id, request.query_params.get("q", ""))})
    data = await body(app, request)
    return _no_store(await run(chats.put, account.id, secrets.token_urlsafe(16), data.get("title", ""),
                               _messages(data), _meta(data)), 201)


async def one(app: App, request: Request) -> Response:
    _, account = signed_in(app, request)
    chats, cid = chats_of(app), _cid(request)
    if request.method == "GET":
        chat = await run(chats.get, account.id, cid)
        if chat is None:
            raise NotFound(NO_CHAT, code="chat_not_found")
        return _no_store(chat)
    if request.method == "DELETE":
        if not await run(chats.delete, account.id, cid):
            raise NotFound(NO_CHAT, code="chat_not_found")
        return Response(status_code=204)
    data = await body(app, request)
    if request.method == "PATCH":  # rename
        if not await run(chats.rename, account.id, cid, data.get("title", "")):
            raise NotFound(NO_CHAT, code="chat_not_found")
        return Response(status_code=204)
    base = data.get("base")
    if base is not None and (isinstance(base, bool) or not isinstance(base, int | float)):
        raise BadRequest("'base' is the chat's `updated` as last read, or null", param="base")
    try:
        return _no_store(await run(chats.put, account.id, cid, data.get("title", ""), _messages(data), _meta(data),
                                   base))
    except ChatChanged:
        raise Conflict("this chat was changed on another device: load it again", code="chat_changed") from None


async def share(app: App, request: Request) -> Response:
    _, account = signed_in(app, request)
    chats, cid = chats_of(app), _cid(request)
    if request.method == "DELETE":
        if not await run(chats.unshare, account.id, cid):
            raise NotFound(NO_CHAT, code="chat_not_found")
        return Response(status_code=204)
    token = await run(chats.share, account.id, cid)
    if token is None:
        raise NotFound(NO_CHAT, code="chat_not_found")
    base = origin(request, app.box)  # never a loopback address: the link is for someone else's device
    return _no_store({"token": token, "origin": base, "url": f"{base}/#share={token}"})


async def shared(app: App, request: Request) -> Response:
    """POST /v1/shared {token}: the token in the body, never in a path a log keeps."""
    chats = chats_of(app)
    if caller_of(request.scope["state"]).account is None:  # signed out: the same 404 as a revoked link
        raise NotFound("no such shared chat (the link may have been revoked)", code="chat_not_found")
    chat = await run(chats.shared, text(await body(app, request), "token", longest=128))
    if chat is None:
        raise NotFound("no such shared chat (the link may have been revoked)", code="chat_not_found")
    chat.pop("id", None)  # a reader gets the text, not the owner's handles on it (its id, its session)
    chat.pop("meta", None)
    return _no_store({**chat, "read_only": True})
