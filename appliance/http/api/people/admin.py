"""The operator's list of people: GET/POST /admin/people (list; add, with a one-time invite
link and its QR code), PATCH/DELETE /admin/people/{id} (role, quota, disabled; remove with
everything of theirs, or ?only=chats), POST /admin/people/{id}/invite (a new link).
The operator sees names, roles and counts: never a chat, a key or a password.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest, NotFound
from appliance.http.api.people.auth import person
from appliance.http.api.people.common import accounts_of, body, chats_of, run, text
from appliance.http.reach import invite_link, origin
from appliance.http.state import App
from appliance.library.scopes import own
from appliance.people.accounts import Role

QUOTA_MAX = 2**31 - 1  # PostgreSQL's INTEGER


def _quota(data: dict[str, Any]) -> int | None:
    q = data.get("quota")
    if q is None or q == "":
        return None
    if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= QUOTA_MAX:
        raise BadRequest("'quota' is generated tokens a day: a whole number >= 0 (0 = none), or null for the default",
                         param="quota")
    return q


def _role(data: dict[str, Any]) -> Role:
    try:
        return Role(data.get("role", "user"))
    except ValueError:
        raise BadRequest("'role' is 'user' or 'admin'", param="role") from None


def _invite(app: App, request: Request, token: str) -> dict[str, str]:
    url = invite_link(origin(request, app.box), token)  # never a loopback address: a phone scans it
    import segno  # here: 9 MiB once imported, paid only by a box whose operator adds people
    return {"invite_url": url, "invite_qr_svg": segno.make(url, error="m").svg_inline(scale=4, border=2)}


async def collection(app: App, request: Request) -> Response:
    accounts = accounts_of(app)
    if request.method == "GET":
        rows = await run(accounts.people)
        return JSONResponse({"people": [{**person(a), "disabled": a.disabled, "invited": not a.has_password, **n}
                                        for a, n in rows]}, headers={"Cache-Control": "no-store"})
    data = await body(app, request)
    account, token = await run(accounts.add, text(data, "name"), _role(data), _quota(data))
    return JSONResponse({"person": person(account), **_invite(app, request, token)}, status_code=201,
                        headers={"Cache-Control": "no-store"})


async def one(app: App, request: Request) -> Response:
    accounts, pid = accounts_of(app), request.path_params["pid"]
    if request.method == "DELETE":
        if request.query_params.get("only") == "chats":
            await run(chats_of(app).delete_all, pid)
        else:
            await remove(app, pid)
        return Response(status_code=204)
    data = await body(app, request)
    disabled = data.get("disabled")
    if disabled is not None and not isinstance(disabled, bool):
        raise BadRequest("'disabled' is true or false", param="disabled")
    if await run(accounts.get, pid) is None:
        raise NotFound("no such person", code="person_not_found")
    account = await run(accounts.update, pid, role=_role(data) if "role" in data else None,
                        quota=_quota(data) if "quota" in data else False, disabled=disabled)
    return JSONResponse({**person(account), "disabled": account.disabled})


async def remove(app: App, pid: str) -> None:
    """The person and everything of theirs: sessions, keys, chats and shares (their rows, by the
    store's cascade), their own library documents, and the usage counted under their name (a
    new person given the name later starts from nothing)."""
    account = await run(accounts_of(app).get, pid)
    if account is None or not await run(accounts_of(app).remove, pid):
        raise NotFound("no such person", code="person_not_found")
    if app.library is not None:
        for row in await asyncio.to_thread(app.library.documents, [own(pid)]):
            await app.library.delete(row)
    app.usage.ledger.forget(account.name)


async def invite(app: App, request: Request) -> Response:
    accounts, pid = accounts_of(app), request.path_params["pid"]
    if await run(accounts.get, pid) is None:
        raise NotFound("no such person", code="person_not_found")
    return JSONResponse(_invite(app, request, await run(accounts.invite, pid)), headers={"Cache-Control": "no-store"})
