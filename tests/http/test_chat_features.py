"""Chat completions beyond plain text, over the in-process app and the fake model: n
choices (prompt computed once), tool calls parsed from the answer (streamed the way OpenAI
streams them), logprobs."""

from __future__ import annotations

import json
import math
from typing import Any

from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, USER, dicts, events_of, serving

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_n_choices_compute_the_prompt_once() -> None:
    with serving(lambda: FakeModel(reply="hello"), slots=4) as client:
        before = client.get("/health").json()["engine"]["prompt_tokens_computed"]
        r = client.post(CHAT, json={"messages": USER, "max_tokens": 200, "n": 3, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert all(c["message"]["content"] == "hello" and c["finish_reason"] == "stop" for c in body["choices"])
        assert body["usage"]["completion_tokens"] == 15
        prompt = body["usage"]["prompt_tokens"]
        computed = client.get("/health").json()["engine"]["prompt_tokens_computed"] - before
        assert computed < prompt + 3 * 2, (computed, prompt)  # once, plus each follower's last token


def test_n_choices_streamed() -> None:
    with serving(lambda: FakeModel(reply="hey"), slots=4) as client:
        ev = dicts(events_of(client.post(CHAT, json={"messages": USER, "max_tokens": 200, "n": 2, "stream": True,
                                                      "stream_options": {"include_usage": True}})))
        text: dict[int, str] = {0: "", 1: ""}
        finished = {}
        for e in ev:
            for c in e.get("choices", []):
                text[c["index"]] += c["delta"].get("content") or ""
                if c["finish_reason"]:
                    finished[c["index"]] = c["finish_reason"]
        assert text == {0: "hey", 1: "hey"} and finished == {0: "stop", 1: "stop"}
        assert ev[-1]["usage"]["completion_tokens"] == 6


def test_a_tool_call_becomes_tool_calls() -> None:
    with serving(lambda: FakeModel(reply="Sure. " + CALL)) as client:
        r = client.post(CHAT, json={"messages": USER, "max_tokens": 200, "tools": [WEATHER]})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        msg = choice["message"]
        assert msg["content"] == "Sure."
        (call,) = msg["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_tool_call_streams_as_delta_tool_calls() -> None:
    with serving(lambda: FakeModel(reply=CALL)) as client:
        ev = dicts(events_of(client.post(CHAT, json={"messages": USER, "max_tokens": 200, "tools": [WEATHER], "stream": True})))
        content = "".join(c["delta"].get("content") or "" for e in ev for c in e["choices"])
        calls = [tc for e in ev for c in e["choices"] for tc in c["delta"].get("tool_calls", [])]
        assert "<tool_call>" not in content and content.strip() == ""
        assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
        assert ev[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_broken_tool_call_stays_text() -> None:
    broken = "<tool_call>\n{not json}\n</tool_call>"
    with serving(lambda: FakeModel(reply=broken)) as client:
        choice = client.post(CHAT, json={"messages": USER, "max_tokens": 200, "tools": [WEATHER]}).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == broken
        ev = dicts(events_of(client.post(CHAT, json={"messages": USER, "max_tokens": 200, "tools": [WEATHER], "stream": True})))
        assert "".join(c["delta"].get("content") or "" for e in ev for c in e["choices"]) == broken


def test_tool_choice_none_is_plain_text() -> None:
    with serving(lambda: FakeModel(reply=CALL)) as client:
        body = {"messages": USER, "max_tokens": 200, "tools": [WEATHER], "tool_choice": "none"}
        choice = client.post(CHAT, json=body).json()["choices"][0]
        assert choice["message"]["content"] == CALL and choice["finish_reason"] == "stop"



def test_logprobs() -> None:
    with serving(lambda: FakeModel(reply="abc")) as client:
        body = client.post(CHAT, json={"messages": USER, "max_tokens": 200, "logprobs": True, "top_logprobs": 2}).json()
        content: list[dict[str, Any]] = body["choices"][0]["logprobs"]["content"]
        assert [e["token"] for e in content] == ["a", "b", "c"]
        for e in content:
            assert math.isclose(e["logprob"], math.log(0.9)) and e["bytes"] == list(e["token"].encode())
            assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
        ev = dicts(events_of(client.post(CHAT, json={"messages": USER, "max_tokens": 200, "logprobs": True, "stream": True})))
        streamed = [x for e in ev for c in e["choices"] if c.get("logprobs") for x in c["logprobs"]["content"]]
        assert [x["token"] for x in streamed] == ["a", "b", "c"] and all(x["top_logprobs"] == [] for x in streamed)
        plain = client.post(CHAT, json={"messages": USER}).json()
        assert plain["choices"][0]["logprobs"] is None
