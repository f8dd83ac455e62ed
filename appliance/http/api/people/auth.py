"""Signing in and out: POST /auth/signin, /auth/signout, /auth/signout-everywhere,
/auth/password; GET /auth/me (who the page is, and its CSRF token); an invite's
POST /auth/invite and /auth/invite/accept (set a password, signed in).

A wrong name and a wrong password get the same words and status, and an unknown name costs
the same hash (passwords.verify). Attempts are limited before any hashing (people/signin.py).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import NotFound, QueueFull, Unauthorized
from appliance.http.api.people.common import accounts_of, body, people_of, run, run_hash, signed_in, text
from appliance.http.guard import caller_of
from appliance.http.identity import is_trusted
from appliance.http.people import clear_cookie, cookie_header
from appliance.http.state import App
from appliance.people.accounts import Account, Session
from appliance.people.signin import SignInLimiter


def person(account: Account) -> dict[str, Any]:
    return {"id": account.id, "name": account.name, "role": account.role.value, "quota": account.quota}


def _secure(app: App, request: Request) -> bool:
    """Reached over HTTPS: here, or at a trusted proxy that says so (as guard.py believes it)."""
    proxied = request.client is not None and is_trusted(request.client.host, app.guard.trusted_proxies)
    return request.url.scheme == "https" or (proxied and request.headers.get("x-forwarded-proto", "").lower() == "https")


def _session_response(app: App, request: Request, session: Session, token: str) -> Response:
    accounts = accounts_of(app)
    return JSONResponse({"person": person(session.account), "csrf": session.csrf},
                        headers={"Set-Cookie": cookie_header(token, int(accounts.session_s), _secure(app, request)),
                                 "Cache-Control": "no-store"})


async def me(app: App, request: Request) -> Response:
    if app.people is None:
        return JSONResponse({"mode": "open"})
    caller = caller_of(request.scope["state"])
    # What is wrong (a path, a host) only for the operator; everyone learns whether chats are saved.
    store = {"saving": not app.people.store_trouble,
             "error": (app.people.store_trouble or None) if caller.admin or caller.local else None}
    if caller.account is None:
        return JSONResponse({"mode": "people", "person": None, "store": store}, status_code=401,
                            headers={"Cache-Control": "no-store"})
    return JSONResponse({"mode": "people", "person": person(caller.account), "store": store,
                         "csrf": caller.session.csrf if caller.session else None}, headers={"Cache-Control": "no-store"})


async def signin(app: App, request: Request) -> Response:
    people, accounts = people_of(app), accounts_of(app)
    caller = caller_of(request.scope["state"])
    data = await body(app, request)
    name, password = text(data, "name", longest=256), text(data, "password")
    limited(people.limiter, caller.address, name)
    found = await run_hash(app, accounts.sign_in, name, password)
    if found is None:
        raise Unauthorized("wrong name or password", code="signin_failed")
    people.limiter.succeeded(caller.address, name)
    return _session_response(app, request, *found)


def limited(limiter: SignInLimiter, address: str, name: str) -> None:
    """Refuse (429) a guess over the limits; else count it as wrong until it proves right
    (counted before the hash, so tries made in parallel count too)."""
    wait = limiter.check(address, name)
    if wait is not None:
        raise QueueFull(f"too many wrong passwords from here: try again in {wait} s", retry_after=wait,
                        code="signin_rate_limited")
    limiter.failed(address, name)


async def signout(app: App, request: Request) -> Response:
    caller, account = signed_in(app, request)
    accounts = accounts_of(app)
    if request.url.path.endswith("everywhere"):
        await run(accounts.sign_out_everywhere, account.id)
    elif caller.session is not None:
        await run(accounts.sign_out, caller.session)
    return Response(status_code=204, headers={"Set-Cookie": clear_cookie(_secure(app, request))})


async def password(app: App, request: Request) -> Response:
    caller, _ = signed_in(app, request)
    if caller.session is None:
        raise Unauthorized("change your password from the page, signed in", code="not_signed_in")
    data = await body(app, request)
    current, new = text(data, "current"), text(data, "new")
    key = "\x00password:" + caller.session.account.id  # a guesser with a stolen cookie: the same limits
    limited(people_of(app).limiter, caller.address, key)
    session, token = await run_hash(app, accounts_of(app).change_password, caller.session, current, new)
    people_of(app).limiter.succeeded(caller.address, key)
    return _session_response(app, request, session, token)


async def invite(app: App, request: Request) -> Response:
    """POST /auth/invite {token}: whom the link is for; POST /auth/invite/accept {token,
    password}: set it and sign in. The token travels in the body, never in a path a proxy or
    an access log keeps."""
    accounts = accounts_of(app)
    data = await body(app, request)
    token = text(data, "token", longest=128)
    if not request.url.path.endswith("/accept"):
        account = await run(accounts.invited, token)
        if account is None:
            raise NotFound("this invite link is not valid any more: ask for a new one", code="invite_invalid")
        return JSONResponse({"name": account.name}, headers={"Cache-Control": "no-store"})
    session, new = await run_hash(app, accounts.accept, token, text(data, "password"))
    return _session_response(app, request, session, new)
