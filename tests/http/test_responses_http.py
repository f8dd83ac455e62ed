"""api/responses.py over the fake model, in-process: OpenAI's Responses API whole and streamed
(the SDK's event sequence), read back by the openai SDK itself, tools both ways, text.format,
previous_response_id (the caller's own only, its session continued), and the refusals."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import MODEL_ID, REPLY, error_of, serving, user

from appliance.http.api.openai.response_store import ResponseStore

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
STREAM_TEXT = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               *["response.output_text.delta"] * len(REPLY), "response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]


def events(r: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event; the name must equal the data's type."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in r.text.split("\n\n"):
        lines = [x for x in block.split("\n") if x and not x.startswith(":")]
        if not lines:
            continue
        name = next(x[len("event: "):] for x in lines if x.startswith("event: "))
        data = json.loads(next(x[len("data: "):] for x in lines if x.startswith("data: ")))
        assert data["type"] == name
        out.append((name, data))
    assert [d["sequence_number"] for _, d in out] == list(range(len(out)))
    return out


def decoded(model: FakeModel, since: int) -> str:
    """The text the fake decoded from its call `since` on (its tokens are characters)."""
    return "".join(chr(t) for call in model.calls[since:] for t in call[0] if t < 0x110000)


def text_of(body: dict[str, Any]) -> str:
    return "".join(c["text"] for item in body["output"] if item["type"] == "message" for c in item["content"])


def test_a_string_input_answers_a_response_object() -> None:
    with serving() as c:
        body = c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 20}).json()
        assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
        assert body["model"] == MODEL_ID and isinstance(body["created_at"], int)
        (item,) = body["output"]
        assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
        assert item["content"] == [{"type": "output_text", "text": REPLY, "annotations": [], "logprobs": []}]
        use = body["usage"]
        assert use["output_tokens"] == len(REPLY) and use["total_tokens"] == use["input_tokens"] + len(REPLY)
        assert set(use["input_tokens_details"]) == {"cached_tokens"} and body["max_output_tokens"] == 20


def test_the_unprefixed_path_is_the_same_route() -> None:
    with serving() as c:
        a = c.post("/v1/responses", json={"input": "hi", "temperature": 0}).json()
        b = c.post("/responses", json={"input": "hi", "temperature": 0}).json()
        assert text_of(a) == text_of(b) == REPLY and a["usage"]["input_tokens"] == b["usage"]["input_tokens"]


def test_the_stream_is_the_sdks_event_sequence() -> None:
    with serving() as c:
        ev = events(c.post("/v1/responses", json={"input": "hi", "stream": True}))
        assert [n for n, _ in ev] == STREAM_TEXT
        assert "".join(d["delta"] for n, d in ev if n == "response.output_text.delta") == REPLY
        done = ev[-1][1]["response"]
        assert done["status"] == "completed" and text_of(done) == REPLY and done["usage"]["output_tokens"] == len(REPLY)
        assert ev[0][1]["response"]["status"] == "in_progress" and ev[0][1]["response"]["id"] == done["id"]
        item_id = ev[2][1]["item"]["id"]
        assert all(d["item_id"] == item_id for n, d in ev if n.startswith("response.output_text"))


def test_the_sdk_reads_the_answer_whole_and_streamed() -> None:
    with serving() as c:
        client = openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=c)
        r = client.responses.create(model=MODEL_ID, input="hi", instructions="Be brief.")
        assert r.output_text == REPLY and r.status == "completed" and r.usage is not None
        assert r.instructions == "Be brief."
        with client.responses.stream(model=MODEL_ID, input="hi") as s:
            kinds = [e.type for e in s]
            final = s.get_final_response()
        assert kinds == STREAM_TEXT and final.output_text == REPLY


def test_message_items_and_instructions_reach_the_template() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as c:
        r = c.post("/v1/responses", json={"instructions": "SYS-X", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q1"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "A1"}]},
            {"role": "user", "content": "Q2"}]})
        assert r.status_code == 200, r.text
        prompt = decoded(model, 0)
        assert prompt.index("SYS-X") < prompt.index("Q1") < prompt.index("A1") < prompt.index("Q2")


def test_a_tool_call_is_a_function_call_item_and_its_output_goes_back() -> None:
    model = FakeModel(reply=CALL)
    with serving(lambda: model) as c:
        ask = {"input": "weather?", "tools": [WEATHER], "tool_choice": "auto", "max_output_tokens": 200}
        body = c.post("/v1/responses", json=ask).json()
        (call,) = body["output"]
        assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
        assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
        assert body["tools"] == [WEATHER]
        model.reply, since = REPLY, len(model.calls)
        follow = [{"role": "user", "content": "weather?"}, call,
                  {"type": "function_call_output", "call_id": call["call_id"], "output": "SUNNY-22"}]
        r = c.post("/v1/responses", json={"input": follow, "tools": [WEATHER]})
        assert text_of(r.json()) == REPLY
        assert "SUNNY-22" in decoded(model, since)  # the tool message went through the template


def test_a_streamed_tool_call() -> None:
    with serving(lambda: FakeModel(reply=CALL)) as c:
        ask = {"input": "weather?", "tools": [WEATHER], "stream": True, "max_output_tokens": 200}
        ev = events(c.post("/v1/responses", json=ask))
        names = [n for n, _ in ev]
        assert names == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.function_call_arguments.delta", "response.function_call_arguments.done",
                         "response.output_item.done", "response.completed"]
        assert ev[2][1]["item"]["type"] == "function_call" and ev[2][1]["item"]["arguments"] == ""
        assert json.loads(ev[4][1]["arguments"]) == {"city": "Paris"}
        assert ev[-1][1]["response"]["output"][0]["name"] == "get_weather"


def test_a_forced_function_and_a_json_schema_take_the_grammar_path() -> None:
    with serving() as c:
        forced = {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}
        assert "nope" in error_of(c.post("/v1/responses", json=forced), 400)["message"]
        ok = {**forced, "tool_choice": {"type": "function", "name": "get_weather"}}
        assert c.post("/v1/responses", json=ok).status_code == 200
        fmt = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
        assert c.post("/v1/responses", json={"input": "x", "text": fmt}).status_code == 200
        err = error_of(c.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "yaml"}}}), 400)
        assert err["param"] == "text.format" and "text.format" in err["message"]


def test_previous_response_id_continues_the_session_of_its_own_caller_only() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as c:
        first = c.post("/v1/responses", json={"input": "FIRST-Q"}, headers=user(1)).json()
        since = len(model.calls)
        r = c.post("/v1/responses", json={"input": "SECOND-Q", "previous_response_id": first["id"]}, headers=user(1))
        body = r.json()
        assert body["previous_response_id"] == first["id"]
        # The history went through the template again and found the first turn's cells.
        assert body["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"]
        assert "SECOND-Q" in decoded(model, since) and "FIRST-Q" not in decoded(model, since)  # cached, not again
        err = error_of(c.post("/v1/responses", json={"input": "x", "previous_response_id": first["id"]},
                              headers=user(2)), 404)
        assert err["param"] == "previous_response_id"
        error_of(c.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"}, headers=user(1)), 404)
        unstored = c.post("/v1/responses", json={"input": "x", "store": False}, headers=user(1)).json()
        assert unstored["store"] is False
        error_of(c.post("/v1/responses", json={"input": "x", "previous_response_id": unstored["id"]},
                        headers=user(1)), 404)


def test_input_tokens_counts_what_the_template_renders() -> None:
    with serving() as c:
        ask = {"input": "hi", "instructions": "Be brief.", "tools": [WEATHER]}
        used = c.post("/v1/responses", json=ask).json()["usage"]["input_tokens"]
        for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
            assert c.post(path, json=ask).json() == {"object": "response.input_tokens", "input_tokens": used}
        assert error_of(c.post("/v1/responses/input_tokens", json={}), 400)["param"] == "input"


def test_the_store_is_bounded_by_age_and_count() -> None:
    now = [0.0]
    store = ResponseStore(ttl_s=10, max_entries=2, clock=lambda: now[0])
    store.put("a", "r1", "s1", [])
    store.put("a", "r2", "s2", [])
    assert store.get("b", "r1") is None and store.get("a", "r1") is not None  # r1 is now the youngest
    store.put("a", "r3", "s3", [])
    assert store.get("a", "r2") is None and len(store) == 2
    now[0] = 11
    assert store.get("a", "r1") is None and len(store) == 0


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0]"),
    ({"input": "x", "instructions": 3}, "instructions"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 9}, "temperature"),
])
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with serving() as c:
        assert error_of(c.post("/v1/responses", json=body), 400)["param"] == param


def test_an_engine_failure_mid_stream_is_one_error_event() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as c:
        model.fail_on_call = len(model.calls) + 2
        ev = events(c.post("/v1/responses", json={"input": "hi", "stream": True}))
        assert ev[-1][0] == "error" and ev[-1][1]["message"]
        assert sum(n == "error" for n, _ in ev) == 1 and "response.completed" not in [n for n, _ in ev]
