"""The routes that let people trust the box's own CA once (http/api/appliance/trust.py):
/trust/ca.crt and /trust open to anyone (the certificate, never a key), /admin/trust for the
operator with a QR code of a URL a phone can reach, and 404 without a CA of the box's own."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import MODEL_ID, as_users
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.app import create_app
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.tls.authority import Files
from appliance.tls.trust import Trust

REMOTE = {"x-test-client": "192.168.1.20"}


def client(trust: Trust | None) -> TestClient:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=512, max_wait_s=0.0, max_queue=8)
    app = App(Engine(lambda: FakeModel(), EngineOptions(limits, CachePolicy(n_seq=6))), MODEL_ID,
              RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=512))
    app.trust = trust
    return TestClient(as_users(create_app(app)), base_url="http://localhost", client=("127.0.0.1", 50000))


@pytest.fixture
def trust(tmp_path: Path) -> Trust:
    files = Files(tmp_path)
    files.ensure_ca(frozenset(), dt.datetime.now(dt.UTC))
    return Trust(files.ca_cert.read_bytes(), "https://appliance.local:8080/trust/ca.crt")


@pytest.fixture
def served(trust: Trust) -> Iterator[TestClient]:
    with client(trust) as c:
        yield c


def test_anyone_downloads_the_ca_certificate_only(served: TestClient, trust: Trust) -> None:
    r = served.get("/trust/ca.crt", headers=REMOTE)
    assert r.status_code == 200 and r.content == trust.pem
    assert r.headers["content-type"] == "application/x-x509-ca-cert"
    assert b"PRIVATE KEY" not in r.content
    assert served.get("/trust", headers=REMOTE).json() == {"fingerprint": trust.fingerprint,
                                                           "download": "trust/ca.crt"}


def test_the_operator_gets_a_qr_code_of_a_url_a_phone_reaches(served: TestClient, trust: Trust) -> None:
    assert served.get("/admin/trust", headers=REMOTE).status_code in (401, 403)
    # Opened on the box itself (127.0.0.1 / localhost): the LAN name, not the loopback address.
    body = served.get("/admin/trust").json()
    assert body["url"] == trust.url and body["fingerprint"] == trust.fingerprint
    assert body["qr_svg"].startswith("<svg")
    body = served.get("http://192.168.1.5:8080/admin/trust").json()
    assert body["url"] == "http://192.168.1.5:8080/trust/ca.crt"


def test_no_box_ca_no_routes() -> None:
    with client(None) as c:
        for path in ("/trust/ca.crt", "/trust", "/admin/trust"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "no_box_ca"
