"""The first admin from the terminal, for real: `appliance person add Ann --admin` run as its
own process against a running server's state directory prints an invite link by the box's
name; the link's token, accepted over HTTP, makes an admin who signs in."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.live import ROOT, Live

pytestmark = pytest.mark.integration
PASSWORD = "a long enough password"
# Plain HTTP here (the live client speaks it): the box's own certificate in people mode is
# tests/web/test_tls_browser.py's.
PLAIN = {"tls": "off"}


def person(state: Path, port: int, *args: str) -> str:
    """`appliance person ...` as the operator types it, beside the running server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")} | {"PYTHONPATH": str(ROOT)}
    flags = ["--state-dir", str(state), "--auth", "people", "--port", str(port)]
    flags += [f"--{k}={v}" for k, v in PLAIN.items()]
    out = subprocess.run([sys.executable, "-m", "appliance", "person", *args, *flags], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_terminal_makes_an_admin_whose_link_signs_in(start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    live = start_server(state=state, auth="people", slots=2, **PLAIN)
    live.wait_ready()
    out = person(state, live.port, "add", "Ann", "--admin")
    url = out.strip().splitlines()[-1]
    assert url.startswith(f"http://appliance.local:{live.port}/#invite="), out
    token = url.rsplit("#invite=", 1)[1]

    c = live.client
    assert c.post("/auth/invite", json={"token": token}).json() == {"name": "Ann"}
    accepted = c.post("/auth/invite/accept", json={"token": token, "password": PASSWORD})
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["person"]["role"] == "admin"
    c.cookies.clear()
    signed = c.post("/auth/signin", json={"name": "ann", "password": PASSWORD})
    assert signed.status_code == 200 and signed.json()["person"] == accepted.json()["person"]
    me = c.get("/auth/me").json()
    assert me["person"]["name"] == "Ann" and me["person"]["role"] == "admin"
    assert c.post("/auth/invite/accept", json={"token": token, "password": PASSWORD}).status_code != 200  # once
    assert "Ann   admin  active" in person(state, live.port, "list")
