"""Every streamed route ends a stream that fails after its 200 the way the engine's own
failures do: exactly one error event (SSE `data: {"error": {...}}`, Ollama's NDJSON
`{"error": "..."}` line), then the stream closes, and the engine request is cancelled so its
slot is free. Here the failure is our own code raising mid-stream (monkeypatched to fail on
its second call, in the path every chunk takes), over the fake model, in-process."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, USER, FimTokenizer, dicts, events_of, is_idle, serving, wait_health

from appliance.bench import sse
from appliance.http import choices, wire
from appliance.http.api.ollama import generate as ollama
from appliance.http.api.openai import completions

LONG = "x" * 300  # 1.5 s of answer at 5 ms a step: the failure comes long before its end
SSE_ROUTES = {
    "chat": (choices.Choice, "delta", CHAT, {"messages": USER, "max_tokens": 256}),
    "completions": (completions, "completion_chunk", "/v1/completions", {"prompt": "hi", "max_tokens": 256}),
    "infill": (wire, "sse", "/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 256}),
}
NDJSON_ROUTES = {
    "ollama chat": (ollama, "chat_part", "/api/chat", {"messages": USER}),
    "ollama generate": (ollama, "generate_part", "/api/generate", {"prompt": "hi"}),
}


def fail_second_call(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    """owner.name raises on its second call only (the first chunk has gone out by then)."""
    real: Callable[..., Any] = getattr(owner, name)
    calls = []

    def flaky(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected mid-stream failure")
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, flaky)


def freed(client: Any, model: FakeModel) -> None:
    """The request was cancelled, not run to its end: its slot is free and the answer stopped."""
    h = wait_health(client.get, is_idle)
    assert h["engine"]["finished"] == {"cancelled": 1}, h["engine"]["finished"]
    assert len(model.calls) < len(LONG) // 2


def logged(caplog: pytest.LogCaptureFixture) -> None:
    failed = [r for r in caplog.records if r.getMessage() == "a response stream failed"]
    assert len(failed) == 1 and failed[0].exc_info and "injected" in str(failed[0].exc_info[1])


@pytest.mark.parametrize("route", SSE_ROUTES.values(), ids=SSE_ROUTES.keys())
def test_a_failure_mid_sse_stream_is_one_error_event_and_frees_the_slot(
        route: tuple[Any, str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    owner, name, path, body = route
    model = FakeModel(reply=LONG, delay=0.005, tokenizer=FimTokenizer())
    with serving(lambda: model, slots=1) as client:
        fail_second_call(monkeypatch, owner, name)
        events = events_of(client.post(path, json={**body, "stream": True}))
        assert sse.DONE not in events
        *chunks, last = dicts(events)
        assert chunks and not any("error" in c for c in chunks)  # the stream had started
        assert last == {"error": {"message": "internal error; see the server log", "type": "server_error",
                                  "param": None, "code": None}}
        freed(client, model)
    logged(caplog)


@pytest.mark.parametrize("route", NDJSON_ROUTES.values(), ids=NDJSON_ROUTES.keys())
def test_a_failure_mid_ndjson_stream_is_one_error_line_and_frees_the_slot(
        route: tuple[Any, str, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    owner, name, path, body = route
    model = FakeModel(reply=LONG, delay=0.005)
    with serving(lambda: model, slots=1) as client:
        fail_second_call(monkeypatch, owner, name)
        r = client.post(path, json={"model": "m", "options": {"num_predict": 256}, **body})
        assert r.status_code == 200 and r.text.endswith("\n")
        *parts, last = [json.loads(s) for s in r.text.splitlines()]
        assert parts and not any("error" in p for p in parts) and not any(p["done"] for p in parts)
        assert last == {"error": "internal error; see the server log"}
        freed(client, model)
    logged(caplog)


def test_the_normal_path_is_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with serving(lambda: FakeModel(reply="hello")) as client:
        events = events_of(client.post(CHAT, json={"messages": USER, "stream": True}))
        assert events[-1] == sse.DONE and "".join(sse.content(e) for e in events) == "hello"
        *parts, final = [json.loads(s) for s in client.post("/api/generate", json={"model": "m", "prompt": "hi"})
                         .text.splitlines()]
        assert "".join(p["response"] for p in parts) == "hello" and final["done"] is True
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
