"""Anthropic's Messages API on the fake model: the request mapped onto the chat path, the
message object, the stream's named events in order, tool_use both ways, count_tokens, and
errors in Anthropic's shape (the route's and the front door's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import REPLY, serving

from appliance.errors import BadRequest
from appliance.http.api.anthropic.request import to_chat
from appliance.http.keys import KeyRing

URL = "/v1/messages"
HI = [{"role": "user", "content": "Say hi."}]
WEATHER = [{"name": "get_weather", "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each named SSE event; comments and blank lines skipped."""
    out, name = [], ""
    for line in body.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def anthropic_error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return dict(body["error"])


def test_a_whole_message() -> None:
    with serving() as c:
        r = c.post(URL, json={"model": "any", "max_tokens": 64, "messages": HI, "system": "Be brief.",
                              "metadata": {"user_id": "u-1"}}, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        m = r.json()
        assert m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_")
        assert m["content"] == [{"type": "text", "text": REPLY}] and m["stop_reason"] == "end_turn"
        assert m["stop_sequence"] is None and m["usage"]["output_tokens"] > 0
        assert m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"] > 0


def test_max_tokens_reached_is_max_tokens() -> None:
    with serving() as c:
        m = c.post(URL, json={"max_tokens": 2, "messages": HI}).json()
        assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 2


def test_the_stream_is_anthropics_event_sequence() -> None:
    with serving() as c:
        r = c.post(URL, json={"max_tokens": 64, "messages": HI, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        evs = events(r.text)
        names = [n for n, _ in evs]
        assert names[:3] == ["message_start", "ping", "content_block_start"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert all(n == d["type"] for n, d in evs)
        text = "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")
        assert text == REPLY
        delta = next(d for n, d in evs if n == "message_delta")
        assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0
        assert evs[0][1]["message"]["usage"]["input_tokens"] > 0


def test_tool_use_whole_and_streamed_and_the_result_goes_back() -> None:
    with serving(lambda: FakeModel(reply=CALL)) as c:
        body = {"max_tokens": 128, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": WEATHER}
        m = c.post(URL, json=body).json()
        assert m["stop_reason"] == "tool_use"
        (use,) = m["content"]
        assert use["type"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {"city": "Paris"}
        assert use["id"].startswith("toolu_")
        evs = events(c.post(URL, json={**body, "stream": True}).text)
        start = next(d for n, d in evs if n == "content_block_start")
        assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
        partial = "".join(d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta")
        assert json.loads(partial) == {"city": "Paris"}
        assert next(d for n, d in evs if n == "message_delta")["delta"]["stop_reason"] == "tool_use"
        # The round trip: the assistant's tool_use and the user's tool_result, in blocks.
        back = {**body, "messages": [*body["messages"], {"role": "assistant", "content": m["content"]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                                   "content": [{"type": "text", "text": "18 C"}]}]}]}
        assert c.post(URL, json=back).status_code == 200


def test_the_mapping_onto_a_chat_request() -> None:
    chat = to_chat({"max_tokens": 9, "system": [{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}}],
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]},
                                 {"role": "assistant", "content": [
                                     {"type": "text", "text": "Let me look."},
                                     {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                                 {"role": "user", "content": [
                                     {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain", "is_error": True},
                                     {"type": "text", "text": "And tomorrow?"}]}],
                    "tools": WEATHER, "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                    "stop_sequences": ["END"], "top_k": 5})
    assert chat["messages"][0] == {"role": "system", "content": "A"}
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: rain"}
    assert chat["messages"][4] == {"role": "user", "content": "And tomorrow?"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["top_k"] == 5 and chat["max_tokens"] == 9
    assert chat["tools"][0]["function"]["parameters"] == WEATHER[0]["input_schema"]
    assert to_chat({"messages": HI, "tool_choice": {"type": "tool", "name": "f"}, "tools": []},
                   need_max_tokens=False)["tool_choice"] == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize("body, param", [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                                   "input": {}}]}]}, "messages[0].content"),
    ({"max_tokens": 8, "messages": HI, "system": 5}, "system"),
    ({"max_tokens": 8, "messages": HI, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"max_tokens": 8, "messages": HI, "tools": WEATHER, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": HI, "metadata": "x"}, "metadata"),
])
def test_wrong_requests_are_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        to_chat(body)
    assert e.value.param == param


def test_errors_in_anthropics_shape_from_the_route_and_the_front_door(tmp_path: Path) -> None:
    with serving() as c:
        err = anthropic_error(c.post(URL, json={"messages": HI}), 400)
        assert err["type"] == "invalid_request_error" and "max_tokens" in err["message"]
        anthropic_error(c.post(URL, json={"max_tokens": "many", "messages": HI}), 400)
        anthropic_error(c.post(URL, content=b"{not json", headers={"content-type": "application/json"}), 400)
    keys = tmp_path / "keys"
    keys.write_text("anthropic-user-key-xxxxxxxx bob\n")
    with serving(keys=KeyRing(str(keys))) as c:
        err = anthropic_error(c.post(URL, json={"max_tokens": 8, "messages": HI}), 401)
        assert err["type"] == "authentication_error"
        ok = c.post(URL, json={"max_tokens": 8, "messages": HI}, headers={"x-api-key": "anthropic-user-key-xxxxxxxx"})
        assert ok.status_code == 200, ok.text


def test_count_tokens_counts_system_tools_and_messages() -> None:
    with serving() as c:
        base = c.post(URL + "/count_tokens", json={"messages": HI}).json()["input_tokens"]
        more = c.post(URL + "/count_tokens", json={"messages": HI, "system": "Be brief.", "tools": WEATHER}).json()
        assert 0 < base < more["input_tokens"]
        whole = c.post(URL, json={"max_tokens": 8, "messages": HI}).json()["usage"]
        assert whole["input_tokens"] + whole["cache_read_input_tokens"] == base
