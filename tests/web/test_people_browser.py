"""People mode in headless Chromium against the real appliance on the bundled model: the
operator adds two people in /admin; each opens their invite on a desktop and signs in on a
phone; a chat begun on one device continues on the other on the same KV cache; the other
person can neither list, open nor guess it; a share link opens read-only for a signed-in
colleague and is a 404 after revocation and for a signed-out browser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.live import Live, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402
from helpers.browser import DESKTOP, PHONE  # noqa: E402

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)

PASSWORDS = {"Ann": "ann's long password", "Ben": "ben's long password"}


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("people")
    with live_server(d, model=bundled_model, auth="people", slots=2, ctx_per_slot=2048, kv_tokens=8192,
                     max_tokens_limit=64, default_max_tokens=24) as s:
        yield s


def add_person(admin: Any, name: str) -> str:
    """The operator adds a person in /admin; the invite link it shows (and its QR code)."""
    admin.fill("#person-name", name)
    admin.click("#add-person button[type=submit]")
    admin.wait_for_function("name => document.getElementById('invite-name').textContent === name", arg=name)
    assert admin.locator("#invite-qr svg").count() == 1
    admin.wait_for_function("name => [...document.querySelectorAll('#accounts td')].some(td => td.textContent === name)",
                            arg=name)
    return str(admin.input_value("#invite-url"))


def accept_invite(page_of: Any, url: str, name: str) -> Any:
    w = page_of(url, viewport=DESKTOP, wait_ready=False)
    p = w.page
    p.wait_for_selector("#signin:not([hidden])")
    assert p.text_content("#signin-title") == f"Welcome, {name}"
    p.fill("#signin-password", PASSWORDS[name])
    p.click("#signin-go")
    p.wait_for_selector("html[data-ready='1']")
    assert "invite" not in p.url  # the one-time token leaves the address bar
    return w


def sign_in(page_of: Any, url: str, name: str, viewport: dict[str, int] = PHONE) -> Any:
    w = page_of(url, viewport=viewport, wait_ready=False)
    p = w.page
    p.wait_for_selector("#signin:not([hidden])")
    p.fill("#signin-name", name.lower())
    p.fill("#signin-password", PASSWORDS[name])
    p.click("#signin-go")
    p.wait_for_selector("html[data-ready='1']")
    return w


def ready(p: Any) -> Any:
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
    return p


def ask(p: Any, text: str, n: int) -> Any:
    p.fill("#input", text)
    p.press("#input", "Enter")
    p.wait_for_function(
        "n => document.querySelectorAll('article.assistant').length >= n && !document.querySelector('article.streaming')",
        arg=n, timeout=120_000)
    return p.locator("article.assistant").nth(n - 1)


def fetch_status(p: Any, path: str) -> int:
    return int(p.evaluate("path => fetch(path, {cache: 'no-store'}).then(r => r.status)", path))


def shared_status(p: Any, token: str) -> int:
    """POST v1/shared {token}, as the page asks (with its CSRF token when signed in)."""
    return int(p.evaluate("""token => import('./static/js/api.js').then(api => api.apiFetch('v1/shared', {
        method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({token})}))
        .then(r => r.status)""", token))


def open_chat_list(p: Any) -> None:
    if p.locator("#sidebar").get_attribute("inert") is not None:  # a phone: the list is a drawer
        p.click("#toggle-side")


def test_two_people_two_devices_one_cache_and_a_share_link(live: Live, page_of: Any) -> None:
    admin = page_of(live.url + "/admin").page  # this machine: the operator
    admin.wait_for_selector("#people-admin:not([hidden])")
    ann_invite, ben_invite = add_person(admin, "Ann"), add_person(admin, "Ben")

    # Ann: her invite on the desktop, the first turn of a chat there.
    ann_desk = ready(accept_invite(page_of, ann_invite, "Ann").page)
    first = ask(ann_desk, "Name three colours of the rainbow.", 1)
    prompt1 = int(first.get_attribute("data-prompt-tokens"))
    chat_id = ann_desk.evaluate("() => document.querySelector('.chat-item').dataset.id")
    ann_desk.wait_for_function("() => document.querySelector('.chat-item') !== null")

    # Ann's phone: signed in with her password, the chat is listed, opened and continued.
    ann_phone = ready(sign_in(page_of, live.url, "Ann").page)
    open_chat_list(ann_phone)
    ann_phone.wait_for_selector(f".chat-item[data-id='{chat_id}']")
    ann_phone.click(f".chat-item[data-id='{chat_id}']")
    ann_phone.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    second = ask(ann_phone, "And two more?", 2)
    cached2 = int(second.get_attribute("data-cached-tokens"))
    assert cached2 > prompt1, (prompt1, cached2)  # the desktop's whole first turn came from the cache
    assert "prompt tokens cached" in second.locator(".stats").inner_text()

    # Ben: his invite on a desktop and his password on a phone; Ann's chat is nowhere for him.
    ben_desk = accept_invite(page_of, ben_invite, "Ben").page
    ben_phone = sign_in(page_of, live.url, "Ben").page
    for p in (ben_desk, ben_phone):
        assert p.locator(".chat-item").count() == 0
        assert fetch_status(p, f"v1/chats/{chat_id}") == 404
        assert fetch_status(p, "v1/chats/" + "A" * 22) == 404  # a guess is the same 404

    # Ann shares it: Ben's signed-in browser opens it read-only.
    ann_desk.click("#chat-menu summary")
    ann_desk.click("#chat-menu [data-act=share]")
    ann_desk.wait_for_selector("#ask[open]")
    link = ann_desk.input_value("#ask-input")
    ann_desk.click("#ask-ok")
    assert "#share=" in link
    ben_desk.goto(link)
    ben_desk.wait_for_selector("html[data-ready='1']")
    ben_desk.wait_for_selector("#read-only:not([hidden])")
    assert ben_desk.locator("#composer").is_hidden()
    assert ben_desk.locator("article.assistant").count() == 2
    assert "shared by Ann" in ben_desk.text_content("#chat-title")
    token = link.split("#share=", 1)[1]
    assert shared_status(ben_desk, token) == 200

    # A signed-out browser gets the sign-in page and a 404.
    stranger = page_of(link, wait_ready=False).page
    stranger.wait_for_selector("#signin:not([hidden])")
    assert stranger.locator("article").count() == 0
    assert shared_status(stranger, token) == 404

    # Revoked: a 404 for Ben too.
    ann_desk.click("#chat-menu summary")
    ann_desk.click("#chat-menu [data-act=unshare]")
    ann_desk.wait_for_function("() => !document.getElementById('toast').hidden")
    assert shared_status(ben_desk, token) == 404

    # The operator sees the two people and their counts, never a chat.
    admin.reload()
    admin.wait_for_function("() => document.querySelectorAll('#accounts tbody tr').length === 2")
    assert "rainbow" not in admin.content()


def test_a_person_downloads_their_own_data_from_settings(live: Live, page_of: Any) -> None:
    admin = page_of(live.url + "/admin").page
    admin.wait_for_selector("#people-admin:not([hidden])")
    PASSWORDS["Cleo"] = "cleo's long password"
    cleo = ready(accept_invite(page_of, add_person(admin, "Cleo"), "Cleo").page)
    ask(cleo, "Name a colour.", 1)
    cleo.wait_for_function("() => document.querySelector('.chat-item') !== null")
    chat_id = cleo.evaluate("() => document.querySelector('.chat-item').dataset.id")
    cleo.wait_for_function(f"() => fetch('v1/chats/{chat_id}').then(r => r.ok)")  # saved on the box
    cleo.click("#open-settings")
    with cleo.expect_download() as got:
        cleo.click("#export-mine")
    body = json.loads(Path(got.value.path()).read_text())
    assert got.value.suggested_filename == "appliance-Cleo.json"
    assert body["person"]["name"] == "Cleo" and [c["id"] for c in body["chats"]] == [chat_id]
    assert body["chats"][0]["messages"][0]["content"] == "Name a colour."
