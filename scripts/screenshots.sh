#!/usr/bin/env bash
# Screenshots of the chat page for the docs: desktop light, desktop dark, phone. Starts the
# appliance on the bundled model on a free port, asks it one question at temperature 0 (a
# real answer, streamed into the page), and photographs the page in headless Chromium with
# the browser tests' setup (tests/helpers/browser.py).
#
#   scripts/screenshots.sh [OUT_DIR]     default docs/screenshots
#
# Needs the test extras (scripts/setup.sh bundled-model,test) and Debian's chromium.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/docs/screenshots}")
mkdir -p "$out"
"$root/scripts/setup.sh" bundled-model,test
cd "$root"
exec "$root/.venv/bin/python" - "$out" <<'EOF'
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests")
from helpers.browser import DESKTOP, PHONE, browser, open_page  # noqa: E402
from helpers.live import ROOT, start  # noqa: E402

from appliance.model import files as model_files  # noqa: E402

out = Path(sys.argv[1])
QUESTION = ("Write a Python function that checks whether a number is prime, then a Markdown table "
            "of the first five primes and their squares.")
# Older chats in the list: titles only (their text is not shown).
OLDER = ["Summarise the meeting notes", "SQL query for monthly totals", "Fix the printer driver error"]

with tempfile.TemporaryDirectory() as tmp:
    live = start(model_files.resolve("", ROOT / "models"), Path(tmp), "--slots", "2")
    try:
        live.wait_ready()
        with browser() as b:
            w = open_page(b, live.url, viewport=DESKTOP)
            p = w.page
            p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
            for i, title in enumerate(OLDER):
                f = Path(tmp) / f"old{i}.json"
                f.write_text(json.dumps({"format": "appliance-chat", "version": 1, "title": title,
                                         "messages": [{"role": "user", "content": title}]}))
                p.set_input_files("#import-file", str(f))
                p.wait_for_function("n => document.querySelectorAll('.chat-item').length === n", arg=i + 1)
            p.keyboard.press("Control+Shift+O")
            p.click("#open-settings")
            p.fill("#temperature", "0")
            p.fill("#max-tokens", "220")
            p.click("#settings button[value=close]")
            p.fill("#input", QUESTION)
            p.press("#input", "Enter")
            p.wait_for_function("() => document.querySelector('article.assistant') && !document.querySelector('article.streaming')",
                                timeout=600000)
            p.wait_for_timeout(6500)  # the toast of the last import has gone
            p.mouse.move(0, 0)
            state = Path(tmp) / "state.json"
            p.context.storage_state(path=str(state), indexed_db=True)
            p.screenshot(path=str(out / "desktop-light.png"))
            w.close()
            for name, viewport, scheme in (("desktop-dark", DESKTOP, "dark"), ("phone", PHONE, "light")):
                w = open_page(b, live.url, viewport=viewport, color_scheme=scheme, storage=state)
                w.page.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
                w.page.wait_for_selector("article.assistant")
                w.page.wait_for_timeout(300)
                w.page.screenshot(path=str(out / f"{name}.png"))
                w.close()
    finally:
        live.stop()
for f in sorted(out.glob("*.png")):
    print(f"{f}  {f.stat().st_size} bytes")
EOF
