"""What a route declares about itself: its API (which picks its error shape), who may call it,
its body, and whether it counts against the rate limit. Each API folder lists its routes as
`Endpoint`s (`http/api/<api>/routes.py`), app.py turns them into Starlette routes that carry
their `Rule`, and the guard (guard.py) reads the rule of the route a request matches: a new
endpoint is one line in its API's folder, and a route cannot be left out of a table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Scope

from appliance.errors import ApplianceError
from appliance.http.wire import openai_error

ErrorBody = Callable[[ApplianceError], Response]
# A route's handler, given the App (state.App; Any here because state.py sits above the guard).
Handler = Callable[[Any, Request], Awaitable[Response]]
POST = ("POST",)


class Access(Enum):
    OPEN = "open"  # anyone past the Host and Origin checks: the page, /health, signing out
    API = "api"  # an API key or a signed-in person, when keys or people mode are on
    ADMIN = "admin"  # this machine, or an admin key or admin person
    # A share link: open in people mode (a link asked for signed out is the route's 404 like a
    # revoked one, not a 401 saying there is something behind the sign-in), else as API.
    SHARED = "shared"
    SIGNIN = "signin"  # makes a new session (sign-in, an invite): open, and no CSRF token yet


class Body(Enum):
    JSON = "json"  # a browser must send application/json (a form cannot, without a preflight)
    UPLOAD = "upload"  # a file: its own type (e.g. application/pdf), never one a form can send


@dataclass(frozen=True, slots=True)
class Api:
    """One API the server speaks, and how it writes an error (the guard's refusals too)."""
    name: str
    error: ErrorBody

    def route(self, path: str, handler: Handler, methods: Sequence[str] | None = None, *,
              access: Access = Access.API, body: Body = Body.JSON, limited: bool | None = None) -> Endpoint:
        """A route of this API; `limited` (its changes count against the per-client rate
        limit) is, unless given, true for the routes a key opens (API and SHARED)."""
        if limited is None:
            limited = access in (Access.API, Access.SHARED)
        return Endpoint(path, handler, tuple(methods) if methods else None, Rule(self, access, body, limited))


@dataclass(frozen=True, slots=True)
class Rule:
    api: Api
    access: Access
    body: Body = Body.JSON
    limited: bool = False  # a POST, PUT, PATCH or DELETE counts against the rate limit

    @property
    def fresh_session(self) -> bool:
        return self.access is Access.SIGNIN


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A route as its API folder declares it, before app.py binds it to the App."""
    path: str
    handler: Handler
    methods: tuple[str, ...] | None
    rule: Rule


class DeclaredRoute(Route):
    """A Starlette route that carries its rule."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, methods: Sequence[str] | None, rule: Rule) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.rule = rule


class DeclaredMount(Mount):
    """A Starlette mount (the static files) that carries its rule."""

    def __init__(self, path: str, app: ASGIApp, *, name: str, rule: Rule) -> None:
        super().__init__(path, app=app, name=name)
        self.rule = rule


# A path no route matches: the router's 404 (or a trailing slash's redirect), in OpenAI's shape
# as the app's HTTPException handler writes it; nothing is behind it, so no key is asked for.
UNMATCHED = Rule(Api("none", openai_error), Access.OPEN)
# A route that declares nothing (a test keeps there being none): only the operator may call it.
UNDECLARED = Rule(Api("undeclared", openai_error), Access.ADMIN)


def rule_of(route: BaseRoute) -> Rule | None:
    return route.rule if isinstance(route, (DeclaredRoute, DeclaredMount)) else None


def _match(routes: Sequence[BaseRoute], scope: Scope) -> BaseRoute | None:
    """The route the router will hand `scope` to: the first full match, else the first partial
    one (a path whose method is not taken: the router's 405)."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
        if match is Match.PARTIAL and partial is None:
            partial = route
    return partial


def rule_for(routes: Sequence[BaseRoute], scope: Scope) -> Rule:
    """The rule of the route a request reaches. A path that matches only with its trailing
    slash added or taken off is redirected there by the router: it is held to that route's rule."""
    route = _match(routes, scope)
    path = scope["path"]
    if route is None and path != "/":
        other = path[:-1] if path.endswith("/") else path + "/"
        route = _match(routes, {**scope, "path": other, "raw_path": other.encode()})
    if route is None:
        return UNMATCHED
    return rule_of(route) or UNDECLARED
