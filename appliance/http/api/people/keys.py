"""A signed-in person's own API keys for their tools: GET/POST /v1/me/keys and DELETE
/v1/me/keys/{id}. A key counts against its person's usage and quota; it is shown once."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import NotFound, Unauthorized
from appliance.http.api.people.common import accounts_of, body, run, signed_in, text
from appliance.http.state import App


async def collection(app: App, request: Request) -> Response:
    caller, account = signed_in(app, request)
    accounts = accounts_of(app)
    if request.method == "GET":
        return JSONResponse({"keys": await run(accounts.keys, account.id)}, headers={"Cache-Control": "no-store"})
    if caller.session is None:  # a key makes no keys: a leaked one cannot mint more
        raise Unauthorized("make keys from the page, signed in", code="not_signed_in")
    data = await body(app, request)
    listing, key = await run(accounts.new_key, account.id, text(data, "label", "key"))
    return JSONResponse({**listing, "key": key}, status_code=201, headers={"Cache-Control": "no-store"})


async def one(app: App, request: Request) -> Response:
    _, account = signed_in(app, request)
    if not await run(accounts_of(app).revoke_key, account.id, request.path_params["kid"]):
        raise NotFound("no such key", code="key_not_found")
    return Response(status_code=204)
