"""Attachments in the chat page, in headless Chromium against the real appliance on the
bundled model: a PDF (by the button), a DOCX (dropped) and a text file (pasted), each a chip
with its token count; a question answered from a fact only in the document, and a follow-up
that finds the document in the cache; the chat with its attachment kept over a reload and an
export/import; a document too long for the chat sent as its first part; a long one's
reading shown as it goes. The launch is test_page_browser.py's (Debian's chromium).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.documents import docx_bytes, pdf_bytes
from helpers.live import Live, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)

from helpers.browser import Watched  # noqa: E402

CTX = 2048
FILLER = ("The committee met on Tuesday to review the quarterly budget, the office move and the new "
          "printer contract. Minutes were taken by the secretary and approved without changes.")
QUESTION = "What is the project code word? Answer with the code word only."
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def fact(word: str) -> str:
    return f"The project code word is {word}."


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_server(tmp_path_factory.mktemp("documents"), model=bundled_model, slots=2, ctx_per_slot=CTX,
                     kv_tokens=8192, max_tokens_limit=512) as s:
        yield s




def ready(w: Watched) -> Any:
    p = w.page
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=120_000)
    p.click("#open-settings")
    p.fill("#max-tokens", "16")
    p.fill("#temperature", "0")
    p.click("#settings button[value=close]")
    return p


# Deadlines on conditions, long enough for a machine with a busy neighbour on every core (a
# 2,000-token document took 175 s to answer there, against ~30 s quiet): the suite's own
# per-test timeout (600 s) stays the bound.
def wait_answer(p: Any, n: int, timeout: float = 480) -> Any:
    p.wait_for_function(
        "n => document.querySelectorAll('article.assistant').length >= n && !document.querySelector('article.streaming')",
        arg=n, timeout=timeout * 1000)
    return p.locator("article.assistant").nth(n - 1)


def composer_chip(p: Any) -> Any:
    """The composer's one chip, once its file is read (its token count known)."""
    chip = p.locator("#attachments .chip[data-tokens]")
    chip.wait_for(timeout=120_000)
    return chip


def give(p: Any, how: str, name: str, mime: str, data: bytes) -> None:
    """A file dropped on the page or pasted into the message box, as the browser hands it over."""
    p.evaluate("""([how, name, mime, b64]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, { type: mime }));
        const input = document.getElementById('input');
        const opts = { bubbles: true, cancelable: true };
        if (how === 'paste') input.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, ...opts }));
        else for (const t of ['dragover', 'drop']) input.dispatchEvent(new DragEvent(t, { dataTransfer: dt, ...opts }));
    }""", [how, name, mime, base64.b64encode(data).decode()])


def ask(p: Any, n: int) -> str:
    p.fill("#input", QUESTION)
    p.press("#input", "Enter")
    return str(wait_answer(p, n).locator(".md").inner_text())


def test_attached_documents_answer_questions(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = ready(w)
    pdf = tmp_path / "minutes.pdf"
    pdf.write_bytes(pdf_bytes([FILLER, f"{FILLER}\n{fact('PERIWINKLE-42')}"]))
    p.set_input_files("#attach-file", str(pdf))
    chip = composer_chip(p)
    assert "minutes.pdf" in chip.inner_text() and " tokens" in chip.inner_text()
    assert int(chip.get_attribute("data-tokens")) > 40
    assert "PERIWINKLE-42" in ask(p, 1)
    assert p.locator("#attachments .chip").count() == 0  # the composer is empty again
    sent = p.locator("article.user .chip")
    assert sent.count() == 1 and "minutes.pdf" in sent.inner_text()
    content = w.chat_requests[-1]["body"]["messages"][-1]["content"]
    assert content.startswith("Attached file: minutes.pdf\n```\n") and content.endswith(f"```\n\n{QUESTION}")

    p.click("#new-chat")
    give(p, "drop", "agenda.docx", DOCX, docx_bytes([FILLER, fact("MARIGOLD-17"), FILLER]))
    assert "agenda.docx" in composer_chip(p).inner_text()
    assert "MARIGOLD-17" in ask(p, 1)

    p.click("#new-chat")
    give(p, "paste", "notes.txt", "text/plain", f"{FILLER}\n{fact('TANGERINE-88')}\n".encode())
    chip = composer_chip(p)
    tokens = int(chip.get_attribute("data-tokens"))
    # Counted by the server's tokenizer (POST /tokenize, parse_special false).
    r = live.client.post("/tokenize", json={"content": f"{FILLER}\n{fact('TANGERINE-88')}\n", "parse_special": False})
    assert tokens == len(r.json()["tokens"])
    assert "TANGERINE-88" in ask(p, 1)


def test_an_attachment_survives_a_reload_and_an_export_and_import(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = ready(w)
    f = tmp_path / "plan.md"
    f.write_text(f"# Plan\n\n{FILLER}\n\n{fact('SAFFRON-9')}\n")
    p.set_input_files("#attach-file", str(f))
    tokens = composer_chip(p).get_attribute("data-tokens")
    ask(p, 1)
    # A follow-up question (no file) in the same chat: the document comes from the cache.
    p.fill("#input", "Say it once more.")
    p.press("#input", "Enter")
    second = wait_answer(p, 2)
    assert second.locator(".notes .error").count() == 0
    assert int(second.get_attribute("data-cached-tokens")) > int(tokens or 0)
    p.reload()
    p.wait_for_selector("html[data-ready='1']")
    chip = p.locator("article.user .chip")
    assert chip.count() == 1 and "plan.md" in chip.inner_text() and chip.get_attribute("data-tokens") == tokens

    p.click("#chat-menu summary")
    with p.expect_download() as dl:
        p.click("#chat-menu button[data-act=export-json]")
    out = tmp_path / "chat.json"
    dl.value.save_as(out)
    [file] = json.loads(out.read_text())["messages"][0]["files"]
    assert file["name"] == "plan.md" and "SAFFRON-9" in file["text"] and file["tokens"] == int(tokens or 0)
    before = p.locator(".chat-item").count()
    p.set_input_files("#import-file", str(out))
    p.wait_for_function("n => document.querySelectorAll('.chat-item').length > n", arg=before)
    assert "plan.md" in p.locator("article.user .chip").inner_text()


def test_a_document_too_long_for_the_chat_is_sent_as_its_first_part(live: Live, page_of: Any,
                                                                     tmp_path: Path) -> None:
    w = page_of(live.url)
    p = ready(w)
    f = tmp_path / "long.txt"
    f.write_text(" ".join([FILLER] * 120))  # ~3,600 tokens in a 2,048-token context
    p.set_input_files("#attach-file", str(f))
    need = int(composer_chip(p).get_attribute("data-tokens"))
    assert need > CTX
    p.fill("#input", "Summarise this.")
    p.press("#input", "Enter")
    p.wait_for_selector("#ask[open]")
    assert "Send only the first part?" in p.locator("#ask-text").inner_text()
    p.click("#ask-ok")
    answer = wait_answer(p, 1)
    chip = p.locator("article.user .chip")
    assert "first part" in chip.inner_text()
    # Within what the server takes: the context less the answer's max tokens (16 here); and it took it.
    assert CTX // 2 < int(chip.get_attribute("data-tokens")) < CTX - 16
    assert answer.locator(".notes .error").count() == 0 and answer.locator(".md").inner_text().strip()
    content = w.chat_requests[-1]["body"]["messages"][-1]["content"]
    assert content.startswith("Attached file: long.txt (first part only)\n")


def test_a_long_document_shows_the_progress_of_its_reading(live: Live, page_of: Any, tmp_path: Path) -> None:
    w = page_of(live.url)
    p = ready(w)
    f = tmp_path / "report.txt"
    f.write_text(" ".join([FILLER] * 45))  # ~1,350 tokens: three steps and more (batch_tokens 512)
    p.set_input_files("#attach-file", str(f))
    assert int(composer_chip(p).get_attribute("data-tokens")) > 1024
    # Every label the waiting answer shows, as the page writes it (the server's ': prompt N/M').
    p.evaluate("""() => {
        window.readingLabels = [];
        new MutationObserver(() => {
            const label = document.querySelector('article.assistant .typing .label');
            const text = label ? label.textContent : '';
            if (text.startsWith('reading') && window.readingLabels.at(-1) !== text) window.readingLabels.push(text);
        }).observe(document.body, { subtree: true, childList: true, characterData: true });
    }""")
    p.fill("#input", "Summarise this.")
    p.press("#input", "Enter")
    answer = wait_answer(p, 1)
    assert answer.locator(".notes .error").count() == 0 and answer.locator(".md").inner_text().strip()
    labels = p.evaluate("window.readingLabels")
    shares = [int(m[1]) for text in labels if (m := re.fullmatch(r"reading the document: (\d+) %", text))]
    assert len(shares) >= 2 and len(shares) == len(labels), labels
    assert shares == sorted(shares) and shares[0] < 50, labels
