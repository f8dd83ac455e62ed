"""The front door: checks every HTTP request meets before any route runs (ASGI middleware).

In order: a Host this machine answers for (the DNS rebinding guard, 421); no foreign Origin
(403), and a browser POST must be JSON (415) so a web page cannot send a "simple" request
without a CORS preflight (a document upload may carry its file's type, never a simple one);
an API key on the API when keys are on (401); operator routes (/metrics, /debug/,
/admin) only from this machine or with an admin key (403); the per-client request rate (429). Every
response carries the page's security headers. The caller's identity is left in
`scope["state"]["caller"]` for the routes.

What a path needs is what its route declares (routing.Rule: access, body, rate limit, and the
API whose error shape a refusal takes), read from the routes of the Starlette app the guard
sits in: the guard holds no table of paths.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from appliance.errors import ApplianceError, Forbidden, MisdirectedRequest, QueueFull, Unauthorized, UnsupportedMediaType
from appliance.http.identity import Network, client_identity, is_trusted
from appliance.http.keys import Key, KeyRing, bearer
from appliance.http.people import CHANGES, People, csrf_ok
from appliance.http.routing import Access, Body, Rule, rule_for
from appliance.http.throttle import RateLimiter
from appliance.people.accounts import Account, Session

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# What a browser may not send to a JSON route: the "simple" types a cross-site form sends
# without a preflight (an upload may carry its file's type, never one of these).
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""})
_DEFAULT_PORT = {"http": 80, "https": 443, "ws": 80, "wss": 443}


# The person a trusted front-end says it is asking for: Open WebUI's forwarded user headers
# (ENABLE_FORWARD_USER_INFO_HEADERS) and the X-Forwarded-User / -Email pair that signing-in
# proxies (oauth2-proxy, Authelia) set. Read from trusted_proxies only: from anyone else they
# are the client's own words and are ignored.
PERSON_ID_HEADERS = ("x-openwebui-user-id", "x-forwarded-user")
PERSON_LABEL_HEADERS = ("x-openwebui-user-email", "x-forwarded-email", "x-openwebui-user-name")
PERSON_MAX = 128  # characters: longer ids are cut (they name a row, they are not a secret)


@dataclass(frozen=True, slots=True)
class Person:
    id: str  # the front-end's stable id for the person
    label: str  # what usage rows and /admin call them (e-mail, else name, else the id)


def forwarded_person(headers: Headers) -> Person | None:
    """The person a trusted front-end names, or None. Control characters are dropped, so a
    forwarded name cannot write lines into the journal or the usage export."""
    def clean(v: str) -> str:
        return "".join(ch for ch in v if ch.isprintable()).strip()[:PERSON_MAX]

    pid = next((v for h in PERSON_ID_HEADERS if (v := clean(headers.get(h, "")))), "")
    if not pid:
        return None
    label = next((v for h in PERSON_LABEL_HEADERS if (v := clean(headers.get(h, "")))), pid)
    return Person(pid, label)


@dataclass(frozen=True, slots=True)
class Caller:
    address: str  # the client's address (as forwarded by a trusted proxy)
    key: Key | None  # the API key it presented, when keys are on
    person: Person | None = None  # named by a trusted front-end (forwarded_person)
    account: Account | None = None  # signed in to this box (people mode): by cookie or their own key
    session: Session | None = None  # when by cookie: changes must carry its CSRF token

    @property
    def client(self) -> str:
        """The identity for KV reuse, fairness and limits: the person signed in (on any device),
        else the key, else the address; a person a trusted front-end names is one client of
        their own within it."""
        if self.account is not None:
            return "person:" + self.account.id
        base = self.key.identity if self.key else self.address
        return f"{base}/person:{self.person.id}" if self.person else base

    @property
    def front_end(self) -> str:
        """The trusted front-end asking for a person it names ("" otherwise): the tools it
        sends all its people are its own, not a person's (engine/kv/commons)."""
        if self.person is None:
            return ""
        return self.key.identity if self.key else self.address

    @property
    def namespace(self) -> str:
        """Sessions live per key (and per forwarded or signed-in person), so another key or
        person cannot reach them ("" without keys or persons)."""
        if self.account is not None:
            return "person:" + self.account.id
        base = self.key.identity if self.key else ""
        return f"{base}/person:{self.person.id}" if self.person else base

    @property
    def admin(self) -> bool:
        return (self.key is not None and self.key.admin) or (self.account is not None and self.account.admin)

    @property
    def local(self) -> bool:
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return False


def machine_names() -> frozenset[str]:
    """This machine's own names, as an office reaches it: host name, FQDN and NAME.local."""
    names = {socket.gethostname(), socket.getfqdn()}
    names |= {n.split(".")[0] + ".local" for n in list(names) if n}
    return frozenset(n.lower() for n in names if n)


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    keys: KeyRing
    trusted_proxies: tuple[Network, ...] = ()
    allowed_hosts: frozenset[str] = frozenset()  # lower case; ".example.com" = any subdomain; "*" = any
    allowed_origins: frozenset[str] = frozenset()  # exact "scheme://host[:port]"
    host_names: frozenset[str] = frozenset()  # this machine's names
    rate_limit_per_s: float = 0.0
    people: People | None = None  # people mode: the API needs a signed-in person (or a key)

    @classmethod
    def build(cls, keys: KeyRing, trusted_proxies: tuple[Network, ...] = (), allowed_hosts: Iterable[str] = (),
              allowed_origins: Iterable[str] = (), rate_limit_per_s: float = 0.0,
              people: People | None = None) -> GuardPolicy:
        return cls(keys, trusted_proxies, frozenset(h.lower().rstrip(".") for h in allowed_hosts),
                   frozenset(o.lower().rstrip("/") for o in allowed_origins), machine_names(), rate_limit_per_s,
                   people)


def split_host(value: str) -> tuple[str, int | None]:
    """'Example.com:8080' -> ('example.com', 8080); '[::1]:80' -> ('::1', 80); bad port -> ('', None)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    if port and not port.isdigit():
        return "", None
    return host.rstrip("."), int(port) if port else None


def host_allowed(host: str, policy: GuardPolicy) -> bool:
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True  # an IP literal cannot be rebound
    except ValueError:
        pass
    if host == "localhost" or host.endswith(".localhost") or host in policy.host_names:
        return True
    allowed = policy.allowed_hosts
    return "*" in allowed or host in allowed or any(a.startswith(".") and host.endswith(a) for a in allowed)


def _origin(value: str) -> tuple[str, str, int | None]:
    scheme, sep, rest = value.strip().lower().partition("://")
    if not sep:
        return "", "", None
    host, port = split_host(rest.split("/", 1)[0])
    return scheme, host, port if port is not None else _DEFAULT_PORT.get(scheme)


def same_origin(origin: str, host_header: str, scheme: str) -> bool:
    """The page's own origin: the Origin's scheme, host and port are the request's."""
    o_scheme, o_host, o_port = _origin(origin)
    host, port = split_host(host_header)
    if port is None:
        port = _DEFAULT_PORT.get(scheme)
    return bool(o_host) and (o_scheme, o_host, o_port) == (scheme.lower(), host, port)


class Guard:
    def __init__(self, app: ASGIApp, policy: GuardPolicy, on_refuse: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic,
                 on_limited: Callable[[Caller, ApplianceError], None] = lambda caller, err: None) -> None:
        self.app = app
        self.policy = policy
        self.on_refuse = on_refuse
        self.on_limited = on_limited  # a known caller refused for its rate (its usage counts it)
        self.rate = RateLimiter(policy.rate_limit_per_s, clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        cors = origin is not None and origin.lower().rstrip("/") in self.policy.allowed_origins
        token = self._token(headers)
        key = self.policy.keys.find(token) if token and self.policy.keys.enabled else None
        peer = scope["client"][0] if scope.get("client") else ""
        account, session = await self.policy.people.resolve(
            headers, None if key else token, is_trusted(peer, self.policy.trusted_proxies)) \
            if self.policy.people is not None else (None, None)
        rule = rule_for(self._routes(scope), scope)
        try:
            caller = self._check(scope, headers, origin, cors, rule, Caller("", key, None, account, session))
        except ApplianceError as err:
            await self._refuse(err, rule, scope, receive, send, origin if cors else None)
            return
        if cors and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(scope, receive, send, origin or "")
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, _with_headers(send, origin if cors else None))

    @staticmethod
    def _routes(scope: Scope) -> list[BaseRoute]:
        # The routes of the Starlette app the guard is a middleware of (it sets scope["app"]).
        app = scope.get("app")
        assert isinstance(app, Starlette), "the Guard runs as a middleware of the Starlette app"
        return app.routes

    def _check(self, scope: Scope, headers: Headers, origin: str | None, cors: bool, rule: Rule,
               who: Caller) -> Caller:
        p = self.policy
        peer = scope["client"][0] if scope.get("client") else ""
        proxied = is_trusted(peer, p.trusted_proxies)
        self._check_site(scope, headers, origin, cors, rule, proxied)
        caller = Caller(client_identity(peer, headers.get("x-forwarded-for"), p.trusted_proxies), who.key,
                        forwarded_person(headers) if proxied and who.account is None else None, who.account, who.session)
        self._check_caller(scope, headers, cors, rule, caller)
        return caller

    def _check_site(self, scope: Scope, headers: Headers, origin: str | None, cors: bool, rule: Rule,
                    proxied: bool) -> None:
        """The request is for this machine, from its own page (or an allowed origin), in a body
        a cross-site form cannot send."""
        host_header = (headers.get("x-forwarded-host") if proxied else None) or headers.get("host", "")
        host, _ = split_host(host_header.split(",")[0])
        if not host_allowed(host, self.policy):
            raise self._no("bad_host", MisdirectedRequest(
                "this server does not answer for that host name; an operator can add it to allowed_hosts",
                code="host_not_allowed"))
        if origin is not None and not cors:
            scheme = (headers.get("x-forwarded-proto") if proxied else None) or scope.get("scheme", "http")
            if not same_origin(origin, host_header, scheme):
                raise self._no("bad_origin", Forbidden(
                    "cross-site requests are refused; an operator can add the origin to allowed_origins",
                    code="origin_not_allowed"))
        if origin is not None and scope["method"] in ("POST", "PUT", "PATCH"):
            mime = headers.get("content-type", "").split(";")[0].strip().lower()
            upload = rule.body is Body.UPLOAD
            if (mime in SIMPLE_TYPES) if upload else mime != "application/json":
                want = "the file's own type (e.g. application/pdf), not a form's" if upload else "application/json"
                raise self._no("bad_content_type", UnsupportedMediaType(
                    f"a request from a web page must send Content-Type: {want}", code="unsupported_media_type"))

    def _check_caller(self, scope: Scope, headers: Headers, cors: bool, rule: Rule, caller: Caller) -> None:
        """The caller may call this route (its key, its session's CSRF token, admin) at this rate."""
        p, method = self.policy, scope["method"]
        keyed = rule.access is Access.API or (rule.access is Access.SHARED and not p.people)
        preflight = method == "OPTIONS" and cors
        if (p.keys.enabled or p.people) and keyed and caller.key is None and caller.account is None and not preflight:
            raise self._no("no_key", Unauthorized(
                "sign in first, or send `Authorization: Bearer KEY` (a key from your settings page)" if p.people
                else "an API key is needed: send `Authorization: Bearer KEY`", code="invalid_api_key"))
        if caller.session is not None and method in CHANGES and not rule.fresh_session \
                and not csrf_ok(caller.session, headers):
            raise self._no("csrf", Forbidden(
                "this change needs the page's X-CSRF-Token (reload the page)", code="csrf_token"))
        if rule.access is Access.ADMIN and not (caller.local or caller.admin):
            raise self._no("admin_only", Forbidden(
                "only from this machine, or with an admin API key", code="admin_only"))
        if method in CHANGES and rule.limited:  # a chat's PUT too, not only POSTs
            wait = self.rate.check(caller.client)
            if wait is not None:
                err = QueueFull(f"too many requests: at most {p.rate_limit_per_s:g} per second per client",
                                retry_after=wait, code="rate_limited")
                self.on_limited(caller, err)
                raise self._no("rate_limited", err)

    @staticmethod
    def _token(headers: Headers) -> str:
        # Or X-Api-Key, as llama-server takes it (what Anthropic's SDKs send).
        return bearer(headers.get("authorization")) or headers.get("x-api-key", "").strip()

    def _no(self, reason: str, err: ApplianceError) -> ApplianceError:
        self.on_refuse(reason)
        return err

    async def _refuse(self, err: ApplianceError, rule: Rule, scope: Scope, receive: Receive, send: Send,
                      origin: str | None) -> None:
        response = rule.api.error(err)  # in the shape of the API the route speaks
        if isinstance(err, Unauthorized):
            response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, _with_headers(send, origin))

    async def _preflight(self, scope: Scope, receive: Receive, send: Send, origin: str) -> None:
        response = Response(status_code=204, headers={
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": "Authorization, X-Api-Key, Content-Type, X-Session-Id, X-File-Name",
            "Access-Control-Max-Age": "600",
        })
        await response(scope, receive, _with_headers(send, origin))


def _with_headers(send: Send, cors_origin: str | None) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            h = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS.items():
                h.setdefault(name, value)
            if cors_origin:
                h["Access-Control-Allow-Origin"] = cors_origin
                h["Access-Control-Expose-Headers"] = "X-Session-Id, X-Dropped-Messages, Retry-After"
                h.add_vary_header("Origin")
        await send(message)

    return wrapped


def caller_of(scope_state: dict[str, Any]) -> Caller:
    caller = scope_state.get("caller")
    assert isinstance(caller, Caller), "the Guard middleware runs before every route"
    return caller
