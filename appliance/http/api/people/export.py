"""GET /v1/me/export: everything of the signed-in person's, as one JSON file to keep: their
chats with every message and their own library documents (title, file name, and the text
the library read from them: it keeps no original file). Never anything of anyone else's:
every read below is by the caller's own id or scope. From the page only (a session): a
leaked key must not take a whole history in one request."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from appliance.errors import Unauthorized
from appliance.http.api.people.auth import person
from appliance.http.api.people.common import chats_of, run, signed_in
from appliance.http.state import App
from appliance.library.library import Library
from appliance.library.scopes import own
from appliance.store.database import Tx

FORMAT = 1


def _chats(app: App, pid: str) -> list[dict[str, Any]]:
    chats = chats_of(app)
    listed = chats.listed(pid)
    return [chat for c in listed if (chat := chats.get(pid, c["id"])) is not None]


def _text(library: Library, doc: str) -> str:
    # The passages in order, as the library cut the text (library/passages.py: no overlap).
    def read(tx: Tx) -> list[tuple[Any, ...]]:
        return tx.all("SELECT text FROM passages WHERE doc = ? ORDER BY seq", (doc,))
    return "\n\n".join(str(r[0]) for r in library.store.db.read(read))


def _documents(library: Library | None, pid: str) -> list[dict[str, Any]]:
    if library is None:
        return []
    return [{**row.to_json(), "text": _text(library, row.id)} for row in library.documents([own(pid)])]


async def export(app: App, request: Request) -> Response:
    caller, account = signed_in(app, request)
    if caller.session is None:
        raise Unauthorized("export your data from the page, signed in", code="not_signed_in")
    chats = await run(_chats, app, account.id)
    documents = await asyncio.to_thread(_documents, app.library, account.id)
    body = {"format": FORMAT, "exported_at": int(time.time()), "person": person(account), "chats": chats,
            "documents": documents}
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", account.name).strip("-") or "me"
    return Response(json.dumps(body, ensure_ascii=False, indent=1), media_type="application/json", headers={
        "Content-Disposition": f'attachment; filename="appliance-{name}.json"', "Cache-Control": "no-store"})
