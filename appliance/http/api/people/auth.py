"""Signing in and out: POST /auth/signin, /auth/signout, /auth/signout-everywhere,
/auth/password; GET /auth/me (who the page is, and its CSRF token); an invite's
GET and POST /auth/invite/{token} (set a password, signed in).

A wrong name and a wrong password get the same words and status, and an unknown name costs
the same hash (passwords.verify). Attempts are limited before any hashing (people/signin.py).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import NotFound, QueueFull, Unauthorized
from appliance.http.api.people.common import accounts_of, body, people_of, run, signed_in, text
from appliance.http.guard import caller_of
from appliance.http.people import clear_cookie, cookie_header
from appliance.http.state import App
from appliance.people.accounts import Account, Session


def person(account: Account) -> dict[str, Any]:
    return {"id": account.id, "name": account.name, "role": account.role.value, "quota": account.quota}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


def _session_response(app: App, request: Request, session: Session, token: str) -> Response:
    accounts = accounts_of(app)
    return JSONResponse({"person": person(session.account), "csrf": session.csrf},
                        headers={"Set-Cookie": cookie_header(token, int(accounts.session_s), _secure(request)),
                                 "Cache-Control": "no-store"})


async def me(app: App, request: Request) -> Response:
    if app.people is None:
        return JSONResponse({"mode": "open"})
    caller = caller_of(request.scope["state"])
    store = {"saving": not app.people.store_trouble, "error": app.people.store_trouble or None}
    if caller.account is None:
        return JSONResponse({"mode": "people", "person": None, "store": store}, status_code=401,
                            headers={"Cache-Control": "no-store"})
    return JSONResponse({"mode": "people", "person": person(caller.account), "store": store,
                         "csrf": caller.session.csrf if caller.session else None}, headers={"Cache-Control": "no-store"})


async def signin(app: App, request: Request) -> Response:
    people, accounts = people_of(app), accounts_of(app)
    caller = caller_of(request.scope["state"])
    data = await body(app, request)
    name, password = text(data, "name"), text(data, "password")
    wait = people.limiter.check(caller.address, name)
    if wait is not None:
        raise QueueFull(f"too many sign-in attempts for this name from here: try again in {wait} s",
                        retry_after=wait, code="signin_rate_limited")
    people.limiter.failed(caller.address, name)  # counted before the hash: parallel tries count too
    found = await run(accounts.sign_in, name, password)
    if found is None:
        raise Unauthorized("wrong name or password", code="signin_failed")
    people.limiter.succeeded(caller.address, name)
    return _session_response(app, request, *found)


async def signout(app: App, request: Request) -> Response:
    caller, account = signed_in(app, request)
    accounts = accounts_of(app)
    if request.url.path.endswith("everywhere"):
        await run(accounts.sign_out_everywhere, account.id)
    elif caller.session is not None:
        await run(accounts.sign_out, caller.session)
    return Response(status_code=204, headers={"Set-Cookie": clear_cookie(_secure(request))})


async def password(app: App, request: Request) -> Response:
    caller, _ = signed_in(app, request)
    if caller.session is None:
        raise Unauthorized("change your password from the page, signed in", code="not_signed_in")
    data = await body(app, request)
    session, token = await run(accounts_of(app).change_password, caller.session, text(data, "current"),
                               text(data, "new"))
    return _session_response(app, request, session, token)


async def invite(app: App, request: Request) -> Response:
    accounts = accounts_of(app)
    token = request.path_params["token"]
    if request.method == "GET":
        account = await run(accounts.invited, token)
        if account is None:
            raise NotFound("this invite link is not valid any more: ask for a new one", code="invite_invalid")
        return JSONResponse({"name": account.name}, headers={"Cache-Control": "no-store"})
    data = await body(app, request)
    session, new = await run(accounts.accept, token, text(data, "password"))
    return _session_response(app, request, session, new)
