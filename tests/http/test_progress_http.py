"""A long prompt's progress on the wire, in-process over the fake model: `: prompt N/M`
comments on the SSE streams that carry notes (chat, completions), increasing, ending at the
prompt's length and before the first text; nothing in Ollama's NDJSON or a whole answer;
while the prompt is read, a quiet second repeats the progress, never says `busy`."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, MODEL_ID, dicts, events_of, serving
from starlette.testclient import TestClient

from appliance.bench import sse
from appliance.http import pipeline

DOC = "x" * 300  # 300 tokens with the fake tokenizer: five of the in-process app's 64-token steps
NOTE = re.compile(r"prompt (\d+)/(\d+)")


def notes_before_text(events: list[sse.Event], text: Any) -> list[tuple[int, int]]:
    """The prompt notes, checked to come before the first event with text (text(ev) truthy)."""
    first = next(i for i, e in enumerate(events) if isinstance(e, dict) and text(e))
    got = []
    for i, e in enumerate(events):
        if isinstance(e, sse.Comment) and (m := NOTE.fullmatch(e.text)):
            assert i < first, events[:first + 1]
            got.append((int(m[1]), int(m[2])))
    return got


def rising_to(got: list[tuple[int, int]], total: int) -> None:
    assert len(got) >= 2, got
    assert all(t == total for _, t in got) and got[-1][0] == total, got
    assert all(a[0] < b[0] for a, b in zip(got, got[1:])), got


def test_chat_streams_progress_comments_before_its_first_text(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": DOC}], "stream": True,
                                "stream_options": {"include_usage": True}})
    events = events_of(r)
    usage = dicts(events)[-1]["usage"]
    got = notes_before_text(events, sse.content)
    rising_to(got, usage["prompt_tokens"])
    assert got[0][0] > usage["prompt_tokens_details"]["cached_tokens"]  # the reused prefix counts


def test_completions_stream_progress_comments_before_its_first_text(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": DOC, "stream": True, "max_tokens": 5})
    events = events_of(r)
    rising_to(notes_before_text(events, lambda e: e["choices"] and e["choices"][0]["text"]), len(DOC))


def test_a_short_prompt_hears_no_progress(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "y" * 40, "stream": True, "max_tokens": 5})
    assert not [e for e in events_of(r) if isinstance(e, sse.Comment)]


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"messages": [{"role": "user", "content": DOC}]}),
    ("/api/generate", {"prompt": DOC}),
], ids=["ollama chat", "ollama generate"])
def test_ollamas_ndjson_carries_no_progress(client: TestClient, path: str, body: dict[str, Any]) -> None:
    r = client.post(path, json={"model": MODEL_ID, **body})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    parts = [json.loads(line) for line in r.text.splitlines()]  # every line a JSON object
    assert parts[-1]["done"] is True and parts[-1]["prompt_eval_count"] > 64


@pytest.mark.parametrize("path, body", [
    (CHAT, {"messages": [{"role": "user", "content": DOC}]}),
    ("/v1/completions", {"prompt": DOC, "max_tokens": 5}),
], ids=["chat", "completions"])
def test_a_whole_answer_carries_no_progress(client: TestClient, path: str, body: dict[str, Any]) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["usage"]["prompt_tokens"] > 64 and "prompt " not in r.text


def test_a_prompt_being_read_repeats_its_progress_instead_of_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "QUEUE_NOTE_S", 0.05)
    with serving(lambda: FakeModel(reply="ok", delay=0.15)) as c:
        r = c.post("/v1/completions", json={"prompt": DOC, "stream": True, "max_tokens": 2})
    events = events_of(r)
    first_text = next(i for i, e in enumerate(events) if isinstance(e, dict) and e["choices"][0]["text"])
    comments = [e.text for e in events[:first_text] if isinstance(e, sse.Comment)]
    first = next(i for i, text in enumerate(comments) if NOTE.fullmatch(text))
    reading = comments[first:]
    assert all(NOTE.fullmatch(text) for text in reading), comments  # running, not queued
    assert len(reading) > len(set(reading)), comments  # a quiet 50 ms said the last progress again
    rising_to(sorted({(int(m[1]), int(m[2])) for text in reading if (m := NOTE.fullmatch(text))}), len(DOC))
