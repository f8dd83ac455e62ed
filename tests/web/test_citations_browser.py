"""A library answer in headless Chromium shows the sentence that supports it and marks what no
source supports (issue 49's browser test).

- End to end, the real appliance on the bundled model: the Staff Handbook in the office library,
  a question the model answers from one sentence at temperature 0 (the company's pension
  contribution, page 3: "The company contributes 6% of basic salary to the pension.", the same
  in every run tried). The answer shows that sentence under it with the document and page; it
  stays after a reload and goes with the Markdown export.
- An unsupported figure: whether the 0.5B model invents one is not the test's to decide, so the
  stream the page reads is the appliance's own server code (in-process, the same check)
  answering with a scripted model, a reply with a figure in no source and a [n] its passage
  does not support, passed to the page by Playwright's page.route. The marks, the dropped [n]
  and the notice come from the server's check, not from a response written by hand.
- The rendering on fixed messages: marks inside bold, code and a link, a figure twice, next to
  CJK, not inside a longer number; a dropped [n] left out, an unused source apart, a source the
  server quoted after an answer that does not stand apart with its sentence; the server's
  own answer plain; a message kept before the check rendered as before; a source's sentence
  shown as text, never markup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.documents import pdf_bytes
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, serving
from helpers.library import FakeEmbedService, library_of, ready, upload
from helpers.live import ROOT, Live, live_server
from helpers.polling import wait_until
from starlette.testclient import TestClient

pytestmark = [pytest.mark.browser, pytest.mark.integration]

pytest.importorskip("playwright")
from helpers import browser as browser_util  # noqa: E402

if browser_util.chromium_path() is None:
    pytest.skip("no Chromium: install it with  sudo apt-get install -y chromium  (scripts/setup.sh does as root)",
                allow_module_level=True)

SET = ROOT / "bench" / "library" / "eval" / "set.json"
QUESTION = "What percentage of basic salary does the company contribute to the pension?"
SUPPORT = "The company contributes 6% of basic salary and you contribute 4%"
FIRE = ("If you discover a fire, leave the building by the nearest exit. The office's emergency assembly point "
        "is the car park behind the Linden bakery, marked with a green sign numbered 14.")
LEAVE = "Full-time employees receive 27 days of paid annual leave plus the 8 public holidays."
ASKED = "Where is the emergency assembly point if there is a fire?"
# [1] holds the bakery, [2] (the leave policy) nothing of its sentence, and 41 is in no source.
INVENTED = "Go to the car park behind the Linden bakery [1], by the green sign numbered **41** [2]."
NOTICE = "Some figures in this answer are not in the library's sources."


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The real appliance with the Staff Handbook (a PDF of its ten pages) in its library."""
    handbook = next(d for d in json.loads(SET.read_text(encoding="utf-8"))["documents"] if d["id"] == "handbook-en")
    with live_server(tmp_path_factory.mktemp("citations"), model=bundled_model, slots=1, ctx_per_slot=4096,
                     kv_tokens=4096, max_tokens_limit=96, default_max_tokens=64) as s:
        r = s.client.post("/admin/library", params={"title": handbook["title"]}, content=pdf_bytes(handbook["pages"]),
                          headers={"content-type": "application/pdf", "x-file-name": "handbook.pdf"})
        assert r.status_code == 202, r.text
        path = f"/v1/library/{r.json()['id']}"
        wait_until(lambda: s.client.get(path).json()["status"] == "ready", 300, "the handbook to be indexed", every=0.2)
        yield s


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, FakeModel]]:
    """The appliance in-process on a scripted model and a fake embedder (helpers.inprocess), its
    library holding the fire and leave paragraphs as two documents."""
    service = FakeEmbedService()
    model = FakeModel(reply=INVENTED)
    with serving(lambda: model, embedder=service, ctx=2048,
                 library=library_of(tmp_path_factory.mktemp("scripted"), service)) as c:
        for name, text in (("Fire safety.txt", FIRE), ("Annual leave.txt", LEAVE)):
            assert upload(c, "/admin/library", name, text.encode()).status_code == 202
        ready(c, "/admin/library")
        yield c, model


def opened(page_of: Any, live: Live) -> Any:
    p = page_of(live.url).page
    p.wait_for_selector("#status-text:text-matches('^ready')", timeout=30000)
    return p


def ask(p: Any, text: str, max_tokens: int = 48) -> Any:
    """Greedy, short, from the library: the question sent, its answer's article once complete."""
    p.click("#open-settings")
    p.fill("#temperature", "0")
    p.fill("#max-tokens", str(max_tokens))
    p.click("#settings button[value=close]")
    p.wait_for_selector("#library-row:not([hidden])")
    p.check("#library")
    p.fill("#input", text)
    p.press("#input", "Enter")
    p.wait_for_function(
        "() => document.querySelectorAll('article.assistant').length >= 1 && !document.querySelector('article.streaming')",
        timeout=180_000)
    return p.locator("article.assistant").last


def markdown_export(p: Any) -> str:
    return str(p.evaluate("""() => Promise.all([import('./static/js/chatfile.js'), import('./static/js/page.js')])
        .then(([file, pg]) => file.toMarkdown(pg.page.current))"""))


def test_an_answer_shows_the_sentence_that_supports_it(live: Live, page_of: Any) -> None:
    p = opened(page_of, live)
    answer = ask(p, QUESTION)
    assert "6%" in answer.locator(".md").inner_text(), answer.inner_text()  # the premise: the answer the model writes
    used = answer.locator(".sources details:not(.unused)")
    assert used.count() == 1, answer.inner_text()
    summary = used.locator("summary")
    assert SUPPORT in used.locator("q.support").inner_text()
    assert re.match(r"\[\d\] ", summary.inner_text()), summary.inner_text()
    assert summary.inner_text().endswith("— Staff Handbook 2026, p. 3"), summary.inner_text()
    summary.click()  # opens to the whole passage
    assert "Ashgrove Life" in used.locator("blockquote").inner_text()
    # The pages given and not used, apart and closed.
    unused = answer.locator(".sources details.unused")
    assert unused.count() >= 1 and "Also given, not used:" in answer.locator(".sources").inner_text()
    assert all(d.get_attribute("open") is None for d in unused.all())
    assert answer.locator("mark.unsupported").count() == 0 and NOTICE not in answer.inner_text()
    shown = used.locator("q.support").text_content()
    assert f"“{shown}”" in markdown_export(p)

    p.reload()  # kept with the message: the same after a reload
    p.wait_for_selector("html[data-ready='1']")
    p.wait_for_selector("article.assistant .sources q.support")
    assert p.locator("article.assistant .sources details:not(.unused) q.support").text_content() == shown


def test_a_figure_in_no_source_is_marked(live: Live, page_of: Any,
                                         scripted: tuple[TestClient, FakeModel]) -> None:
    client, model = scripted
    answers: list[dict[str, Any]] = []

    def replay(route: Any) -> None:  # the page's request answered by the in-process appliance
        body = {k: v for k, v in route.request.post_data_json.items() if k != "model"}
        r = client.post(CHAT, json=body)
        answers.append({"status": r.status_code, "text": r.text})
        route.fulfill(status=r.status_code, headers={"content-type": r.headers["content-type"]}, body=r.content)

    p = opened(page_of, live)
    p.route("**/v1/chat/completions", replay)
    answer = ask(p, ASKED, max_tokens=200)  # the scripted reply whole (its tokens are characters)
    # The premise: the server's check of the scripted reply, as the page received it.
    end = [json.loads(x[6:]) for x in answers[0]["text"].splitlines() if x.startswith("data: {")]
    grounding = next(e["grounding"] for e in end if "grounding" in e)
    assert grounding == {"verdict": "partly", "unsupported": ["41"], "dropped": [2], "unmentioned": []}, answers

    marks = answer.locator("mark.unsupported")
    marks.first.wait_for()
    assert marks.count() == 1 and marks.first.evaluate("m => m.parentElement.tagName") == "STRONG"
    assert marks.first.get_attribute("title") == "Not found in the library's sources"
    assert marks.first.text_content() == "41 (not in the library)"  # what a screen reader says
    assert NOTICE in answer.locator(".notes").inner_text()
    text = answer.locator(".md").evaluate("e => e.textContent")
    assert "[2]" not in text and text.startswith("Go to the car park behind the Linden bakery [1], by the green sign")
    cites = answer.locator("button.cite")
    assert cites.count() == 1 and cites.first.get_attribute("data-cite") == "1"
    assert "the Linden bakery" in answer.locator(".sources details:not(.unused) q.support").inner_text()
    assert answer.locator(".sources details.unused").count() == 1
    assert "Not in the library's sources: 41" in markdown_export(p)


ADD = "([m]) => import('./static/js/messages.js').then((M) => M.addMessage(m))"
LAST = "[...document.querySelectorAll('article.assistant')].pop()"
SNAPSHOT = f"""() => {{
  const a = {LAST}, md = a.querySelector('.md');
  return {{ marks: [...md.querySelectorAll('mark.unsupported')].map((k) => [k.parentElement.tagName, k.firstChild.data]),
    text: md.textContent.trim(), html: md.innerHTML, cites: [...md.querySelectorAll('button.cite')].map((b) => +b.dataset.cite),
    used: [...a.querySelectorAll('.sources details:not(.unused) summary')].map((s) => s.textContent),
    unused: [...a.querySelectorAll('.sources details.unused summary')].map((s) => s.textContent),
    sources: !!a.querySelector('.sources'), notes: a.querySelector('.notes').textContent,
    groups: [...a.querySelectorAll('.sources > p')].map((x) => x.textContent),
    imgs: a.querySelectorAll('img').length, pwned: window.__pwned || null }};
}}"""


def source(n: int, used: bool | None = None, support: str | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"n": n, "document": f"d{n}", "title": f"Doc {n}", "page": n, "text": f"Passage {n}."}
    return s if used is None else {**s, "used": used, "support": support}


def shown(p: Any, content: str, sources: list[dict[str, Any]], grounding: dict[str, Any] | None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content, "sources": sources}
    if grounding is not None:
        m["grounding"] = grounding
    p.evaluate(ADD, [m])
    if grounding and grounding["unsupported"]:  # js/ground.js loads with the first answer to mark
        p.wait_for_function(f"() => {LAST}.querySelector('mark.unsupported')")
    return dict(p.evaluate(SNAPSHOT))


def test_marks_dropped_citations_and_old_messages_render_from_text(live: Live, page_of: Any) -> None:
    p = opened(page_of, live)
    doubt = {"verdict": "partly", "unsupported": ["14", "Kestrel"], "dropped": [], "unmentioned": []}
    got = shown(p, "We have **14** spaces, `14` in code, [see 14](https://example.com/14), and 14 again in Kestrel; "
                   "not 140, 2014, 1,014 or 14.5.\n\n停车位共14个，Kestrel楼。", [source(1, True, "Passage 1.")], doubt)
    assert got["marks"] == [["STRONG", "14"], ["CODE", "14"], ["A", "14"], ["P", "14"], ["P", "Kestrel"],
                            ["P", "14"], ["P", "Kestrel"]], got
    assert 'href="https://example.com/14"' in got["html"] and "<strong><mark" in got["html"]
    assert "not 140, 2014, 1,014 or 14.5." in got["text"] and NOTICE in got["notes"]

    got = shown(p, "It is in the blue flowerpot [1][2], see [3] and [4].",
                [source(1, True, "The key is <b>in</b> the <img src=x onerror=window.__pwned=1> flowerpot."),
                 source(3, False), source(2, False), source(4, False)],
                {"verdict": "supported", "unsupported": [], "dropped": [2, 4], "unmentioned": []})
    assert got["text"] == "It is in the blue flowerpot [1], see [3] and." and got["cites"] == [1], got
    assert got["used"] == ["[1] The key is <b>in</b> the <img src=x onerror=window.__pwned=1> flowerpot. — Doc 1, p. 1"]
    assert got["unused"] == ["[3] Doc 3, p. 3", "[2] Doc 2, p. 2", "[4] Doc 4, p. 4"]
    assert got["imgs"] == 0 and got["pwned"] is None and got["marks"] == [] and NOTICE not in got["notes"]

    got = shown(p, "The library does not say: nothing in it is close to this question.", [],
                {"verdict": "not_in_library", "unsupported": [], "dropped": [], "unmentioned": []})
    assert not got["sources"] and got["marks"] == [] and got["notes"] == ""

    # An answer that does not stand, the server's quote after it: its source apart, with its sentence.
    got = shown(p, "The library does not say.\n\n(The closest the sources come is [2] Doc 2, page 2: “Passage 2.”)",
                [{**source(2, False, "Passage 2."), "quoted": True}, source(1, False)],  # as sourcesOf sorts them
                {"verdict": "unsupported", "unsupported": [], "dropped": [], "unmentioned": []})
    assert got["groups"] == ["The closest the sources come:", "Also given, not used:"], got
    assert got["used"] == ["[2] Passage 2. — Doc 2, p. 2"] and got["unused"] == ["[1] Doc 1, p. 1"]
    assert got["cites"] == [2] and "The closest the sources come is [2] Doc 2" in got["text"], got["html"]

    # Kept before the check (no `used`, no grounding): every [n] a source's button, all listed.
    got = shown(p, "See [1] and [2, 3].", [source(1), source(2), source(3)], None)
    assert got["cites"] == [1, 2, 3] and got["used"] == ["[1] Doc 1, p. 1", "[2] Doc 2, p. 2", "[3] Doc 3, p. 3"]
    assert got["unused"] == [] and got["text"] == "See [1] and [2][3]." and got["notes"] == ""
