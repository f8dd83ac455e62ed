"""The office library in headless Chromium against the real appliance on the bundled model
(people mode): the operator adds two office documents as PDFs in /admin's Library section and
watches them index; Ben adds a private document of his own under My documents; Ann turns on
"Answer from the library" in a new chat, asks where to gather when the fire alarm goes off,
and the answer shows its sources: the Staff Handbook, page 7. Nothing of Ben's reaches Ann:
not in her page, not in her GET /v1/library. The sources stay with the chat after a reload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.documents import pdf_bytes
from helpers.live import ROOT, Live, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402
from helpers.browser import DESKTOP  # noqa: E402

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)

SET = ROOT / "bench" / "library" / "eval" / "set.json"
PASSWORDS = {"Ann": "ann's long password", "Ben": "ben's long password"}
QUESTION = "Where do we gather if the fire alarm goes off?"
INDEXED_S = 300  # the slowest machine embeds a document's passages in well under this


@pytest.fixture(scope="module")
def eval_set() -> dict[str, Any]:
    return dict(json.loads(SET.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("library")
    with live_server(d, model=bundled_model, auth="people", slots=2, ctx_per_slot=4096, kv_tokens=8192,
                     max_tokens_limit=96, default_max_tokens=48) as s:
        yield s


def as_pdf(doc: dict[str, Any], pages: int | None = None) -> dict[str, Any]:
    """A file for set_input_files: the document's pages as a PDF named after its title (the
    library's title for a PDF without one of its own)."""
    texts = [str(p) for p in doc["pages"]]
    if pages is not None:
        texts = (texts + [""] * pages)[:pages]
    return {"name": f"{doc['title']}.pdf", "mimeType": "application/pdf", "buffer": pdf_bytes(texts)}


def as_text(doc: dict[str, Any]) -> dict[str, Any]:
    text = "\n\n".join(doc["pages"])
    return {"name": f"{doc['title']}.txt", "mimeType": "text/plain", "buffer": text.encode()}


def add_person(admin: Any, name: str) -> str:
    admin.fill("#person-name", name)
    admin.click("#add-person button[type=submit]")
    admin.wait_for_function("name => document.getElementById('invite-name').textContent === name", arg=name)
    return str(admin.input_value("#invite-url"))


def accept_invite(page_of: Any, url: str, name: str) -> Any:
    w = page_of(url, viewport=DESKTOP, wait_ready=False)
    p = w.page
    p.wait_for_selector("#signin:not([hidden])")
    p.fill("#signin-password", PASSWORDS[name])
    p.click("#signin-go")
    p.wait_for_selector("html[data-ready='1']")
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
    return w


def wait_ready_docs(p: Any, where: str, n: int) -> None:
    """Until `where` lists n documents, all ready; a failed one, or the server's refusal shown in
    the section's alert, fails at once with its words."""
    p.wait_for_function("""([where, n]) => {
        const items = [...document.querySelectorAll(`${where} li`)];
        const failed = items.find(li => li.dataset.status === 'failed');
        if (failed) throw new Error(`indexing failed: ${failed.textContent}`);
        const alert = document.querySelector(where).parentElement.querySelector('[role=alert]');
        if (alert && !alert.hidden) throw new Error(alert.textContent);
        return items.length === n && items.every(li => li.dataset.status === 'ready'); }""",
                        arg=[where, n], timeout=INDEXED_S * 1000, polling=250)


def library_as(p: Any) -> list[dict[str, Any]]:
    """GET v1/library as the page asks it (the person's session and CSRF token)."""
    return list(p.evaluate("""() => import('./static/js/api.js').then(api => api.apiFetch('v1/library'))
        .then(r => r.json()).then(j => j.data)"""))


def ask(p: Any, text: str) -> Any:
    p.fill("#input", text)
    p.press("#input", "Enter")
    p.wait_for_function(
        "() => document.querySelectorAll('article.assistant').length >= 1 && !document.querySelector('article.streaming')",
        timeout=180_000)
    return p.locator("article.assistant").last


def test_office_library_answers_with_sources_and_keeps_private_documents_private(
        live: Live, page_of: Any, eval_set: dict[str, Any]) -> None:
    docs = {d["id"]: d for d in eval_set["documents"]}
    handbook, other = docs["handbook-en"], docs["travel-en"]
    private = eval_set["private_document"]
    assert "Linden bakery" in str(handbook["pages"][6])  # page 7 holds the assembly point
    assert "Bluefinch" in json.dumps(private)

    # The operator: two office documents through the Library section's file input, indexed.
    aw = page_of(live.url + "/admin")
    admin = aw.page
    admin.wait_for_selector("#library-admin:not([hidden])")
    admin.set_input_files("#lib-file", files=[as_pdf(handbook, pages=10), as_pdf(other)])
    wait_ready_docs(admin, "#lib-list", 2)
    listed = admin.inner_text("#lib-list")
    assert handbook["title"] in listed and "10 pages" in listed
    assert admin.locator("#lib-error").is_hidden()
    ann_invite, ben_invite = add_person(admin, "Ann"), add_person(admin, "Ben")

    # Ben: his private document under My documents (Settings), indexed.
    bw = accept_invite(page_of, ben_invite, "Ben")
    ben = bw.page
    ben.wait_for_selector("#library-row:not([hidden])")
    ben.click("#open-settings")
    ben.wait_for_selector("#my-docs:visible")
    ben.set_input_files("#doc-file", files=[as_text(private)])
    wait_ready_docs(ben, "#doc-list", 1)
    ben_doc = ben.get_attribute("#doc-list li", "data-id")
    assert ben_doc and ben.locator("#doc-error").is_hidden()
    ben.keyboard.press("Escape")
    mine = {d["id"]: d for d in library_as(ben)}
    assert mine[ben_doc]["scope"] == "own" and len(mine) == 3

    # The office's list does not show Ben's document.
    admin.reload()
    wait_ready_docs(admin, "#lib-list", 2)
    assert private["title"] not in admin.inner_text("#lib-list")

    # The operator replaces the travel policy with a version of one more page: indexed again.
    travel = admin.locator("#lib-list li", has_text=other["title"])
    travel_id = travel.get_attribute("data-id")
    with admin.expect_file_chooser() as chooser:
        travel.get_by_role("button", name=f"Replace {other['title']}").click()
    chooser.value.set_files(as_pdf(other, pages=len(other["pages"]) + 1))
    admin.wait_for_function("""([id, pages]) => { const li = document.querySelector(`#lib-list li[data-id="${id}"]`);
        return li && li.dataset.status === 'ready' && li.textContent.includes(pages); }""",
                            arg=[travel_id, f"{len(other['pages']) + 1} pages"], timeout=INDEXED_S * 1000)
    wait_ready_docs(admin, "#lib-list", 2)

    # Ann: a new chat with the library switch on, the question, an answer citing page 7.
    aw2 = accept_invite(page_of, ann_invite, "Ann")
    ann = aw2.page
    ann.wait_for_selector("#library-row:not([hidden])")
    ann.check("#library")
    answer = ask(ann, QUESTION)
    assert aw2.chat_requests[-1]["body"].get("library") is True
    assert answer.locator(".md").inner_text().strip(), "an empty answer"
    sources = answer.locator(".sources")
    sources.wait_for()
    cited = sources.locator("summary").all_inner_texts()
    assert any("Staff Handbook" in s and s.rstrip().endswith("p. 7") for s in cited), cited
    first = sources.locator("details").first
    first.locator("summary").click()
    assert first.locator("blockquote").inner_text().strip()  # the passage itself
    if answer.locator("button.cite").count():  # a [n] in the answer opens its source
        answer.locator("button.cite").first.click()
        n = answer.locator("button.cite").first.get_attribute("data-cite")
        assert sources.locator(f"details[data-n='{n}']").get_attribute("open") is not None

    # Nothing of Ben's in Ann's page or her library.
    assert "Bluefinch" not in ann.content() and private["title"] not in ann.content()
    hers = library_as(ann)
    assert ben_doc not in {d["id"] for d in hers} and len(hers) == 2
    assert all(d["scope"] == "office" for d in hers)

    # After a reload the chat keeps its switch and its answer's sources (once the answer is saved on the box:
    # with its check, which comes at the end; a save while it streamed has the sources unchecked).
    saved = ann.wait_for_function("""() => import('./static/js/api.js').then(api => api.apiFetch(
        `v1/chats/${document.querySelector('.chat-item').dataset.id}`)).then(r => r.json())
        .then(c => c.meta.library === true && c.messages.length === 2 && c.messages[1].meta.sources
              && c.messages[1].meta.grounding ? c : null)""",
                                  polling=250, timeout=10_000).json_value()
    supports = sources.locator("q.support").evaluate_all("qs => qs.map(q => q.textContent)")
    assert supports == [s["support"] for s in saved["messages"][1]["meta"]["sources"] if s.get("support")]
    assert [s["n"] for s in saved["messages"][1]["meta"]["sources"]] == [int(c[1:c.index("]")]) for c in cited]
    ann.reload()
    ann.wait_for_selector("html[data-ready='1']")
    ann.wait_for_selector("article.assistant .sources")
    assert ann.is_checked("#library")
    assert ann.locator("article.assistant .sources summary").all_inner_texts() == cited
    assert ann.locator("article.assistant .sources q.support").evaluate_all("qs => qs.map(q => q.textContent)") == supports

    # Ben deletes his document: it is gone from his list and his library.
    ben.click("#open-settings")
    ben.click(f"#doc-list li[data-id='{ben_doc}'] button:text('Delete')")
    ben.wait_for_selector("#ask[open]")
    ben.click("#ask-ok")
    ben.wait_for_selector("#docs-empty:visible")
    assert ben_doc not in {d["id"] for d in library_as(ben)}
