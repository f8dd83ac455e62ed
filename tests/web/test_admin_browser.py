"""The operator's status page (/admin) in headless Chromium against the real appliance on the
bundled model: during a load of several clients, each from its own address with its own key,
the page's numbers move and its per-person table ends matching exactly what those clients
were served; the page holds no message text; a key over its daily quota sees the quota's
sentence on the chat page (not retried), and /admin marks it."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.live import Live, live_server
from helpers.polling import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)


KEYS = {who: f"{who}-admin-test-key-" + who[0] * 16 for who in ("alice", "bob", "carol", "dave", "admin")}
ALICE_QUOTA = 12  # generated tokens a day
SECRET = "periwinkle-umbrella-77"  # in every question: the page must never show it
USERS = ("bob", "carol", "dave")  # the load: user i from 127.0.0.(i+2) with its own key
ROUNDS = 4


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("admin")
    keys = d / "keys"
    keys.write_text("".join(f"{key} {who}{f' {ALICE_QUOTA}' if who == 'alice' else ''}\n" for who, key in KEYS.items()))
    with live_server(d, model=bundled_model, slots=4, ctx_per_slot=1024, kv_tokens=4096, max_tokens_limit=64,
                     default_max_tokens=32, api_keys_file=keys) as s:
        yield s




def tile(p: Any, name: str) -> str:
    return str(p.evaluate("""name => { const d = [...document.querySelectorAll('#now div')]
        .find(x => x.querySelector('dt').textContent === name); return d ? d.querySelector('dd').textContent : ''; }""",
        name))


def number(text: str) -> int:
    digits = re.sub(r"[^0-9]", "", text)
    return int(digits) if digits else 0


def row(p: Any, who: str) -> list[str]:
    """The table row of `who`: today's requests, prompt, cached, generated, refused, then the week's, then the quota."""
    return list(p.evaluate("""who => { const tr = document.querySelector(`#people tr[data-who="${who}"]`);
        return tr ? [...tr.querySelectorAll('td')].map(td => td.textContent) : []; }""", who))


def ask(live: Live, who: str, i: int, n: int, stream: bool) -> tuple[int, int]:
    """One question of user `who` (from its own address, with its key): (HTTP status, tokens generated)."""
    c = live.user_client(USERS.index(who) if who in USERS else 9)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": f"{SECRET}: count from {n} to {n + 40} in words."}],
                            "max_tokens": 24, "temperature": 0}
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    if not stream:
        r = c.post("/v1/chat/completions", json=body, headers=headers)
        return r.status_code, r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
    body.update(stream=True, stream_options={"include_usage": True})
    with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        text = "".join(r.iter_text())
    used = [int(m) for m in re.findall(r'"completion_tokens":(\d+)', text)]
    return r.status_code, used[-1] if used else 0


def test_admin_page_under_load_matches_what_the_clients_did(live: Live, page_of: Any) -> None:
    w = page_of(live.url + "/admin")  # from 127.0.0.1: this machine
    p = w.page
    p.wait_for_selector("#state.ok")
    assert tile(p, "Model").startswith("qwen") and "Q4_K_M" in tile(p, "Model")
    did = {who: [0, 0] for who in USERS}  # requests, generated tokens
    lock = threading.Lock()

    moved = threading.Event()  # the page showed two different non-zero counts: the load may stop

    def user(who: str) -> None:
        # At least ROUNDS questions each, then on until the page (polling every 3 s) has seen the
        # count move: a fast machine serves ROUNDS questions within one poll.
        k = 0
        while k < ROUNDS or (not moved.is_set() and k < 10 * ROUNDS):
            status, generated = ask(live, who, k, 10 * k + USERS.index(who), stream=k % 2 == 1)
            assert status == 200
            with lock:
                did[who][0] += 1
                did[who][1] += generated
            k += 1

    threads = [threading.Thread(target=user, args=(who,), daemon=True) for who in USERS]
    for t in threads:
        t.start()
    seen: set[int] = set()
    busy = False
    while any(t.is_alive() for t in threads):
        seen.add(number(tile(p, "Tokens generated")))
        if len(seen - {0}) >= 2:
            moved.set()
        busy = busy or not tile(p, "Slots busy").startswith("0 ")
        time.sleep(0.25)
    for t in threads:
        t.join(5)
    assert len(seen - {0}) >= 2, f"the page's token count did not move during the load: {sorted(seen)}"
    assert busy, "the page never showed a busy slot"

    def matches() -> bool:
        return all(number(row(p, who)[0]) == did[who][0] and number(row(p, who)[3]) == did[who][1]
                   for who in USERS if row(p, who))

    wait_until(lambda: matches() and all(row(p, who) for who in USERS), 15,
               "the per-person table to match what the clients did", 0.25, seen=lambda: {who: row(p, who) for who in USERS})
    for who in USERS:
        r = row(p, who)
        assert number(r[5]) == did[who][0] and number(r[8]) == did[who][1]  # the week includes today
        assert number(r[1]) > 0 and number(r[4]) == 0 and r[10] == "none"
    assert number(tile(p, "Active clients (5 min)")) >= len(USERS)
    assert p.locator(".chart svg polyline").count() >= 6
    assert SECRET not in p.content()
    csv = live.client.get("/admin/usage.csv").text
    assert all(f",{who},{did[who][0]}," in csv for who in USERS) and SECRET not in csv


def test_a_key_over_its_quota_sees_the_sentence_on_the_chat_page(live: Live, page_of: Any) -> None:
    codes = [ask(live, "alice", k, 5, stream=False)[0] for k in range(3)]
    assert codes[0] == 200 and 429 in codes, codes
    w = page_of(live.url, init=f"localStorage.setItem('chat.apiKey', '{KEYS['alice']}');")
    p = w.page
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
    p.fill("#input", "Hello?")
    p.press("#input", "Enter")
    error = p.locator("article.assistant .notes .error")
    error.wait_for(timeout=15000)
    text = error.inner_text()
    assert f"daily quota reached: {ALICE_QUOTA} generated tokens a day" in text and "midnight" in text, text
    assert len(w.chat_requests) == 1  # not retried
    assert ask(live, "bob", 0, 1, stream=False)[0] == 200  # other keys are served
    admin = page_of(live.url + "/admin").page
    admin.wait_for_selector('#people tr.at-limit[data-who="alice"]')
    assert "(reached)" in row(admin, "alice")[10]
