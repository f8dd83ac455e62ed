"""Drive Open WebUI (unchanged, at its defaults) in chromium in front of the appliance (issue 37).

Three people sign in (the first is Open WebUI's admin, the other two users the admin adds),
each opens a new chat and asks a question. Open WebUI sends its admins 36 built-in tools and its
users 30 (the first 24 the same), so each set is read once: the admin's by the first chat ever,
the users' by the first user's chat (which copies the part both sets begin with). Every later
new chat, of either kind, must copy its set and show text within --new-chat-s. Prints one JSON
line: per chat, the seconds from pressing send to the first answer text and to the appliance
being idle again, the answer's first characters, and the people the appliance's /admin
counted. Run by compat/open-webui/run.sh, which starts both servers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, sync_playwright

PEOPLE = [("Ann Office", "ann@office.example"), ("Ben Office", "ben@office.example"),
          ("Cat Office", "cat@office.example")]
PASSWORD = "open-webui-check-1"
QUESTIONS = ["In one sentence: what is a good name for a meeting room?",
             "In one sentence: how do I book the projector?",
             "In one sentence: what should a visitor badge show?",
             "In one sentence: when should the office plants be watered?"]


def accounts(url: str) -> None:
    """The first sign-up is Open WebUI's admin; the admin adds the others as users."""
    with httpx.Client(base_url=url, timeout=60) as c:
        (name, email), *users = PEOPLE
        r = c.post("/api/v1/auths/signup", json={"name": name, "email": email, "password": PASSWORD})
        r.raise_for_status()
        token = r.json()["token"]
        for name2, email2 in users:
            r = c.post("/api/v1/auths/add", headers={"Authorization": f"Bearer {token}"},
                       json={"name": name2, "email": email2, "password": PASSWORD, "role": "user"})
            r.raise_for_status()


def sign_in(browser: Browser, url: str, email: str) -> Page:
    page = browser.new_context(locale="en-US").new_page()
    page.goto(f"{url}/auth")
    page.fill('input[autocomplete="email"]', email)
    page.fill('input[type="password"]', PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_selector("#chat-search, #chat-input, #chat-textarea", timeout=120_000)
    letsgo = page.get_by_role("button", name="Okay, Let's Go!")  # the changelog, once per browser
    if letsgo.count():
        letsgo.click()
    return page


def idle(appliance: str) -> bool:
    """No slot busy and nobody queued on the appliance: the answer (and whatever Open WebUI
    asked for beside it) is done. Open WebUI 0.12.4's page has no marker of a finished answer
    this script could rely on (its buttons show on hover)."""
    text = httpx.get(f"{appliance}/metrics", timeout=30).text
    figures = dict(line.split() for line in text.splitlines()
                   if line.startswith(("appliance_slots_active ", "appliance_queue_depth ")))
    return all(float(v) == 0 for v in figures.values()) and len(figures) == 2


def chat(page: Page, url: str, appliance: str, question: str, timeout_s: float) -> dict[str, Any]:
    """A new chat, one question; seconds to the first answer text and to the whole answer."""
    page.goto(url + "/")
    box = page.locator("#chat-input, #chat-textarea").first
    box.wait_for(timeout=60_000)
    box.click()
    page.keyboard.type(question)
    n_before = page.locator("#response-content-container").count()
    t0 = time.monotonic()
    page.keyboard.press("Enter")
    answer = page.locator("#response-content-container").nth(n_before)
    deadline = t0 + timeout_s
    first = None
    while time.monotonic() < deadline:
        text = answer.inner_text(timeout=1000).strip() if answer.count() else ""
        if text and first is None:
            first = time.monotonic() - t0
        if first is not None and idle(appliance):
            break
        time.sleep(0.2)
    text = answer.inner_text(timeout=1000).strip() if answer.count() else ""
    return {"question": question, "first_text_s": None if first is None else round(first, 2),
            "done_s": round(time.monotonic() - t0, 2), "answer": text[:120]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="Open WebUI")
    ap.add_argument("--appliance", required=True, help="the appliance (its /admin/status, from this machine)")
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--new-chat-s", type=float, default=5.0, help="the bound on a later new chat's first text")
    a = ap.parse_args()
    accounts(a.url)
    chats = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        ann, ben, cat = (sign_in(browser, a.url, email) for _, email in PEOPLE)
        plan = [("ann", ann, "the admins' tools read"), ("ben", ben, "the users' tools read"),
                ("cat", cat, "copied"), ("ann", ann, "copied")]
        for (who, page, block), question in zip(plan, QUESTIONS):
            chats.append({"who": who, "tools": block, **chat(page, a.url, a.appliance, question, a.timeout_s)})
        browser.close()
    people = httpx.get(f"{a.appliance}/admin/status", timeout=30).json().get("people", [])
    who = sorted(p["who"] for p in people)
    later = [c["first_text_s"] for c in chats if c["tools"] == "copied"]
    ok = (all(c["first_text_s"] is not None for c in chats) and all(s <= a.new_chat_s for s in later)
          and {email for _, email in PEOPLE} <= set(who))
    print(json.dumps({"label": a.label, "ok": ok, "chats": chats, "people": who}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
