"""The front door: Host, Origin, Content-Type, API keys, operator routes, rate limit and
security headers, checked over a tiny app so each rule is seen on its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.testclient import TestClient

from appliance.http.api.ollama.routes import API as OLLAMA
from appliance.http.guard import Guard, GuardPolicy, caller_of, host_allowed, machine_names, same_origin, split_host
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing
from appliance.http.routing import Access, Api, DeclaredRoute, Rule
from appliance.http.wire import openai_error

USER_KEY, ADMIN_KEY = "user-key-" + "u" * 24, "admin-key-" + "a" * 24


def whoami(request: Request) -> Response:
    c = caller_of(request.scope["state"])
    return JSONResponse({"client": c.client, "address": c.address, "admin": c.admin, "namespace": c.namespace})


OPENAI = Api("openai", openai_error)
# What each path of the tiny app declares, as the real routes do (api/*/routes.py).
RULES = {"/": Rule(OPENAI, Access.OPEN), "/health": Rule(OPENAI, Access.OPEN),
         "/v1/x": Rule(OPENAI, Access.API, limited=True), "/api/chat": Rule(OLLAMA, Access.API, limited=True),
         "/metrics": Rule(OPENAI, Access.ADMIN), "/debug/steps": Rule(OPENAI, Access.ADMIN),
         **{p: Rule(OPENAI, Access.API, limited=True) for p in ("/tokenize", "/detokenize", "/infill")}}
ROUTES = [DeclaredRoute(p, whoami, methods=["GET", "POST", "DELETE"], rule=rule) for p, rule in RULES.items()]


@contextmanager
def guarded(address: str = "192.168.1.20", refusals: list[str] | None = None, clock: Any = None,
            **policy: Any) -> Iterator[TestClient]:
    keys = policy.pop("keys", KeyRing())
    proxies = parse_networks(policy.pop("trusted_proxies", ()))
    p = GuardPolicy.build(keys, proxies, **policy)
    kw = {"clock": clock} if clock else {}
    app = Starlette(routes=ROUTES, middleware=[
        Middleware(Guard, policy=p, on_refuse=(refusals if refusals is not None else []).append, **kw)])
    with TestClient(app, base_url="http://192.168.1.5:8080", client=(address, 4000)) as c:
        yield c


def error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


# -- Host ------------------------------------------------------------------------------------
def test_split_host() -> None:
    assert split_host("Example.COM:8080") == ("example.com", 8080)
    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("10.0.0.1") == ("10.0.0.1", None)
    assert split_host("host.:x") == ("", None)


@pytest.mark.parametrize("host", ["192.168.1.5:8080", "[fe80::1]:8080", "localhost:8080", "app.localhost",
                                  *sorted(machine_names())])
def test_hosts_this_machine_answers_for(host: str) -> None:
    refusals: list[str] = []
    with guarded(refusals=refusals) as c:
        assert c.get("/health", headers={"Host": host}).status_code == 200
    assert refusals == []


def test_a_foreign_host_is_421_naming_allowed_hosts() -> None:
    refusals: list[str] = []
    with guarded(refusals=refusals) as c:
        err = error(c.get("/v1/x", headers={"Host": "evil.example"}), 421)
        assert "allowed_hosts" in err["message"] and err["code"] == "host_not_allowed"
        error(c.get("/", headers={"Host": "evil.example:8080"}), 421)
    assert refusals == ["bad_host", "bad_host"]


def test_allowed_hosts_exact_and_suffix() -> None:
    p = GuardPolicy.build(KeyRing(), allowed_hosts=["chat.office.lan", ".corp.example"])
    assert host_allowed("chat.office.lan", p) and host_allowed("ai.corp.example", p)
    assert not host_allowed("corp.example.evil", p) and not host_allowed("office.lan", p)
    assert host_allowed("anything", GuardPolicy.build(KeyRing(), allowed_hosts=["*"]))


# -- Origin and Content-Type ---------------------------------------------------------------------
def test_same_origin() -> None:
    assert same_origin("http://192.168.1.5:8080", "192.168.1.5:8080", "http")
    assert same_origin("http://localhost", "localhost:80", "http")
    assert same_origin("https://box", "box", "https")
    assert not same_origin("http://box:8081", "box:8080", "http")
    assert not same_origin("https://box:8080", "box:8080", "http")
    assert not same_origin("null", "box", "http")


def test_the_pages_own_requests_pass() -> None:
    with guarded() as c:
        r = c.post("/v1/x", json={}, headers={"Origin": "http://192.168.1.5:8080"})
        assert r.status_code == 200
        assert c.delete("/v1/x", headers={"Origin": "http://192.168.1.5:8080"}).status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://192.168.1.5:9999", "https://192.168.1.5:8080"])
def test_a_foreign_origin_is_403(origin: str) -> None:
    with guarded() as c:
        err = error(c.post("/v1/x", json={}, headers={"Origin": origin}), 403)
        assert err["code"] == "origin_not_allowed" and "allowed_origins" in err["message"]
        error(c.get("/health", headers={"Origin": origin}), 403)


def test_a_simple_cross_site_post_is_refused_and_curl_is_not() -> None:
    page = {"Origin": "http://192.168.1.5:8080"}
    with guarded() as c:
        # What a form or a no-preflight fetch sends: text/plain with an Origin.
        err = error(c.post("/v1/x", content=b"{}", headers={**page, "Content-Type": "text/plain"}), 415)
        assert "application/json" in err["message"]
        error(c.post("/v1/x", content=b"{}", headers={**page, "Content-Type": "application/x-www-form-urlencoded"}), 415)
        # Without an Origin (curl, SDKs, Ollama's curl examples) any content type passes.
        assert c.post("/v1/x", content=b"{}", headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 200
        json_utf8 = {**page, "Content-Type": "application/json; charset=utf-8"}
        assert c.post("/v1/x", content=b"{}", headers=json_utf8).status_code == 200


def test_allowed_origins_get_cors_and_preflight() -> None:
    with guarded(allowed_origins=["https://tools.office.lan"]) as c:
        o = {"Origin": "https://tools.office.lan"}
        r = c.options("/v1/x", headers={**o, "Access-Control-Request-Method": "POST",
                                         "Access-Control-Request-Headers": "content-type"})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "https://tools.office.lan"
        r = c.post("/v1/x", json={}, headers=o)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://tools.office.lan"
        assert "X-Session-Id" in r.headers["access-control-expose-headers"]
        # CORS stays off for everyone else.
        assert "access-control-allow-origin" not in c.get("/health").headers


# -- API keys and operator routes --------------------------------------------------------------------
@pytest.fixture
def keys(tmp_path: Path) -> KeyRing:
    path = tmp_path / "keys"
    path.write_text(f"{USER_KEY} alice\n{ADMIN_KEY} admin\n")
    return KeyRing(str(path))


def test_keys_guard_the_api_but_not_the_page_or_health(keys: KeyRing) -> None:
    refusals: list[str] = []
    with guarded(keys=keys, refusals=refusals) as c:
        r = c.post("/v1/x", json={})
        err = error(r, 401)
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        error(c.post("/v1/x", json={}, headers={"Authorization": "Bearer wrong-key-xxxxxxxxxxxx"}), 401)
        # Ollama's paths answer in Ollama's error shape, a message string.
        r = c.post("/api/chat", json={}, headers={"Authorization": f"Basic {USER_KEY}"})
        assert r.status_code == 401 and r.json() == {"error": "an API key is needed: send `Authorization: Bearer KEY`"}
        me = c.post("/v1/x", json={}, headers={"Authorization": f"Bearer {USER_KEY}"}).json()
        assert me["client"].startswith("key:") and me["namespace"] == me["client"] and not me["admin"]
        assert me["address"] == "192.168.1.20"
        assert c.get("/").status_code == 200 and c.get("/health").status_code == 200
    assert refusals == ["no_key"] * 3


def test_a_key_in_x_api_key_counts_as_llama_server_takes_it(keys: KeyRing) -> None:
    with guarded(keys=keys) as c:
        me = c.post("/v1/x", json={}, headers={"X-Api-Key": USER_KEY}).json()
        assert me["client"].startswith("key:") and not me["admin"]
        error(c.post("/v1/x", json={}, headers={"X-Api-Key": "wrong-key-xxxxxxxxxxxx"}), 401)
        error(c.post("/v1/x", json={}, headers={"X-Api-Key": ""}), 401)
        assert c.get("/metrics", headers={"X-Api-Key": ADMIN_KEY}).status_code == 200


def test_llama_server_token_routes_need_a_key_like_the_api(keys: KeyRing) -> None:
    with guarded(keys=keys) as c:
        for path in ("/tokenize", "/detokenize", "/infill"):
            error(c.post(path, json={}), 401)
            assert c.post(path, json={}, headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 200


def test_operator_routes_from_this_machine_or_with_an_admin_key(keys: KeyRing) -> None:
    with guarded(keys=keys) as remote:
        for path in ("/metrics", "/debug/steps"):
            assert error(remote.get(path), 403)["code"] == "admin_only"
            error(remote.get(path, headers={"Authorization": f"Bearer {USER_KEY}"}), 403)
            assert remote.get(path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    with guarded(address="127.0.0.1") as local:
        assert local.get("/metrics").status_code == 200


def test_a_proxy_on_this_machine_does_not_make_remote_clients_local() -> None:
    with guarded(address="127.0.0.1", trusted_proxies=["127.0.0.1"]) as c:
        error(c.get("/metrics", headers={"X-Forwarded-For": "192.168.1.77"}), 403)
        assert c.get("/metrics").status_code == 200


# -- rate limit ---------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rate_limit_per_client_with_retry_after() -> None:
    clock = Clock()
    with guarded(rate_limit_per_s=2, clock=clock) as c:
        assert [c.post("/v1/x", json={}).status_code for _ in range(2)] == [200, 200]
        r = c.post("/v1/x", json={})
        err = error(r, 429)
        assert err["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1
        assert c.get("/health").status_code == 200  # reads are not counted
        clock.t += 0.5
        assert c.post("/v1/x", json={}).status_code == 200


def test_rate_limit_behind_a_trusted_proxy_counts_each_forwarded_client() -> None:
    clock = Clock()
    with guarded(address="10.0.0.2", trusted_proxies=["10.0.0.2"], rate_limit_per_s=1, clock=clock) as c:
        a, b = {"X-Forwarded-For": "192.168.1.30"}, {"X-Forwarded-For": "192.168.1.31"}
        assert c.post("/v1/x", json={}, headers=a).status_code == 200
        error(c.post("/v1/x", json={}, headers=a), 429)
        assert c.post("/v1/x", json={}, headers=b).status_code == 200
    with guarded(address="10.0.0.2", rate_limit_per_s=1, clock=clock) as c:
        # Not a trusted proxy: its X-Forwarded-For is the client's own claim, ignored.
        assert c.post("/v1/x", json={}, headers=a).status_code == 200
        error(c.post("/v1/x", json={}, headers=b), 429)


# -- a person named by a trusted front-end (Open WebUI's forwarded user headers) -----------------
OWUI = {"X-OpenWebUI-User-Id": "8f1c-alice", "X-OpenWebUI-User-Name": "Alice",
        "X-OpenWebUI-User-Email": "alice@office.example", "X-OpenWebUI-Chat-Id": "c-1"}


def test_a_trusted_front_end_names_each_person_as_a_client_of_their_own() -> None:
    with guarded(address="10.0.0.2", trusted_proxies=["10.0.0.2"]) as c:
        alice = c.post("/v1/x", json={}, headers=OWUI).json()
        bob = c.post("/v1/x", json={}, headers={**OWUI, "X-OpenWebUI-User-Id": "22aa-bob"}).json()
        nobody = c.post("/v1/x", json={}).json()
        assert alice["client"] == "10.0.0.2/person:8f1c-alice" and bob["client"] == "10.0.0.2/person:22aa-bob"
        assert alice["namespace"] != bob["namespace"] and nobody["client"] == "10.0.0.2"
        # A signing-in proxy's pair; control characters cannot reach a log line.
        me = c.post("/v1/x", json={}, headers={"X-Forwarded-User": "carol\x1b[2J", "X-Forwarded-Email": "c@o.example"}).json()
        assert me["client"] == "10.0.0.2/person:carol[2J"


def test_forwarded_persons_from_anyone_else_are_ignored(keys: KeyRing) -> None:
    with guarded(address="10.0.0.2") as c:  # not a trusted proxy: the headers are the client's claim
        me = c.post("/v1/x", json={}, headers=OWUI).json()
        assert me["client"] == "10.0.0.2" and me["namespace"] == ""
    with guarded(address="10.0.0.2", trusted_proxies=["10.0.0.2"], keys=keys) as c:
        # Behind the front-end's one key, each person is a client (and a namespace) within it.
        me = c.post("/v1/x", json={}, headers={**OWUI, "Authorization": f"Bearer {USER_KEY}"}).json()
        assert me["client"].startswith("key:") and me["client"].endswith("/person:8f1c-alice")
        assert me["namespace"] == me["client"]
        error(c.post("/v1/x", json={}, headers=OWUI), 401)  # a person is not a key


def test_rate_limit_off_by_default() -> None:
    with guarded() as c:
        assert {c.post("/v1/x", json={}).status_code for _ in range(30)} == {200}


# -- headers ---------------------------------------------------------------------------------------
def test_every_response_carries_the_security_headers() -> None:
    with guarded() as c:
        for r in (c.get("/"), c.get("/health", headers={"Host": "evil.example"}), c.get("/metrics")):
            assert r.headers["content-security-policy"] == "default-src 'self'; frame-ancestors 'none'"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
