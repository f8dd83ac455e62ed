"""Headless Chromium for the chat page's tests and screenshots: Debian's `chromium` driven by
Playwright (no browser download), every page watched for script errors and Content-Security-
Policy violations.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}

# Runs before any page script: records CSP violations (the server's policy is what is
# tested, so a violation is a bug in the page) for Watched.check().
WATCH = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__violations.push(`${e.violatedDirective} blocked ${e.blockedURI || '(inline)'} at ${e.sourceFile}:${e.lineNumber}`);
}, true);
"""

# A page served over plain http from a LAN address is not a secure context: these are missing.
NO_SECURE_APIS = """
delete Crypto.prototype.randomUUID;
delete Navigator.prototype.clipboard;
window.__copied = [];
document.addEventListener('copy', (e) => {
  const t = e.target;
  window.__copied.push(t && t.value !== undefined ? t.value.slice(t.selectionStart, t.selectionEnd)
                                                  : String(document.getSelection()));
}, true);
"""


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


@contextmanager
def browser() -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        raise RuntimeError(f"no Chromium at {CHROMIUM}: install Debian's package with  sudo apt-get install -y chromium")
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
    # Links made on the box name it <box_name>.local (appliance/http/reach.py), which mDNS
    # resolves on a LAN: here to this machine, with no multicast.
    args.append("--host-resolver-rules=MAP *.local 127.0.0.1")
    with sync_playwright() as p:
        b = _launch(p, path, args)
        try:
            yield b
        finally:
            b.close()


def _launch(p: Playwright, path: str, args: list[str]) -> Browser:
    return p.chromium.launch(executable_path=path, args=args)


@dataclass
class Watched:
    """A page with its script errors and CSP violations collected."""

    page: Page
    context: BrowserContext
    errors: list[str] = field(default_factory=list)
    chat_requests: list[dict[str, Any]] = field(default_factory=list)

    def violations(self) -> list[str]:
        try:
            return list(self.page.evaluate("window.__violations || []"))
        except Exception:  # page closed or navigating
            return []

    def check(self) -> None:
        """Fail on any page error or CSP violation so far."""
        problems = self.errors + self.violations()
        assert not problems, "page errors or CSP violations:\n" + "\n".join(problems)

    def close(self) -> None:
        self.check()
        self.context.close()


def secure_origin(url: str) -> bool:
    """A secure context to the browser: https, or this machine's own address."""
    parts = urlsplit(url)
    return parts.scheme == "https" or parts.hostname in ("127.0.0.1", "localhost", "::1")


def open_page(b: Browser, url: str, *, viewport: dict[str, int] | None = None, secure_apis: bool = True,
              color_scheme: str = "light", init: str = "", storage: Path | None = None,
              wait_ready: bool = True) -> Watched:
    ctx = b.new_context(viewport=viewport or DESKTOP, color_scheme=color_scheme,  # type: ignore[arg-type]
                        accept_downloads=True, storage_state=str(storage) if storage else None,
                        has_touch=viewport == PHONE, is_mobile=viewport == PHONE)
    if secure_apis and secure_origin(url):  # an invite link by name (http://appliance.local) is not one
        ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=url.rstrip("/"))
    ctx.add_init_script(WATCH + ("" if secure_apis else NO_SECURE_APIS) + init)
    page = ctx.new_page()
    w = Watched(page, ctx)
    page.on("pageerror", lambda e: w.errors.append(f"page error: {e}"))

    def on_request(r: Any) -> None:
        if r.url.endswith("/v1/chat/completions") and r.method == "POST":
            w.chat_requests.append({"headers": r.headers, "body": json.loads(r.post_data or "{}")})

    page.on("request", on_request)
    page.goto(url)
    if wait_ready:  # people mode: the page is ready after signing in
        page.wait_for_selector("html[data-ready='1']")
    return w
