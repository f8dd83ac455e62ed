"""HSTS only on names (appliance/tls/hsts.py): never on an address or localhost, where it
would bind every other service on that host, and never over plain http."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from appliance.tls.hsts import hsts, safe_host


@pytest.mark.parametrize(("host", "safe"), [
    ("appliance.local", True), ("appliance.local:8443", True), ("office-pc", True), ("Box.Office.Lan.", True),
    ("192.168.1.20", False), ("192.168.1.20:8080", False), ("[::1]:8080", False), ("[fd00::2]", False),
    ("localhost", False), ("localhost:8080", False), ("app.localhost", False), ("", False),
])
def test_safe_host(host: str, safe: bool) -> None:
    assert safe_host(host) is safe


def test_only_https_responses_to_a_name_carry_it() -> None:
    app = hsts(Starlette(routes=[Route("/", lambda r: PlainTextResponse("ok"))]))
    assert TestClient(app, base_url="https://box.local").get("/").headers["strict-transport-security"] == "max-age=86400"
    assert "strict-transport-security" not in TestClient(app, base_url="https://10.0.0.5").get("/").headers
    assert "strict-transport-security" not in TestClient(app, base_url="http://box.local").get("/").headers
