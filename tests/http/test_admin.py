"""The operator's view in process: /admin, its JSON and CSV (only from this machine or with an
admin key, counts and never text), usage per person matching what was served and what /metrics
counted, and the daily quota's 429 (its reset time, other keys served, a reload lifting it)."""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, MODEL_ID, Served, as_users, error_of, is_idle, is_ready, wait_health
from helpers.polling import wait_until
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.accounting import Accounting
from appliance.http.app import create_app
from appliance.http.guard import GuardPolicy
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing
from appliance.http.metrics import Metrics
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.people.db import Database
from appliance.people.passwords import Hasher
from appliance.usage.ledger import Ledger, next_midnight

ALICE, BOB, ADMIN = "alice-key-" + "a" * 24, "bob-key-" + "b" * 24, "admin-key-" + "c" * 24
SECRET = "zebra-quartz-secret-words"
REPLY = "hello"  # 5 tokens with the fake tokenizer
REMOTE = {"x-test-client": "192.168.1.20"}  # not this machine


def auth(key: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **more}


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    path.write_text(f"{ALICE} alice 5\n{BOB} bob\n{ADMIN} admin\n")
    return path


def served(keys: KeyRing, quota: int = 0, state_dir: str = "", proxies: tuple[str, ...] = (),
           people: People | None = None) -> Iterator[TestClient]:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=512, max_wait_s=0.0, max_queue=8)
    engine = Engine(lambda: FakeModel(reply=REPLY), EngineOptions(limits, CachePolicy(n_seq=6)))
    metrics = Metrics()
    metrics.attach(engine)
    app = App(engine, MODEL_ID + "-Q4_K_M", RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=512),
              metrics=metrics, guard=GuardPolicy.build(keys, parse_networks(proxies)),
              usage=Accounting(Ledger(state_dir), quota), people=people, store=people)
    with TestClient(as_users(create_app(app)), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
        yield client


@pytest.fixture
def ring(keys_file: Path) -> KeyRing:
    return KeyRing(str(keys_file))


@pytest.fixture
def client(ring: KeyRing) -> Iterator[TestClient]:
    yield from served(ring)


def ask(client: TestClient, key: str, stream: bool = False, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": SECRET}], "stream": stream}
    return client.post(CHAT, json=body, headers=auth(key, **headers))


def status(client: TestClient) -> dict[str, Any]:
    r = client.get("/admin/status")
    assert r.status_code == 200, r.text
    return dict(r.json())


def person(body: dict[str, Any], who: str) -> dict[str, Any]:
    return dict(next(p for p in body["people"] if p["who"] == who))


def test_operator_routes_are_refused_from_elsewhere_without_the_admin_key(client: TestClient) -> None:
    for path in ("/admin", "/admin/status", "/admin/usage.csv"):
        assert error_of(client.get(path, headers=REMOTE), 403)["code"] == "admin_only"
        assert error_of(client.get(path, headers=auth(BOB, **REMOTE)), 403)["code"] == "admin_only"
        assert client.get(path, headers=auth(ADMIN, **REMOTE)).status_code == 200
        assert client.get(path).status_code == 200  # this machine
    page = client.get("/admin")
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "static/js/admin.js" in page.text


def test_usage_per_person_matches_what_was_served_and_metrics(client: TestClient) -> None:
    served_tokens = {"bob": 0, "admin": 0}
    for key, who, stream in ((BOB, "bob", False), (BOB, "bob", True), (ADMIN, "admin", False)):
        r = ask(client, key, stream, **REMOTE)
        assert r.status_code == 200, r.text
        served_tokens[who] += len(REPLY) if stream else r.json()["usage"]["completion_tokens"]
    wait_health(client.get, is_idle)
    body = status(client)
    bob, admin = person(body, "bob"), person(body, "admin")
    assert bob["today"]["requests"] == bob["week"]["requests"] == 2 and admin["today"]["requests"] == 1
    assert bob["today"]["generated_tokens"] == served_tokens["bob"]
    assert admin["today"]["generated_tokens"] == served_tokens["admin"]
    assert bob["today"]["prompt_tokens"] > 0 and bob["quota"] is None and not bob["at_limit"]
    metrics = client.get("/metrics").text
    generated = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("appliance_generated_tokens_total"))
    assert sum(p["today"]["generated_tokens"] for p in body["people"]) == generated
    now = body["now"]
    assert now["model"].startswith(MODEL_ID) and now["quant"] == "Q4_K_M"
    assert now["slots"] == {"total": 2, "busy": 0, "idle": 2} and now["queue"] == 0
    assert now["active_clients"] == 2 and now["watchdog"]["ok"] and now["memory"]["rss_bytes"] > 0
    assert sum(body["hour"]["requests"]) == 3 and len(body["hour"]["t"]) == 60 and len(body["day"]["t"]) == 144
    assert any(x is not None for x in body["hour"]["ttft_p50"])


def test_no_message_text_in_the_json_page_or_csv(client: TestClient) -> None:
    assert ask(client, BOB).status_code == 200
    for path in ("/admin", "/admin/status", "/admin/usage.csv", "/static/js/admin.js"):
        r = client.get(path)
        assert r.status_code == 200
        assert SECRET not in r.text and REPLY not in r.text  # the question and the answer


def test_usage_csv(client: TestClient) -> None:
    assert ask(client, BOB).status_code == 200
    assert ask(client, BOB).status_code == 200
    r = client.get("/admin/usage.csv")
    assert r.headers["content-type"].startswith("text/csv")
    assert "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert list(rows[0]) == ["day", "who", "requests", "prompt_tokens", "cached_tokens", "generated_tokens", "refusals"]
    bob = next(row for row in rows if row["who"] == "bob")
    assert (bob["day"], bob["requests"], bob["generated_tokens"]) == (time.strftime("%Y-%m-%d"), "2", str(2 * len(REPLY)))


def test_a_key_over_its_quota_gets_a_429_with_the_reset_time(client: TestClient, ring: KeyRing,
                                                             keys_file: Path) -> None:
    assert ask(client, ALICE).status_code == 200  # 5 tokens: alice's quota
    for stream in (False, True):
        r = ask(client, ALICE, stream)
        err = error_of(r, 429)
        assert err["code"] == "quota_exceeded" and err["type"] == "rate_limit_error"
        assert "5 generated tokens a day" in err["message"] and "midnight" in err["message"]
        reset = time.strftime("%H:%M", time.localtime(next_midnight(time.time())))
        assert reset in err["message"]
        wait = int(r.headers["retry-after"])
        assert abs(wait - math.ceil(next_midnight(time.time()) - time.time())) <= 2
    assert ask(client, BOB).status_code == 200  # other keys keep being served
    alice = person(status(client), "alice")
    assert alice["quota"] == 5 and alice["at_limit"] and alice["today"]["refusals"] == 2
    assert alice["today"]["requests"] == 1
    assert 'appliance_rejected_requests_total{reason="quota_exceeded"} 2.0' in client.get("/metrics").text
    # systemctl reload (SIGHUP) re-reads the keys file, quotas with it.
    keys_file.write_text(f"{ALICE} alice 0\n{BOB} bob\n{ADMIN} admin\n")
    assert ring.reload()  # what the SIGHUP handler calls (ops/serve.py)
    assert ask(client, ALICE).status_code == 200


def test_the_default_quota_applies_to_everyone(keys_file: Path) -> None:
    for client in served(KeyRing(str(keys_file)), quota=3):
        assert ask(client, BOB).status_code == 200
        assert error_of(ask(client, BOB), 429)["code"] == "quota_exceeded"
        assert ask(client, ALICE).status_code == 200  # her own quota, 5, is not reached yet


def test_a_front_ends_forwarded_people_are_people_with_their_own_quota(keys_file: Path) -> None:
    """Open WebUI with ENABLE_FORWARD_USER_INFO_HEADERS, on 192.168.1.9 (a trusted proxy),
    calling with one key for everyone: each person it names is a row, with the quota."""
    front = {**REMOTE, "x-test-client": "192.168.1.9"}
    def as_(pid: str, email: str) -> dict[str, str]:
        return {**front, "X-OpenWebUI-User-Id": pid, "X-OpenWebUI-User-Name": pid, "X-OpenWebUI-User-Email": email}

    for client in served(KeyRing(str(keys_file)), quota=1, proxies=("192.168.1.9",)):  # one answer's worth
        assert ask(client, BOB, **as_("u-1", "ann@office.example")).status_code == 200
        assert error_of(ask(client, BOB, **as_("u-1", "ann@office.example")), 429)["code"] == "quota_exceeded"
        assert ask(client, BOB, **as_("u-2", "ben@office.example")).status_code == 200  # his own quota
        # The same headers from an address that is not a trusted proxy name nobody.
        assert ask(client, BOB, **{**as_("u-2", "ben@office.example"), "x-test-client": "192.168.1.20"}).status_code == 200
        wait_health(client.get, is_idle)
        body = status(client)
        assert person(body, "ann@office.example")["today"]["requests"] == 1
        assert person(body, "ben@office.example")["today"]["requests"] == 1
        assert person(body, "bob")["today"]["requests"] == 1


def test_usage_survives_a_restart(keys_file: Path, tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    for client in served(KeyRing(str(keys_file)), state_dir=state):
        assert ask(client, BOB).status_code == 200
    for client in served(KeyRing(str(keys_file)), state_dir=state):
        assert person(status(client), "bob")["today"]["requests"] == 1
        assert status(client)["persistent"]


def test_a_request_the_client_left_is_counted_as_metrics_count_it() -> None:
    with Served(lambda: FakeModel(reply="x" * 200, delay=0.01)) as s:
        for stream in (True, False):
            c = s.user(0, timeout=0.3 if not stream else 10)
            body = {"messages": [{"role": "user", "content": SECRET}], "stream": stream, "max_tokens": 200}
            if stream:
                with c.stream("POST", CHAT, json=body) as r:
                    next(r.iter_lines())  # the first event, then leave
            else:
                with pytest.raises(httpx.ReadTimeout):
                    c.post(CHAT, json=body)
            s.health(is_idle)

        def counted() -> dict[str, Any] | None:
            body = httpx.get(s.url + "/admin/status", trust_env=False).json()
            people = body["people"]
            return body if people and people[0]["today"]["requests"] == 2 else None

        body = wait_until(counted, 15, "both requests to be counted")
        generated = s.health(is_idle)["engine"]["generated_tokens"]  # what /metrics renders too
        assert body["people"][0]["who"] == "127.0.0.2"
        assert 0 < body["people"][0]["today"]["generated_tokens"] == generated < 400


def workers(client: TestClient) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in status(client)["workers"]}


def test_the_status_lists_the_running_workers(ring: KeyRing, tmp_path: Path) -> None:
    people = People(Database(tmp_path / "people"), retention_days=30, hasher=Hasher(n=2**10))
    for client in served(ring, state_dir=str(tmp_path / "usage"), people=people):
        running = workers(client)
        assert running["usage-writer"] == {"name": "usage-writer", "alive": True, "depth": 0}
        assert running["password-hash"] == {"name": "password-hash", "alive": True, "depth": 0}
        assert "chat-retention" not in running  # it starts with the first prune
        people.prune_due(now=0.0)
        assert workers(client)["chat-retention"]["alive"]


def test_a_stopped_worker_shows_alive_false(ring: KeyRing, tmp_path: Path) -> None:
    people = People(Database(tmp_path / "people"), hasher=Hasher(n=2**10))
    for client in served(ring, people=people):
        assert workers(client)["password-hash"]["alive"]
        people.hash_worker.stop()
        assert workers(client)["password-hash"] == {"name": "password-hash", "alive": False, "depth": 0}
