#!/usr/bin/env python3
"""Holds the operator page (/admin) open in headless Debian chromium for bench/documents-admin/admin.sh:
prints `open` once the page has fetched /admin/status, keeps it open (the page polls every 3 s)
until SIGTERM or SIGINT, then prints one JSON line: the polls seen, their errors, the browser's CPU.

    .venv/bin/python bench/documents-admin/admin-open.py http://127.0.0.1:18181
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil
from playwright.sync_api import Response, sync_playwright

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of this process's children: Playwright's driver and chromium."""
    total = 0.0
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a renderer that has exited
            continue
    return total


def hold(url: str, stop: threading.Event) -> dict[str, Any]:
    polls: list[float] = []
    errors: list[str] = []

    def seen(r: Response) -> None:
        if not r.url.split("?")[0].endswith("/admin/status"):
            return
        if r.status == 200:
            polls.append(time.monotonic())
        else:
            errors.append(f"/admin/status answered {r.status}")

    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium's sandbox refuses root
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.on("response", seen)
        page.on("pageerror", lambda e: errors.append(f"script: {e}"))
        page.goto(url.rstrip("/") + "/admin")
        while not polls and not errors:
            page.wait_for_timeout(100)
        print("open" if polls else f"failed: {errors}", flush=True)
        me = psutil.Process()
        cpu0, t0 = cpu_s(me), time.monotonic()
        while not stop.is_set():
            page.wait_for_timeout(250)  # Playwright's loop must run for the page's events to arrive
        held_s, cpu = time.monotonic() - t0, cpu_s(me) - cpu0
        browser.close()
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    return {"polls": len(polls), "errors": errors[:10], "held_s": round(held_s, 1),
            "poll_gap_s_max": round(max(gaps), 2) if gaps else None, "browser_cpu_s": round(cpu, 2)}


def main(url: str) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps(hold(url, stop)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
