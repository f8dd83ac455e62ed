"""A chat's question translated for the library by the chat model (http/translate.py), on the
fake model: a bounded greedy job in the caller's name and lane, in a session of its own; a
stopped engine or a late answer falls back to the question's own language with one log line;
and over HTTP, a Chinese question finds an English passage only through its translation."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from helpers.engines import run, started, turns_of
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, serving
from helpers.library import open_library
from helpers.polling import until, wait_until
from starlette.testclient import TestClient

from appliance.engine.turn import Lane
from appliance.http.guard import Caller
from appliance.http.translate import MAX_TOKENS, MOST_CHARS, messages, translate
from appliance.library.language import Lang
from appliance.library.library import LibraryLimits

CALLER = Caller("10.0.0.5", None)
QUESTION = "停车证在哪里办？"


def test_the_translation_is_a_short_greedy_job_in_the_callers_name_and_lane() -> None:
    async def main() -> None:
        eng = await started(FakeModel(reply="Where do I get a parking permit?\nAnd more."))
        turns = turns_of(eng)
        got = await translate(eng, CALLER, Lane.BACKGROUND, QUESTION, Lang.EN)
        assert got == "Where do I get a parking permit?"  # up to the first line's end
        await translate(eng, CALLER, Lane.PEOPLE, "停" * 5000, Lang.EN)  # a long question is cut first
        first, second = turns.values()
        assert (first.client, first.lane, second.lane) == (CALLER.client, Lane.BACKGROUND, Lane.PEOPLE)
        assert first.params.max_tokens == second.params.max_tokens == MAX_TOKENS
        assert first.params.greedy and first.params.stop == ("\n",)
        # The question's first MOST_CHARS characters only, not its 5,000.
        cut = await eng.prepare(messages("停" * MOST_CHARS, Lang.EN), MAX_TOKENS)
        assert second.prompt == cut.tokens
        # Each in a session of its own that nobody continues.
        assert first.session != second.session and not first.named and not second.named
        eng.stop()
    run(main())


def test_a_stopped_engine_or_a_late_answer_searches_the_question_alone(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        model = FakeModel(reply="Where?")
        eng = await started(model)
        model.gate = threading.Event()  # decoding waits for the test
        with caplog.at_level(logging.WARNING, "appliance.http.translate"):
            assert await translate(eng, CALLER, Lane.PEOPLE, QUESTION, Lang.EN, deadline_s=0.05) == ""
        assert len(caplog.records) == 1 and "not translated" in caplog.records[0].getMessage()
        model.gate.set()
        await until(lambda: eng.n_active == 0, what="the late job cancelled")
        eng.stop()
        caplog.clear()
        with caplog.at_level(logging.WARNING, "appliance.http.translate"):
            assert await translate(eng, CALLER, Lane.PEOPLE, QUESTION, Lang.EN) == ""
        assert len(caplog.records) == 1
    run(main())


def ask(client: TestClient) -> list[tuple[str, int]]:
    client.post("/admin/library?title=Handbook", content=b"Welcome to the office.\fParking permits are issued by reception.",
                headers={"content-type": "text/plain", "x-file-name": "handbook.txt"})
    wait_until(lambda: client.get("/admin/library").json()["data"][0]["status"] == "ready", 30, "the handbook indexed")
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": QUESTION}], "library": True})
    assert r.status_code == 200, r.text
    return [(s["title"], s["page"]) for s in r.json().get("sources", [])]


def test_a_chinese_question_finds_the_english_passage_through_its_translation(tmp_path: Path) -> None:
    # The fake model says the same to every job: its first line is the translation.
    with serving(lambda: FakeModel(reply="parking permits\nSee [1]."), library=open_library(tmp_path / "on")) as client:
        assert ask(client)[0] == ("Handbook", 2)
    with serving(lambda: FakeModel(reply="parking permits\nSee [1]."),
                 library=open_library(tmp_path / "off", LibraryLimits(translate=False))) as client:
        assert ask(client) == []  # library_translate = false: pairs of characters match no English word
