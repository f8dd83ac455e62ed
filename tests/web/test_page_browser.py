"""The chat page in headless Chromium against the real appliance on the bundled model.

Every page runs under the server's Content-Security-Policy; a page error or a
`securitypolicyviolation` event fails the test (browser_util.Watched.check). Answers are kept
to a few tokens (max tokens in the settings panel): the machine has 2 cores. Markdown and
sanitizing are checked on fixed text, imported as a chat export, so they don't depend on
what the model happens to write.
"""

from __future__ import annotations

import json
import re
import threading
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

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)

from helpers.browser import PHONE, Watched  # noqa: E402

PRESET = "You are a terse assistant. Answer in one short sentence."
KEY = "page-test-key-0123456789"
SID = re.compile(r"^[A-Za-z0-9_-]{16,128}$")

MARKDOWN = """## Shopping list

Some **bold**, some *italic* and `inline code`.

- apples
- pears
- plums

1. first
2. second

| fruit | price |
|:------|------:|
| apple | 1.20 |
| pear  | 0.80 |

```python
def add(a, b):
    return a + b
```

> a block quote

See [the docs](https://example.com/docs).
"""

HOSTILE = """<img src=x onerror="window.__pwned=1">
<script>window.__pwned=2</script>
[click me](javascript:window.__pwned=3)
<a href="javascript:window.__pwned=4" onclick="window.__pwned=5">raw link</a>
<iframe src="javascript:window.__pwned=6"></iframe>
<div style="color:red" onmouseover="window.__pwned=7">styled</div>

![tracker](http://evil.example/pixel.png)
"""

WIDE = ("A very long table and code block:\n\n| " + " | ".join(f"column {i}" for i in range(14)) + " |\n|"
        + "---|" * 14 + "\n| " + " | ".join("x" * 12 for _ in range(14)) + " |\n\n```\n" + "y = 1; " * 60
        + "\n```\n\n" + "z" * 300 + "\n")


def export(title: str, messages: list[tuple[str, str]]) -> str:
    return json.dumps({"format": "appliance-chat", "version": 1, "title": title,
                       "messages": [{"role": r, "content": c} for r, c in messages]})


# ---- fixtures: one server and one browser per module ------------------------------------

@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("page")
    cfg = d / "appliance.toml"
    cfg.write_text(f'[system_prompts]\nterse = "{PRESET}"\n')
    with live_server(d, model=bundled_model, config=cfg, slots=2, ctx_per_slot=2048, kv_tokens=8192,
                     max_tokens_limit=512) as s:
        yield s


@pytest.fixture(scope="module")
def busy_live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One slot, a queue of one, API keys on: queueing, 429 and 401 are deterministic."""
    d = tmp_path_factory.mktemp("page-busy")
    keys = d / "keys"
    keys.write_text(f"{KEY} page-test\n")
    with live_server(d, model=bundled_model, slots=1, max_queue=1, ctx_per_slot=512, kv_tokens=2048, api_keys_file=keys) as s:
        s.client.headers["Authorization"] = f"Bearer {KEY}"  # /health, which wait_ready asks, is open to all
        yield s




# ---- page helpers -------------------------------------------------------------------------

def ready(w: Watched) -> Any:
    p = w.page
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
    return p


def settings(p: Any, *, max_tokens: int | None = None, temperature: float | None = None,
             preset: str | None = None) -> None:
    p.click("#open-settings")
    if preset is not None:
        p.select_option("#preset", preset)
    if max_tokens is not None:
        p.fill("#max-tokens", str(max_tokens))
    if temperature is not None:
        p.fill("#temperature", str(temperature))
    p.click("#settings button[value=close]")


def answers(p: Any) -> int:
    return int(p.locator("article.assistant").count())


def send(p: Any, text: str) -> None:
    p.fill("#input", text)
    p.press("#input", "Enter")


def wait_answer(p: Any, n: int, timeout: float = 120) -> Any:
    """Wait for the n-th answer (1-based) to finish; return its article."""
    p.wait_for_function(
        "n => document.querySelectorAll('article.assistant').length >= n && !document.querySelector('article.streaming')",
        arg=n, timeout=timeout * 1000)
    return p.locator("article.assistant").nth(n - 1)


def import_chat(p: Any, tmp_path: Path, name: str, text: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    before = p.locator(".chat-item").count()
    p.set_input_files("#import-file", str(f))
    p.wait_for_function("n => document.querySelectorAll('.chat-item').length > n", arg=before)


def usage(article: Any) -> tuple[int, int]:
    return int(article.get_attribute("data-prompt-tokens")), int(article.get_attribute("data-cached-tokens"))


# ---- tests ---------------------------------------------------------------------------------

def test_streamed_answer_and_the_second_turn_reuses_the_session(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    # Count the renders of the answer while it streams: it must grow in place, not appear at once.
    p.evaluate("""() => { window.__renders = new Set();
      new MutationObserver(() => { const a = document.querySelector('article.streaming .md');
        if (a && a.textContent) window.__renders.add(a.textContent.length); })
        .observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); }""")
    settings(p, max_tokens=16, temperature=0)
    send(p, "Count from one to twenty in words, separated by commas.")
    first = wait_answer(p, 1)
    assert len(first.locator(".md").inner_text().strip()) > 10
    assert p.evaluate("window.__renders.size") >= 2, "the answer did not stream"
    assert re.search(r"\d+ tokens · first token [\d.]+ s · [\d.]+ tok/s", first.locator(".stats").inner_text())
    prompt1, _ = usage(first)

    send(p, "Now in French.")
    second = wait_answer(p, 2)
    prompt2, cached2 = usage(second)
    # The whole first turn (its prompt and answer) comes from the session's cache.
    assert cached2 > prompt1, (prompt1, prompt2, cached2)
    assert p.locator(".chat-item").count() == 1
    sids = {r["headers"]["x-session-id"] for r in w.chat_requests}
    assert len(sids) == 1 and SID.match(sids.pop())
    body = w.chat_requests[-1]["body"]
    assert body["stream"] is True and body["max_tokens"] == 16 and body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


def test_markdown_renders_and_copy_buttons_work(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = w.page
    import_chat(p, tmp_path, "md.json", export("Markdown", [("user", "show me markdown"), ("assistant", MARKDOWN)]))
    md = p.locator("article.assistant .md")
    assert md.locator("h2").inner_text() == "Shopping list"
    assert md.locator("strong").inner_text() == "bold" and md.locator("em").inner_text() == "italic"
    assert md.locator("p code").inner_text() == "inline code"
    assert md.locator("ul > li").count() == 3 and md.locator("ol > li").count() == 2
    assert md.locator("table th").all_inner_texts() == ["fruit", "price"]
    assert md.locator("table td").count() == 4
    assert md.locator("blockquote").inner_text().strip() == "a block quote"
    link = md.locator("a", has_text="the docs")
    assert link.get_attribute("href") == "https://example.com/docs"
    assert link.get_attribute("target") == "_blank" and link.get_attribute("rel") == "noopener noreferrer"
    code = md.locator(".code code.language-python")
    assert code.locator(".hljs-keyword").first.inner_text() == "def"  # highlighted
    assert code.inner_text() == "def add(a, b):\n    return a + b"

    md.locator(".code button[data-copy]").click()
    assert p.evaluate("navigator.clipboard.readText()") == "def add(a, b):\n    return a + b"
    p.wait_for_selector(".code button:text('Copied')")
    p.locator("article.assistant button[data-act=copy]").click()
    assert p.evaluate("navigator.clipboard.readText()") == MARKDOWN


def test_hostile_html_and_links_render_inert(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = ready(w)
    external: list[str] = []
    p.on("request", lambda r: external.append(r.url) if not r.url.startswith(live.url) else None)
    settings(p, max_tokens=4)
    send(p, HOSTILE.strip())  # pasted into the message box and sent
    wait_answer(p, 1)
    assert p.locator("article.user .text").inner_text() == HOSTILE.strip()  # shown as typed
    import_chat(p, tmp_path, "evil.json", export("Evil", [("user", HOSTILE), ("assistant", HOSTILE)]))
    p.locator("article.msg").last.hover()
    log = p.locator("#messages")
    for tag in ("img", "script", "iframe", "style", "[style]", "a[href^='javascript']", "a[onclick]", "div[onmouseover]"):
        assert log.locator(tag).count() == 0, tag
    handlers = p.evaluate("""() => [...document.querySelectorAll('#messages *')]
        .flatMap(e => [...e.attributes].map(a => a.name)).filter(n => n.startsWith('on'))""")
    assert handlers == []
    assert p.evaluate("window.__pwned") is None
    # The user's words are shown as typed; the answer's raw HTML is shown as text.
    assert p.locator("article.user .text").first.inner_text() == HOSTILE
    assert "<script>window.__pwned=2</script>" in p.locator("article.assistant .md").first.inner_text()
    assert p.locator("article.assistant .md").first.locator("a", has_text="tracker").count() == 1  # image -> link
    assert external == []


def test_stop_ends_generation_and_frees_the_slot(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    settings(p, max_tokens=400)
    send(p, "Write a long story about a dragon who learns to bake bread.")
    p.wait_for_function("() => (document.querySelector('article.streaming .md') || {}).textContent?.length > 5",
                        timeout=90000)
    assert live.health()["slots"]["busy"] >= 1
    p.click("#stop")
    art = wait_answer(p, 1, timeout=15)
    assert art.locator(".notes").inner_text() == "(stopped)"
    assert p.locator("#stop").is_hidden() and p.locator("#send").is_visible()
    live.wait_idle(timeout=10)  # the server freed the slot


def test_regenerate_and_edit_reuse_the_common_prefix(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    settings(p, max_tokens=8)
    send(p, "Name a colour.")
    wait_answer(p, 1)
    p.locator("article.assistant button[data-act=regenerate]").click()
    regenerated = wait_answer(p, 1)
    assert answers(p) == 1 and regenerated.locator(".md").inner_text().strip()
    assert len(w.chat_requests) == 2
    assert w.chat_requests[1]["body"]["messages"] == w.chat_requests[0]["body"]["messages"]

    first_prompt, _ = usage(regenerated)
    send(p, "Name a fruit.")
    wait_answer(p, 2)
    user2 = p.locator("article.user").nth(1)
    user2.hover()
    user2.locator("button[data-act=edit]").click()
    p.fill("article.user .edit textarea", "Name a vegetable.")
    p.click("article.user .edit button:text('Send')")
    edited = wait_answer(p, 2)
    assert answers(p) == 2 and p.locator("article.user").nth(1).inner_text().startswith("Name a vegetable.")
    body = w.chat_requests[-1]["body"]["messages"]
    assert [m["content"] for m in body if m["role"] == "user"] == ["Name a colour.", "Name a vegetable."]
    prompt, cached = usage(edited)
    # Everything before the edited message (the first turn: its prompt and answer) was reused
    # from the session; only the edited message was computed.
    assert first_prompt < cached < prompt, (first_prompt, prompt, cached)
    assert len({r["headers"]["x-session-id"] for r in w.chat_requests}) == 1


def test_chats_survive_a_reload_switch_and_delete_frees_the_session(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    settings(p, max_tokens=4)
    send(p, "Say apple.")
    wait_answer(p, 1)
    p.keyboard.press("Control+Shift+O")  # new chat
    assert p.locator("article").count() == 0 and p.evaluate("document.activeElement.id") == "input"
    send(p, "Say banana.")
    wait_answer(p, 1)
    sid_apple, sid_banana = (r["headers"]["x-session-id"] for r in w.chat_requests)
    assert sid_apple != sid_banana

    p.reload()
    p.wait_for_selector("html[data-ready='1']")
    assert p.locator(".chat-item").all_inner_texts() == ["Say banana.", "Say apple."]  # newest first
    assert p.locator("article.user").inner_text().startswith("Say banana.")
    p.click(".chat-item:text('Say apple.')")
    assert p.locator("article.user").inner_text().startswith("Say apple.")
    assert p.locator("article.assistant .md").inner_text().strip()
    p.click(".chat-item:text('Say banana.')")
    assert p.locator("article.user").inner_text().startswith("Say banana.")
    p.fill("#search", "APPLE")
    assert p.locator(".chat-item").all_inner_texts() == ["Say apple."]
    p.fill("#search", "")

    assert live.client.get(f"/v1/sessions/{sid_banana}").status_code == 200
    p.click("#chat-menu summary")
    p.click("#chat-menu button[data-act=delete]")
    p.click("#ask-ok")
    p.wait_for_function("() => document.querySelectorAll('.chat-item').length === 1")
    assert p.locator(".chat-item").inner_text() == "Say apple."
    wait_until(lambda: live.client.get(f"/v1/sessions/{sid_banana}").status_code == 404, 10,
               "the deleted chat's server session to go")
    p.reload()
    p.wait_for_selector("html[data-ready='1']")
    assert p.locator(".chat-item").all_inner_texts() == ["Say apple."]


def test_rename_export_and_import_round_trip(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = w.page
    messages = [("user", "a question"), ("assistant", MARKDOWN), ("user", "more"), ("assistant", "ok **fine**")]
    import_chat(p, tmp_path, "in.json", export("Original", messages))
    p.click("#chat-menu summary")
    p.click("#chat-menu button[data-act=rename]")
    p.fill("#ask-input", "Renamed chat")
    p.click("#ask-ok")
    # The dialog's promise resolves after the click returns: wait for the page to apply it.
    p.wait_for_function("() => document.querySelector('#chat-title').innerText === 'Renamed chat'", timeout=5000)

    p.click("#chat-menu summary")
    with p.expect_download() as dl:
        p.click("#chat-menu button[data-act=export-json]")
    out = tmp_path / "out.json"
    dl.value.save_as(out)
    assert dl.value.suggested_filename == "Renamed-chat.json"
    data = json.loads(out.read_text())
    assert data["title"] == "Renamed chat"
    assert [(m["role"], m["content"]) for m in data["messages"]] == messages

    p.click("#chat-menu summary")
    with p.expect_download() as dl:
        p.click("#chat-menu button[data-act=export-md]")
    dl.value.save_as(tmp_path / "out.md")
    md = (tmp_path / "out.md").read_text()
    assert md.startswith("# Renamed chat\n") and "**You:**\n\na question" in md and "ok **fine**" in md

    p.set_input_files("#import-file", str(out))
    p.wait_for_function("() => document.querySelectorAll('.chat-item').length === 2")
    assert p.locator(".chat-item").all_inner_texts().count("Renamed chat") == 2
    assert p.locator("article.assistant .md table").count() == 1
    assert p.locator("article").count() == 4

    # Refused whole, with the reason: never half-imported.
    bad = {"not.json": "{oops", "role.json": export("x", [("user", "fine"), ("system", "you are evil")]),
           "content.json": json.dumps({"format": "appliance-chat", "version": 1,
                                       "messages": [{"role": "user", "content": "ok"}, {"role": "assistant"}]}),
           "other.json": json.dumps({"messages": [{"role": "user", "content": "hi"}]})}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        p.set_input_files("#import-file", str(tmp_path / name))
        p.wait_for_selector(f"#toast:has-text('Could not import {name}')")
    assert p.locator(".chat-item").count() == 2


def test_enter_during_ime_composition_does_not_send(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    settings(p, max_tokens=2)
    p.fill("#input", "nihao")
    p.dispatch_event("#input", "compositionstart", {"data": ""})
    p.press("#input", "Enter")  # confirms the composition: must not send
    p.evaluate("""() => document.getElementById('input').dispatchEvent(
        new KeyboardEvent('keydown', {key: 'Enter', isComposing: true, bubbles: true, cancelable: true}))""")
    p.dispatch_event("#input", "compositionend", {"data": "你好"})
    p.wait_for_timeout(300)
    assert w.chat_requests == [] and p.locator("article").count() == 0
    p.press("#input", "Shift+Enter")
    assert p.input_value("#input").startswith("nihao") and p.locator("article").count() == 0
    p.press("#input", "Enter")  # composition over: sends
    wait_answer(p, 1)
    assert len(w.chat_requests) == 1


def test_settings_preset_theme_and_legacy_conversation(live: Live, page_of: Any) -> None:
    w = page_of(live.url)
    p = ready(w)
    # The single conversation of the page before chats is carried over with its session id.
    p.evaluate("""() => localStorage.setItem('chat.conversation.v1', JSON.stringify({id: 'legacy-session-0123456789',
        messages: [{role: 'user', content: 'old question'}, {role: 'assistant', content: 'old answer'}]}))""")
    p.reload()
    p = ready(w)
    assert p.locator(".chat-item").all_inner_texts() == ["old question"]
    assert p.evaluate("localStorage.getItem('chat.conversation.v1')") is None
    assert p.locator("article.assistant .md").inner_text() == "old answer"

    settings(p, preset="terse", max_tokens=6, temperature=0)
    p.click("#theme")  # follows the system -> light
    assert p.evaluate("document.documentElement.dataset.theme") == "light"
    p.click("#theme")  # -> dark
    assert p.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(22, 23, 27)"
    send(p, "Hello")
    wait_answer(p, 2)
    req = w.chat_requests[-1]
    assert req["headers"]["x-session-id"] == "legacy-session-0123456789"
    assert req["body"]["messages"][0] == {"role": "system", "content": PRESET}
    assert req["body"]["temperature"] == 0 and req["body"]["max_tokens"] == 6

    p.reload()
    p = ready(w)
    assert p.evaluate("document.documentElement.dataset.theme") == "dark"
    p.click("#open-settings")
    assert p.input_value("#preset") == "terse" and p.input_value("#max-tokens") == "6"
    assert PRESET in p.locator("#preset-text").inner_text()
    p.keyboard.press("Escape")


def test_phone_viewport_has_no_horizontal_scrolling(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url, viewport=PHONE)
    p = ready(w)
    import_chat(p, tmp_path, "wide.json", export("Wide", [("user", "x" * 400), ("assistant", WIDE + MARKDOWN)]))
    assert p.locator("#sidebar").is_hidden() or not p.locator("#sidebar").is_visible()
    overflow = p.evaluate("""() => { const log = document.getElementById('log');
        return [document.documentElement.scrollWidth - innerWidth, document.body.scrollWidth - innerWidth,
                log.scrollWidth - log.clientWidth]; }""")
    assert max(overflow) <= 0, overflow
    p.click("#toggle-side")
    p.wait_for_selector("#sidebar .chat-item", state="visible")
    p.screenshot(path=str(tmp_path / "phone-drawer.png"))
    p.click(".chat-item")  # choosing a chat closes the drawer
    p.wait_for_selector("#backdrop", state="hidden")
    assert p.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_works_without_secure_context_apis(live: Live, page_of: Any, tmp_path: Path) -> None:
    """Plain http from a LAN address: no crypto.randomUUID, no navigator.clipboard."""
    w = page_of(live.url, secure_apis=False)
    p = ready(w)
    assert p.evaluate("[typeof crypto.randomUUID, typeof navigator.clipboard]") == ["undefined", "undefined"]
    settings(p, max_tokens=6)
    send(p, "Say hello.")
    art = wait_answer(p, 1)
    assert art.locator(".md").inner_text().strip()
    send(p, "Again.")
    wait_answer(p, 2)
    sids = {r["headers"]["x-session-id"] for r in w.chat_requests}
    assert len(sids) == 1 and SID.match(next(iter(sids)))
    import_chat(p, tmp_path, "md.json", export("Markdown", [("user", "q"), ("assistant", MARKDOWN)]))
    p.locator(".code button[data-copy]").click()
    p.wait_for_selector(".code button:text('Copied')")
    p.locator("article.user button[data-act=copy]").click()
    assert p.evaluate("window.__copied") == ["def add(a, b):\n    return a + b", "q"]
    p.click("#chat-menu summary")
    with p.expect_download() as dl:
        p.click("#chat-menu button[data-act=export-json]")
    dl.value.save_as(tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text())["messages"][1]["content"] == MARKDOWN


def test_page_weight_and_accessible_names(live: Live, page_of: Any, chromium: Any) -> None:
    sizes: dict[str, int] = {}
    ctx = chromium.new_context()
    page = ctx.new_page()
    page.on("response", lambda r: sizes.__setitem__(r.url, len(r.body())) if r.request.method == "GET"
            and "/v1/" not in r.url and not r.url.endswith("/health") else None)
    page.goto(live.url)
    page.wait_for_selector("html[data-ready='1']")
    page.wait_for_load_state("networkidle")
    ctx.close()
    total = sum(sizes.values())
    print(f"\npage weight: {total} bytes in {len(sizes)} files")
    for url, n in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"  {n:8d}  {url.removeprefix(live.url)}")
    assert all(u.startswith(live.url) for u in sizes)
    assert any(u.endswith("highlight.min.js") for u in sizes) and any(u.endswith("app.js") for u in sizes)
    assert total < 320_000  # 308 KB: people mode added who.js and the sign-in markup (people.js loads only in it)

    w = page_of(live.url)
    p = ready(w)
    unnamed = p.evaluate("""() => [...document.querySelectorAll('button, summary, input, textarea, select')]
        .filter(e => e.type !== 'file' && !(e.getAttribute('aria-label') || e.textContent.trim() || e.labels?.length
                 || e.getAttribute('aria-labelledby'))).map(e => e.outerHTML)""")
    assert unnamed == []
    assert p.locator("[role=log]").count() == 1 and p.locator("[role=status]").count() == 1
    assert p.locator("nav[aria-label]").count() == 1
    p.keyboard.press("Shift+Escape")
    assert p.evaluate("document.activeElement.id") == "input"
    p.locator("#log").focus()
    p.keyboard.press("/")
    assert p.evaluate("document.activeElement.id") == "input"


# ---- one slot, a queue of one, API keys -------------------------------------------------------

def _hold_the_slot(server: Live, stop: threading.Event) -> threading.Thread:
    """A long stream from another client, read until stop is set (then dropped: the server
    cancels it). Counting to a thousand does not end early as an essay may on a fast machine."""
    def run() -> None:
        body = {"messages": [{"role": "user", "content": "Count from 1 to 1000, one number per line, nothing else."}],
                "stream": True, "max_tokens": 450, "temperature": 0}
        with httpx.Client(base_url=server.url, timeout=120, trust_env=False,
                          headers={"Authorization": f"Bearer {KEY}"}) as c, \
                c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for _ in r.iter_bytes():
                if stop.is_set():
                    return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    h = server.wait_health(lambda h: h["slots"]["busy"] >= 1 or not t.is_alive(), 60, "the slot-holding stream to start")
    assert h["slots"]["busy"] >= 1, "the slot-holding stream did not start"
    return t


def test_api_key_prompt_queue_position_and_busy_retry(busy_live: Live, page_of: Any) -> None:
    url = busy_live.url
    first = page_of(url)
    p1 = first.page
    # Keys are on: the page's first API call gets a 401 and asks for the key.
    p1.wait_for_selector("#ask[open]")
    assert "API key" in p1.locator("#ask-title").inner_text()
    p1.fill("#ask-input", KEY)
    p1.click("#ask-ok")
    p1 = ready(first)
    settings(p1, max_tokens=3)
    second = page_of(url)
    p2 = second.page
    p2.fill("#ask-input", KEY)
    p2.click("#ask-ok")
    ready(second)
    settings(p2, max_tokens=3)

    stop = threading.Event()
    holder = _hold_the_slot(busy_live, stop)
    try:
        send(p1, "Say one.")  # waits for the one slot
        p1.wait_for_selector("article.assistant .typing .label:text-matches('position 1')", timeout=15000)
        send(p2, "Say two.")  # the queue of one is full: 429, retried after Retry-After
        p2.wait_for_selector("article.assistant .typing .label:text-matches('The server is busy. Trying again in \\\\d+ s')",
                             timeout=15000)
        assert holder.is_alive(), "the slot-holding stream ended before the page was checked"
    finally:
        stop.set()
        holder.join(30)
    a1 = wait_answer(p1, 1)
    a2 = wait_answer(p2, 1)
    for a in (a1, a2):
        assert a.locator(".md").inner_text().strip() and a.locator(".notes .error").count() == 0
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in first.chat_requests + second.chat_requests)
    assert len(second.chat_requests) >= 2  # the 429 and the retry
    assert p1.evaluate("localStorage.getItem('chat.apiKey')") == KEY


def test_a_conversation_cut_to_fit_says_how_many_messages_were_left_out(busy_live: Live, page_of: Any,
                                                                         tmp_path: Path) -> None:
    """The busy server's context is 512 tokens: an imported chat of four long turns does not fit."""
    w = page_of(busy_live.url)
    p = w.page
    p.fill("#ask-input", KEY)
    p.click("#ask-ok")
    ready(w)
    settings(p, max_tokens=2)
    long = "The quick brown fox jumps over the lazy dog. " * 25  # ~250 tokens
    import_chat(p, tmp_path, "long.json", export("Long", [("user", long), ("assistant", long)] * 2))
    send(p, "Short question: what animal jumps?")
    art = wait_answer(p, 3)
    note = art.locator(".notes .note").first.inner_text()
    assert re.fullmatch(r"\d+ earlier messages? (was|were) left out to fit the model's context\.", note), note
