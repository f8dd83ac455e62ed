"""Every route declares what it is (http/routing.py): its API, who may call it, its body and its
rate limit; the guard reads those declarations, so a route that declares nothing, or a path the
guard would hold to the wrong rule, is caught here rather than left a hole."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CTX, MODEL_ID, REPLY, error_of
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.app import create_app
from appliance.http.guard import Guard, GuardPolicy
from appliance.http.keys import KeyRing
from appliance.http.routing import Access, Api, Body, DeclaredRoute, Rule, rule_for, rule_of
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.http.wire import openai_error

KEY = "user-key-" + "u" * 24
APIS = {"openai", "ollama", "anthropic", "llama", "appliance", "people"}


def the_app(keys: KeyRing | None = None) -> Starlette:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=CTX, max_wait_s=0.0, max_queue=8)
    engine = Engine(lambda: FakeModel(reply=REPLY), EngineOptions(limits, CachePolicy(n_seq=6)))
    bounds = RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=CTX)
    return create_app(App(engine, MODEL_ID, bounds, guard=GuardPolicy.build(keys or KeyRing())))


def undeclared(routes: list[BaseRoute]) -> list[str]:
    """Routes that declare nothing, or an API, access or body the guard does not know."""
    bad = []
    for route in routes:
        rule = rule_of(route)
        if not isinstance(rule, Rule) or rule.api.name not in APIS or not isinstance(rule.access, Access) \
                or not isinstance(rule.body, Body):
            bad.append(getattr(route, "path", repr(route)))
    return bad


def declared(path: str, method: str = "GET") -> Rule:
    """The rule the guard holds a request for `path` to."""
    return rule_for(the_app().routes, {"type": "http", "method": method, "path": path, "root_path": ""})


def test_every_route_declares_its_api_access_and_body() -> None:
    routes = the_app().routes
    assert len(routes) > 60 and undeclared(routes) == []
    paths = [getattr(r, "path", "") for r in routes]
    assert len(paths) == len(set(paths)), "a path declared twice: the second is never reached"
    assert "/static" in paths


def test_the_check_sees_a_route_that_declares_nothing_or_an_unknown_access() -> None:
    async def nothing(request: Request) -> Response:
        return PlainTextResponse("")

    bogus = Rule(Api("openai", openai_error), "key-ish")  # type: ignore[arg-type]
    assert undeclared([Route("/plain", nothing), DeclaredRoute("/odd", nothing, methods=None, rule=bogus)]) \
        == ["/plain", "/odd"]


@pytest.mark.parametrize("path", ["/metrics", "/debug/steps", "/admin", "/admin/status", "/admin/usage.csv",
                                  "/admin/people", "/admin/people/p1", "/admin/people/p1/invite",
                                  "/admin/library", "/admin/library/d1"])
def test_the_operators_routes_are_admin_only(path: str) -> None:
    assert declared(path).access is Access.ADMIN


def test_what_the_prefix_tables_held_each_route_still_declares() -> None:
    # Every route the old tables put under the API (/v1/, /api/, llama-server's paths, OpenAI's
    # without /v1) needs a key, and its changes count against the rate limit; a share link is
    # its own kind; /auth/ and the page are open; sign-in and invites make a session.
    for route in the_app().routes:
        path, rule = getattr(route, "path", ""), rule_of(route)
        assert rule is not None
        if path.startswith(("/v1/", "/api/", "/tokenize", "/detokenize", "/infill", "/completion", "/chat/",
                            "/models", "/responses", "/props", "/slots", "/embeddings")):
            assert rule.access is (Access.SHARED if path == "/v1/shared" else Access.API) and rule.limited, path
        elif path.startswith(("/metrics", "/debug/", "/admin")):
            assert rule.access is Access.ADMIN and not rule.limited, path
        else:
            assert rule.access in (Access.OPEN, Access.SIGNIN) and not rule.limited, path
    assert {p for p in ("/auth/signin", "/auth/invite", "/auth/invite/accept") if declared(p, "POST").fresh_session} \
        == {"/auth/signin", "/auth/invite", "/auth/invite/accept"}
    assert not declared("/auth/password", "POST").fresh_session


def test_uploads_and_error_shapes_are_declared_by_the_route() -> None:
    uploads = {getattr(r, "path", "") for r in the_app().routes if (rule := rule_of(r)) and rule.body is Body.UPLOAD}
    assert uploads == {"/v1/documents/text", "/v1/library", "/v1/library/{doc}", "/admin/library",
                       "/admin/library/{doc}"}
    assert {declared(p, "POST").api.name for p in ("/api/embed", "/api/embeddings", "/api/chat")} == {"ollama"}
    assert declared("/v1/messages/count_tokens", "POST").api.name == "anthropic"


@contextmanager
def keyed(tmp_path: Path) -> Iterator[TestClient]:
    (tmp_path / "keys").write_text(f"{KEY} alice\n")
    app = the_app(KeyRing(str(tmp_path / "keys")))
    yield TestClient(app, base_url="http://192.168.1.5:8080", client=("192.168.1.20", 4000))


def test_a_refusal_takes_the_shape_of_the_routes_api(tmp_path: Path) -> None:
    with keyed(tmp_path) as c:
        r = c.post("/api/embed", json={"input": "x"})
        assert r.status_code == 401 and set(r.json()) == {"error"} and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/messages", json={})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert error_of(c.post("/v1/chat/completions", json={}), 401)["code"] == "invalid_api_key"
        # A method the route does not take is still held to its route's rule (then the router's 405).
        r = c.get("/api/chat")
        assert r.status_code == 401 and set(r.json()) == {"error"}
        assert c.get("/api/chat", headers={"Authorization": f"Bearer {KEY}"}).status_code == 405


def test_embeddings_without_v1_need_a_key_like_the_rest_of_the_api(tmp_path: Path) -> None:
    # It was missing from the guard's old table of paths: it answered without a key.
    with keyed(tmp_path) as c:
        assert error_of(c.post("/embeddings", json={"input": "x"}), 401)["code"] == "invalid_api_key"
        error_of(c.post("/embeddings", json={"input": "x"}, headers={"Authorization": f"Bearer {KEY}"}), 404)


def test_a_path_no_route_matches_is_the_routers_404(tmp_path: Path) -> None:
    with keyed(tmp_path) as c:
        err = error_of(c.get("/v1/nope"), 404)
        assert "/v1/nope" in err["message"] and err["type"] == "invalid_request_error"
        error_of(c.post("/api/nope", json={}), 404)
        # A trailing slash the router would redirect is held to the route it redirects to.
        assert error_of(c.get("/v1/models/", follow_redirects=False), 401)["code"] == "invalid_api_key"
        assert error_of(c.get("/admin/", follow_redirects=False), 403)["code"] == "admin_only"


def test_a_route_that_declares_nothing_is_for_the_operator_only() -> None:
    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/plain", hello)],
                    middleware=[Middleware(Guard, policy=GuardPolicy.build(KeyRing()))])
    remote = TestClient(app, base_url="http://192.168.1.5:8080", client=("192.168.1.20", 4000))
    assert error_of(remote.get("/plain"), 403)["code"] == "admin_only"
    local = TestClient(app, base_url="http://localhost", client=("127.0.0.1", 4000))
    assert local.get("/plain").text == "hello"
