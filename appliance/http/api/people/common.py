"""What every people route needs: the people of this box (a 404 in open mode), the person
asking, a JSON body read under the parse gate, and an account's errors as HTTP ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, TypeVar

from starlette.requests import Request

from appliance.errors import BadRequest, NotFound, Unauthorized, Unavailable
from appliance.http.guard import Caller, caller_of
from appliance.http.intake import gated, read_body
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import parse_json
from appliance.people.accounts import Account, AccountError, Accounts
from appliance.people.chats import Chats, storable
from appliance.people.passwords import PasswordRejected

T = TypeVar("T")


def people_of(app: App) -> People:
    if app.people is None:
        raise NotFound("people mode is off: set auth = \"people\" to keep accounts and chats on this box",
                       code="people_mode_off")
    return app.people


def accounts_of(app: App) -> Accounts:
    people = people_of(app)
    if people.accounts is None:
        raise Unavailable(f"the people store cannot be used: {people.store_trouble}", code="store_unavailable")
    return people.accounts


def chats_of(app: App) -> Chats:
    accounts_of(app)
    assert app.people is not None and app.people.chats is not None
    app.people.prune_due()  # chat_retention_days: at most once an hour, on a worker thread
    return app.people.chats


def signed_in(app: App, request: Request) -> tuple[Caller, Account]:
    people_of(app)  # open mode: a 404 saying so, before "sign in first"
    caller = caller_of(request.scope["state"])
    if caller.account is None:
        raise Unauthorized("sign in first", code="not_signed_in")
    return caller, caller.account


async def body(app: App, request: Request) -> dict[str, Any]:
    async with gated(app, request, read_body) as (_, raw):
        return parse_json(raw)


def text(data: dict[str, Any], key: str, default: str | None = None, longest: int = 1024) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string", param=key)
    if len(value) > longest:
        raise BadRequest(f"'{key}' has at most {longest} characters", param=key)
    if not storable(value):
        raise BadRequest(f"'{key}' holds a NUL or an unpaired surrogate", param=key)
    return value


@contextmanager
def account_errors() -> Any:
    """AccountError -> 400 with its words (the store's own errors carry their status: 503, 409)."""
    try:
        yield
    except (AccountError, PasswordRejected) as e:
        raise BadRequest(str(e), code="invalid_value") from None


async def run_hash(app: App, fn: Callable[..., T], *args: Any) -> T:
    """fn (a sign-in, an invite, a password change: each hashes once) on the hash thread; a
    429 (signin_busy) while HASH_QUEUE others are queued for it or running."""
    hashing = people_of(app).hashing()
    with account_errors():
        return await hashing.run(fn, *args)


async def run(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """fn on a worker thread (the store is a file, the hash takes 0.2 s), its errors as HTTP's."""
    with account_errors():
        return await asyncio.to_thread(fn, *args, **kw)
