"""A screenshot of the status page (/admin) under load, for the README: starts the appliance on
the bundled model with three keys (one with a small daily quota), lets three users from their
own addresses ask questions for a while, and photographs /admin in headless Chromium with the
browser tests' setup (tests/helpers/browser.py).

    .venv/bin/python scripts/screenshot-admin.py [OUT.png]     default docs/screenshots/admin.png
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.browser import browser, open_page  # noqa: E402
from helpers.live import start  # noqa: E402

from appliance.model import files as model_files  # noqa: E402

PEOPLE = {"alice": ("alice-screenshot-key-aaaaaaaa", 400), "bob": ("bob-screenshot-key-bbbbbbbbbb", 0),
          "carol": ("carol-screenshot-key-cccccccc", 0)}
QUESTIONS = ["Summarise why backups matter in two sentences.", "Write a haiku about spreadsheets.",
             "List three tips for shorter meetings.", "Explain what a VPN is to a new colleague."]


def load(live: object, who: str, i: int, stop: threading.Event) -> None:
    key = PEOPLE[who][0]
    c = live.user_client(i)  # type: ignore[attr-defined]
    k = 0
    while not stop.is_set():
        body = {"messages": [{"role": "user", "content": QUESTIONS[(i + k) % len(QUESTIONS)]}], "max_tokens": 48}
        try:
            c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError:  # the server is stopping
            return
        k += 1


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text("".join(f"{key} {who} {quota}\n" for who, (key, quota) in PEOPLE.items()))
        live = start(model_files.resolve("", ROOT / "models"), Path(tmp), "--slots", "4", "--api-keys-file", str(keys))
        stop = threading.Event()
        try:
            live.wait_ready()
            users = [threading.Thread(target=load, args=(live, who, i, stop), daemon=True) for i, who in enumerate(PEOPLE)]
            for t in users:
                t.start()
            with browser() as b:
                w = open_page(b, live.url + "/admin", viewport={"width": 1280, "height": 1100})
                time.sleep(45)
                w.page.screenshot(path=str(out), full_page=True)
                w.close()
        finally:
            stop.set()
            live.stop()
    print(f"{out}  {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots" / "admin.png")
