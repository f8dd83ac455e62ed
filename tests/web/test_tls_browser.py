"""People mode at the defaults serves HTTPS with the box's own certificate (issue 50): in
headless Chromium that trusts the box's CA the way a person's PC does (the CA downloaded from
/trust/ca.crt, added to the user's NSS database with certutil, as Chrome and Firefox on Linux
read it), the operator adds a person in /admin, the person takes the invite and signs in, and
the session cookie is `Secure`; the sign-in page and /admin show the CA's fingerprint, the one
the terminal printed; plain HTTP only redirects; a browser without the CA refuses the box."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live, live_server
from helpers.polling import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402
from helpers.browser import DESKTOP, open_page  # noqa: E402
from playwright.sync_api import Error as PlaywrightError  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

if browser_util.chromium_path() is None or shutil.which("certutil") is None:
    pytest.skip("needs Chromium and certutil: sudo apt-get install -y chromium libnss3-tools (scripts/setup.sh does "
                "as root)", allow_module_level=True)

PASSWORD = "ann's long password"


class Box:
    def __init__(self, live: Live, ca: Path) -> None:
        self.live, self.ca = live, ca
        self.url = f"https://localhost:{live.port}"

    def client(self) -> httpx.Client:
        """A client that trusts the box's CA and nothing else."""
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.ca)),
                            trust_env=False, timeout=60)


@pytest.fixture(scope="module")
def box(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    d = tmp_path_factory.mktemp("tls")
    # tls="auto" is the default (the test factories say "off" unless asked): people mode, nothing else.
    with live_server(d, model=bundled_model, auth="people", tls="auto", ready=False, slots=1, ctx_per_slot=1024,
                     kv_tokens=2048, max_tokens_limit=16, default_max_tokens=8) as live:
        live.wait_port()
        box = Box(live, d / "state" / "tls" / "ca.crt")
        with box.client() as c:
            wait_until(lambda: c.get("/health").status_code == 200, 180, "the model loaded, over https")
        yield box


def nss_home(home: Path, ca: bytes | None) -> Path:
    """A user's HOME whose NSS database (~/.pki/nssdb, where Chromium and Firefox on Linux keep
    the certificates a user trusts) holds `ca`, or nothing."""
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True)
    subprocess.run(["certutil", "-d", f"sql:{db}", "-N", "--empty-password"], check=True)
    if ca is not None:
        downloaded = home / "appliance-ca.crt"
        downloaded.write_bytes(ca)
        subprocess.run(["certutil", "-d", f"sql:{db}", "-A", "-t", "C,,", "-n", "appliance", "-i", str(downloaded)],
                       check=True)
    return home


@pytest.fixture(scope="module")
def browsers(box: Box, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """Chromium for a person who trusted the box's CA once (downloaded from /trust/ca.crt, its
    fingerprint the terminal's), and for one who did not."""
    with box.client() as c:
        pem = c.get("/trust/ca.crt").content
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    # Invite links made on the box name it appliance.local (http/reach.py), which mDNS resolves
    # on a LAN: here to this machine, with no multicast. The certificate covers the name.
    args.append("--host-resolver-rules=MAP *.local 127.0.0.1")
    with sync_playwright() as p:
        launched = [p.chromium.launch(executable_path=browser_util.chromium_path(), args=args,
                                      env={**os.environ, "HOME": str(nss_home(tmp_path_factory.mktemp("home"), ca))})
                    for ca in (pem, None)]
        yield launched[0], launched[1]
        for b in launched:
            b.close()


@pytest.fixture(scope="module")
def trusting(browsers: tuple[Any, Any]) -> Any:
    return browsers[0]


def printed_fingerprint(live: Live) -> str:
    found = re.search(r"SHA-256 fingerprint is ([0-9A-F:]{95})", live.log())
    assert found, live.log()[-2000:]
    return found.group(1)


def test_https_with_the_box_certificate_and_plain_http_only_redirects(box: Box) -> None:
    with box.client() as c:
        assert c.get("/health").json()["status"] == "ok"
        info = c.get("/trust").json()
        assert info["fingerprint"] == printed_fingerprint(box.live)
        assert c.get(info["download"]).content == box.ca.read_bytes()
    plain = f"http://127.0.0.1:{box.live.port}"
    with httpx.Client(trust_env=False, timeout=30) as c:
        for method, path in (("GET", "/"), ("GET", "/health"), ("POST", "/auth/signin"), ("GET", "/admin")):
            r = c.request(method, plain + path, json={"name": "ann", "password": PASSWORD} if method == "POST" else None)
            assert r.status_code == 308 and r.headers["location"] == f"https://127.0.0.1:{box.live.port}{path}"
            assert r.content == b"" and "set-cookie" not in r.headers
    # Nothing but the box's CA makes it trusted: the system's roots do not.
    with httpx.Client(trust_env=False, timeout=30) as c, pytest.raises(httpx.ConnectError, match="CERTIFICATE"):
        c.get(box.url + "/health")


def test_a_person_signs_in_over_https_with_a_secure_cookie(box: Box, trusting: Any) -> None:
    fingerprint = printed_fingerprint(box.live)
    admin = open_page(trusting, box.url + "/admin")  # this machine: the operator
    try:
        p = admin.page
        p.wait_for_selector("#trust-admin:not([hidden])")
        assert p.text_content("#trust-fingerprint") == fingerprint
        assert p.locator("#trust-qr svg").count() == 1
        assert p.input_value("#trust-url") == f"https://appliance.local:{box.live.port}/trust/ca.crt"
        p.wait_for_selector("#people-admin:not([hidden])")
        p.fill("#person-name", "Ann")
        p.click("#add-person button[type=submit]")
        p.wait_for_function("() => document.getElementById('invite-name').textContent === 'Ann'")
        invite = p.input_value("#invite-url")
    finally:
        admin.close()
    assert invite.startswith(f"https://appliance.local:{box.live.port}/#invite=")  # by name, never loopback
    w = open_page(trusting, invite, viewport=DESKTOP, wait_ready=False)
    try:
        p = w.page
        p.wait_for_selector("#signin:not([hidden])")
        assert p.is_hidden("#signin-plain")  # no "not encrypted" warning
        p.wait_for_selector("#signin-trust:not([hidden])")
        assert p.text_content("#signin-fingerprint") == fingerprint
        p.fill("#signin-password", PASSWORD)
        p.click("#signin-go")
        p.wait_for_selector("html[data-ready='1']")
        assert p.url.startswith("https://")
        cookie = next(c for c in w.context.cookies() if c["name"] == "appliance_session")
        assert cookie["secure"] and cookie["httpOnly"]
    finally:
        w.close()


def test_a_browser_typing_http_lands_on_https(box: Box, trusting: Any) -> None:
    w = open_page(trusting, f"http://localhost:{box.live.port}/", wait_ready=False)
    try:
        w.page.wait_for_selector("#signin:not([hidden])")
        assert w.page.url == box.url + "/"
    finally:
        w.close()


def test_a_browser_without_the_ca_refuses_the_box(box: Box, browsers: tuple[Any, Any]) -> None:
    ctx = browsers[1].new_context()
    try:
        with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
            ctx.new_page().goto(box.url + "/")
    finally:
        ctx.close()
