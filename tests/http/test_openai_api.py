"""Tests for the request parsers (validate.py, messages.py, api/chat.py) and the response builders."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers import shapes

from appliance.errors import BadRequest, PayloadTooLarge
from appliance.http import messages as msgs
from appliance.http import validate as v
from appliance.http import wire
from appliance.http.api.appliance import operator
from appliance.http.api.openai import chat as chat_api
from appliance.http.api.openai.chat import parse_chat_request
from appliance.http.validate import RequestBounds, parse_json
from appliance.sampling import SamplingParams

LIMITS = RequestBounds(default_max_tokens=512, max_tokens_limit=2048, ctx_limit=4096)
USER = [{"role": "user", "content": "hi"}]


def req(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, **fields}


def bad(data: Any, param: str | None, header: str | None = None) -> BadRequest:
    """parse_chat_request rejects data with a 400 in OpenAI's error shape naming param."""
    with pytest.raises(BadRequest) as e:
        parse_chat_request(data, LIMITS, header)
    check_error(e.value, param)
    return e.value


def check_error(err: BadRequest, param: str | None) -> None:
    assert err.status == 400
    body = err.body()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    assert body["error"]["code"] is None
    json.dumps(body)  # serialisable as is


# -- parse_json --------------------------------------------------------------------------
def test_parse_json_object() -> None:
    assert parse_json(b'{"a": 1, "b": "\xc3\xa9"}') == {"a": 1, "b": "é"}


@pytest.mark.parametrize("raw", [b"", b"{", b"{'a': 1}", b"not json", b'{"a": 1,}', b"\xff\xfe\x00",
                                 b'{"a": "\xff"}'])
def test_parse_json_malformed(raw: bytes) -> None:
    with pytest.raises(BadRequest) as e:
        parse_json(raw)
    check_error(e.value, None)
    assert "JSON" in e.value.message


def test_parse_json_deeply_nested_is_bad_request() -> None:
    # Unbalanced, absurdly nested input is malformed JSON too: a 400, not a RecursionError (500).
    with pytest.raises(BadRequest) as e:
        parse_json(b"[" * 100_000)
    check_error(e.value, None)


@pytest.mark.parametrize("raw", [b"[]", b"[1, 2]", b'"text"', b"1", b"null", b"true"])
def test_parse_json_non_object(raw: bytes) -> None:
    with pytest.raises(BadRequest) as e:
        parse_json(raw)
    check_error(e.value, None)
    assert "object" in e.value.message


# -- a valid request ---------------------------------------------------------------------
def test_minimal_request_defaults() -> None:
    r = parse_chat_request(req(), LIMITS)
    assert r.messages == [{"role": "user", "content": "hi"}]
    assert r.stream is False and r.include_usage is False
    assert r.model is None and r.session_id is None
    d = SamplingParams()
    assert r.params == SamplingParams(max_tokens=512, temperature=d.temperature, top_p=d.top_p,
                                      top_k=d.top_k, min_p=d.min_p, repeat_penalty=d.repeat_penalty)


def test_full_request() -> None:
    r = parse_chat_request(req(model="qwen", max_tokens=100, temperature=0, top_p=0.9, top_k=20,
                               min_p=0.1, repeat_penalty=1.1, presence_penalty=-1,
                               frequency_penalty=2,
                               seed=7, stop=["\n\n"], stream=True,
                               stream_options={"include_usage": True}), LIMITS)
    assert r.model == "qwen" and r.stream and r.include_usage
    p = r.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (100, 0.0, 0.9, 20, 0.1)
    assert (p.repeat_penalty, p.presence_penalty, p.frequency_penalty) == (1.1, -1.0, 2.0)
    assert p.seed == 7 and p.stop == ("\n\n",)
    assert p.greedy
    assert isinstance(p.temperature, float)


def test_unknown_fields_ignored() -> None:
    r = parse_chat_request(req(user="u1", metadata={"k": "v"}, parallel_tool_calls=False,
                               tools=None, response_format={"type": "text"}, foo=[1, 2]), LIMITS)
    assert r.messages == [{"role": "user", "content": "hi"}]


def test_input_not_mutated() -> None:
    data = req(messages=[{"role": "developer", "content": [{"type": "text", "text": "a"}]},
                         {"role": "user", "content": "b"}])
    before = json.dumps(data)
    parse_chat_request(data, LIMITS)
    assert json.dumps(data) == before


# -- messages ----------------------------------------------------------------------------
def test_messages_missing() -> None:
    bad({}, "messages")
    bad({"messages": None}, "messages")


@pytest.mark.parametrize("messages", [[], "hi", {"role": "user", "content": "hi"}, 3])
def test_messages_not_a_non_empty_list(messages: Any) -> None:
    bad({"messages": messages}, "messages")


@pytest.mark.parametrize("item", ["hi", None, ["user", "hi"], 1])
def test_message_not_an_object(item: Any) -> None:
    bad({"messages": [{"role": "user", "content": "a"}, item]}, "messages[1]")


@pytest.mark.parametrize("role", ["function", "User", "", None, 1, ["user"]])
def test_message_wrong_role(role: Any) -> None:
    bad({"messages": [{"role": role, "content": "hi"}]}, "messages[0].role")


def test_message_role_missing() -> None:
    bad({"messages": [{"content": "hi"}]}, "messages[0].role")


@pytest.mark.parametrize("content", [1, 1.5, True, {"text": "hi"}])
def test_content_wrong_type(content: Any) -> None:
    bad({"messages": [{"role": "user", "content": content}]}, "messages[0].content")


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_content_none_rejected_for_non_assistant(role: str) -> None:
    bad({"messages": [{"role": role, "content": None}]}, "messages[0].content")
    bad({"messages": [{"role": role}]}, "messages[0].content")


def test_content_none_ok_for_assistant() -> None:
    r = parse_chat_request({"messages": [{"role": "user", "content": "a"},
                                         {"role": "assistant", "content": None, "tool_calls": []},
                                         {"role": "user", "content": "b"}]}, LIMITS)
    assert r.messages[1] == {"role": "assistant", "content": ""}


def test_content_text_parts_joined() -> None:
    r = parse_chat_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]}]}, LIMITS)
    assert r.messages == [{"role": "user", "content": "Hello, world"}]


def test_content_empty_parts_list() -> None:
    r = parse_chat_request({"messages": [{"role": "user", "content": []}]}, LIMITS)
    assert r.messages == [{"role": "user", "content": ""}]


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    {"type": "text"},
    {"type": "text", "text": 1},
    {"text": "no type"},
    "plain string",
])
def test_content_non_text_part_rejected(part: Any) -> None:
    err = bad({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]},
              "messages[0].content")
    assert "[1]" in err.message


def test_developer_role_mapped_to_system() -> None:
    r = parse_chat_request({"messages": [{"role": "developer", "content": "be brief"},
                                         {"role": "user", "content": "hi"}]}, LIMITS)
    assert r.messages == [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "hi"}]


def test_messages_keep_only_role_and_content() -> None:
    r = parse_chat_request({"messages": [{"role": "user", "content": "hi", "name": "bob", "x": 1}]},
                           LIMITS)
    assert r.messages == [{"role": "user", "content": "hi"}]


def test_model_must_be_string() -> None:
    bad(req(model=3), "model")


# -- max_tokens ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, 10**9, 4097])
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_out_of_range(key: str, value: int) -> None:
    bad(req(**{key: value}), key)


@pytest.mark.parametrize("value", [True, False, 1.5, 100.0, "100", [100]])
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_wrong_type(key: str, value: Any) -> None:
    bad(req(**{key: value}), key)


@pytest.mark.parametrize(("value", "effective"), [(1, 1), (2048, 2048), (3000, 2048), (4096, 2048)])
def test_max_tokens_capped_to_limit(value: int, effective: int) -> None:
    assert parse_chat_request(req(max_tokens=value), LIMITS).params.max_tokens == effective


def test_max_tokens_none_uses_default() -> None:
    assert parse_chat_request(req(max_tokens=None), LIMITS).params.max_tokens == 512


def test_max_completion_tokens_preferred() -> None:
    r = parse_chat_request(req(max_completion_tokens=100, max_tokens=200), LIMITS)
    assert r.params.max_tokens == 100
    # The deprecated field is not even read when the new one is there.
    r = parse_chat_request(req(max_completion_tokens=100, max_tokens="junk"), LIMITS)
    assert r.params.max_tokens == 100
    # A null max_completion_tokens falls back to max_tokens.
    r = parse_chat_request(req(max_completion_tokens=None, max_tokens=200), LIMITS)
    assert r.params.max_tokens == 200


# -- sampling numbers ------------------------------------------------------------------------
@pytest.mark.parametrize("value",
                         [-0.1, 2.5, "hot", float("inf"), float("-inf"), float("nan"), True, [1]])
def test_temperature_rejected(value: Any) -> None:
    bad(req(temperature=value), "temperature")


@pytest.mark.parametrize("value", [0, 0.0, 1, 2, 2.0])
def test_temperature_accepted(value: float) -> None:
    assert parse_chat_request(req(temperature=value), LIMITS).params.temperature == float(value)


def test_nan_from_json_body_rejected() -> None:
    # Python's json accepts the NaN literal; it must not reach the sampler.
    data = parse_json(b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    bad(data, "temperature")


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01])
def test_top_p_rejected(value: float) -> None:
    bad(req(top_p=value), "top_p")


@pytest.mark.parametrize("value", [1, 0.01, 0.5])
def test_top_p_accepted(value: float) -> None:
    assert parse_chat_request(req(top_p=value), LIMITS).params.top_p == value


@pytest.mark.parametrize(("key", "value"), [
    ("min_p", -0.1), ("min_p", 1.5), ("repeat_penalty", 0), ("repeat_penalty", 11),
    ("presence_penalty", -2.1), ("presence_penalty", 2.1), ("frequency_penalty", 3),
    ("frequency_penalty", "x"), ("top_k", -1), ("top_k", 1.5), ("top_k", True), ("seed", "1"),
    ("seed", True), ("seed", 1.0),
])
def test_other_sampling_fields_rejected(key: str, value: Any) -> None:
    bad(req(**{key: value}), key)


def test_top_k_zero_allowed() -> None:
    assert parse_chat_request(req(top_k=0), LIMITS).params.top_k == 0


@pytest.mark.parametrize("key", ["temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                                 "frequency_penalty"])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_huge_json_integer_is_a_400_not_an_overflow(key: str, sign: int) -> None:
    data = parse_json(b'{"messages": [{"role": "user", "content": "hi"}], "%s": %s1%s}'
                      % (key.encode(), b"-" if sign < 0 else b"", b"0" * 400))
    err = bad(data, key)
    assert "more than 32 digits" in err.message and len(err.message) < 200


def test_top_k_is_bounded_by_the_c_int_llama_cpp_takes() -> None:
    assert parse_chat_request(req(top_k=v.MAX_TOP_K), LIMITS).params.top_k == 2**31 - 1
    for value in (2**31, 2**32 + 1, 10**400):  # ctypes would have wrapped 2**32 + 1 to 1 (greedy)
        bad(req(top_k=value), "top_k")


# -- stop, n, logprobs ---------------------------------------------------------------------
def test_stop_string() -> None:
    assert parse_chat_request(req(stop="END"), LIMITS).params.stop == ("END",)


def test_stop_list() -> None:
    four = ["a", "b", "c", "d"]
    assert parse_chat_request(req(stop=four), LIMITS).params.stop == tuple(four)
    assert parse_chat_request(req(stop=[]), LIMITS).params.stop == ()
    assert parse_chat_request(req(stop=None), LIMITS).params.stop == ()


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], ["a", 1], [None], 5, {"s": "x"}, True])
def test_stop_rejected(stop: Any) -> None:
    bad(req(stop=stop), "stop")


def test_n() -> None:
    assert parse_chat_request(req(n=1), LIMITS).messages == USER
    assert parse_chat_request(req(), LIMITS).n == 1
    assert parse_chat_request(req(n=3), LIMITS).n == 3
    bad(req(n=v.MAX_N + 1), "n")
    bad(req(n=0), "n")
    bad(req(n="1"), "n")


def test_logprobs() -> None:
    assert parse_chat_request(req(logprobs=True), LIMITS).params.logprobs == 0
    assert parse_chat_request(req(logprobs=True, top_logprobs=5), LIMITS).params.logprobs == 5
    assert parse_chat_request(req(logprobs=False), LIMITS).params.logprobs is None
    bad(req(logprobs="yes"), "logprobs")
    bad(req(top_logprobs=3), "top_logprobs")  # without logprobs: true
    bad(req(logprobs=True, top_logprobs=21), "top_logprobs")
    assert parse_chat_request(req(logprobs=False), LIMITS).stream is False


# -- structured output and tools --------------------------------------------------------------
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_response_format() -> None:
    assert parse_chat_request(req(response_format={"type": "text"}), LIMITS).params.grammar is None
    g = parse_chat_request(req(response_format={"type": "json_object"}), LIMITS).params.grammar
    assert g is not None and "root" in g
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "title": "Person", "additionalProperties": False}
    g = parse_chat_request(req(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}),
                           LIMITS).params.grammar
    assert g is not None and '"\\"age\\""' in g
    bad(req(response_format={"type": "xml"}), "response_format.type")
    bad(req(response_format="json"), "response_format")


@pytest.mark.parametrize("schema, named", [
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}, "multipleOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"type": "string", "format": "email"}, "email"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"minLength": 3}, "minLength"),
])
def test_unsupported_schema_features_are_400s_naming_them(schema: dict[str, Any], named: str) -> None:
    err = bad(req(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
              "response_format.json_schema.schema")
    assert named in err.message


def test_tools_and_tool_choice() -> None:
    r = parse_chat_request(req(tools=[WEATHER]), LIMITS)
    assert r.tool_names == {"get_weather"} and r.tools and r.params.grammar is None  # auto
    r = parse_chat_request(req(tools=[WEATHER], tool_choice="required"), LIMITS)
    assert r.params.grammar is not None and "<tool_call>" in r.params.grammar
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse_chat_request(req(tools=[WEATHER], tool_choice=named), LIMITS).params.grammar
    r = parse_chat_request(req(tools=[WEATHER], tool_choice="none"), LIMITS)
    assert r.tools is None and not r.tool_names
    err = bad(req(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "launch"}}), "tool_choice")
    assert "launch" in err.message and "not in 'tools'" in err.message
    bad(req(tool_choice="required"), "tool_choice")
    bad(req(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools")
    bad(req(tools=WEATHER), "tools")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "bogus"])
def test_a_forced_tool_choice_with_no_tools_is_a_400(choice: Any) -> None:
    err = bad(req(tools=[], tool_choice=choice), "tool_choice")
    assert "at least one tool" in err.message


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_no_tools_with_an_unforced_choice_is_fine(choice: Any) -> None:
    r = parse_chat_request(req(tools=[], tool_choice=choice), LIMITS)
    assert r.tools is None and r.params.grammar is None


def test_deeply_nested_call_arguments_are_a_400() -> None:
    deep = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError, not ValueError
    call = {"type": "function", "function": {"name": "f", "arguments": deep}}
    err = bad({"messages": [USER[0], {"role": "assistant", "tool_calls": [call]}]}, "messages[1].tool_calls")
    assert "nested too deeply" in err.message


def test_call_arguments_nest_far_less_than_the_recursion_limit() -> None:
    """Parsed from a shallow stack, written back by json.dumps and tojson from deeper ones."""
    def body(depth: int) -> dict[str, Any]:
        args = '{"a": ' * depth + "1" + "}" * depth
        call = {"type": "function", "function": {"name": "f", "arguments": args}}
        return {"messages": [USER[0], {"role": "assistant", "tool_calls": [call]}]}
    assert parse_chat_request(body(msgs.MAX_ARGUMENTS_DEPTH), LIMITS)
    err = bad(body(msgs.MAX_ARGUMENTS_DEPTH + 1), "messages[1].tool_calls")
    assert f"more than {msgs.MAX_ARGUMENTS_DEPTH} levels" in err.message
    bad(body(900), "messages[1].tool_calls")  # json.loads manages it; a deeper json.dumps may not


def test_tool_definitions_and_calls_count_toward_max_chars(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = v.RequestBounds(default_max_tokens=16, max_tokens_limit=64, ctx_limit=4096, max_chars=1000)
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 900}}
    assert parse_chat_request({"messages": [{"role": "user", "content": "x" * 50}], "tools": [tool]}, limits)
    monkeypatch.setattr(msgs, "tool_call_grammar", lambda *_: pytest.fail("a grammar was built first"))
    with pytest.raises(PayloadTooLarge) as e:  # 900 + 150: refused before any grammar or template
        parse_chat_request({"messages": [{"role": "user", "content": "x" * 150}], "tools": [tool],
                            "tool_choice": "required"}, limits)
    assert e.value.param == "tools" and e.value.code == "too_many_characters" and "1000" in e.value.message
    call = {"type": "function", "function": {"name": "f", "arguments": json.dumps({"a": "y" * 990})}}
    with pytest.raises(PayloadTooLarge) as e:
        parse_chat_request({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]},
                                         {"role": "user", "content": "hi"}]}, limits)
    assert e.value.param == "messages" and e.value.code == "too_many_characters"


def test_a_huge_tools_list_is_refused_by_its_size() -> None:
    desc = "Returns the weather for a city, in a short sentence. " * 570  # ~30 KB per tool, 3.7 MiB in all
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": desc}} for i in range(128)]
    limits = v.RequestBounds(default_max_tokens=16, max_tokens_limit=64, ctx_limit=4096)  # 1,000,000 chars
    with pytest.raises(PayloadTooLarge) as e:
        parse_chat_request(req(tools=tools), limits)
    assert e.value.param == "tools"


def test_tool_messages_and_assistant_tool_calls() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    r = parse_chat_request({"messages": msgs, "tools": [WEATHER]}, LIMITS)
    assert r.messages[1] == {"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                              "arguments": {"city": "Paris"}}}]}
    assert r.messages[2] == {"role": "tool", "content": '{"temp": 21}'}
    broken = {**call, "function": {"name": "get_weather", "arguments": "{not json"}}
    bad({"messages": [msgs[0], {"role": "assistant", "tool_calls": [broken]}]}, "messages[1].tool_calls")


# -- stream --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["true", 1, 0, [], {}])
def test_stream_must_be_bool(value: Any) -> None:
    bad(req(stream=value), "stream")


def test_stream_true() -> None:
    r = parse_chat_request(req(stream=True), LIMITS)
    assert r.stream is True and r.include_usage is False


@pytest.mark.parametrize("value", [True, "yes", [], 1])
def test_stream_options_not_object(value: Any) -> None:
    bad(req(stream=True, stream_options=value), "stream_options")


def test_include_usage() -> None:
    def include_usage(opts: dict[str, Any]) -> bool:
        return parse_chat_request(req(stream=True, stream_options=opts), LIMITS).include_usage

    assert include_usage({"include_usage": True}) is True
    assert include_usage({}) is False
    assert include_usage({"include_usage": False}) is False
    with pytest.raises(BadRequest):
        include_usage({"include_usage": "yes"})


# -- session id ------------------------------------------------------------------------------
def test_session_from_body() -> None:
    assert parse_chat_request(req(session_id="abc_DEF-0123456789"), LIMITS).session_id == "abc_DEF-0123456789"


BODY, HEADER = "body-session-00001", "header-session-001"


def test_session_header_wins_over_body() -> None:
    assert parse_chat_request(req(session_id=BODY), LIMITS, HEADER).session_id == HEADER
    assert parse_chat_request(req(), LIMITS, HEADER).session_id == HEADER


def test_empty_header_falls_back_to_body() -> None:
    assert parse_chat_request(req(session_id=BODY), LIMITS, "").session_id == BODY


@pytest.mark.parametrize("value", [123, True, ["a"], {"id": "a"}, "", "x" * 129, "x" * 15, "short"])
def test_bad_session_id_in_body(value: Any) -> None:
    bad(req(session_id=value), "session_id")


def test_session_id_length_bounds() -> None:
    assert parse_chat_request(req(session_id="x" * 128), LIMITS).session_id == "x" * 128
    bad(req(), "session_id", header="x" * 129)
    # An over-long header is rejected even when the body's id would be fine.
    bad(req(session_id="ok" * 8), "session_id", header="y" * 200)
    assert parse_chat_request(req(session_id="x" * 16), LIMITS).session_id == "x" * 16
    err = bad(req(session_id="x" * 15), "session_id")
    assert "16-128" in err.message


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1" * 2, "会话会话会话会话会话会话会话会话", "nul\x00" * 4,
                                   "line\u2028sep" * 2, "with space in it!", "dots.are.not.allowed.here"])
def test_session_id_must_be_header_safe(value: str) -> None:
    # The server echoes the id back in the X-Session-Id response header, so an id from the
    # body must be printable ASCII: anything else is a 400 here, not a 500 (or a forged
    # header) when the response is built.
    bad(req(session_id=value), "session_id")


# -- response builders -----------------------------------------------------------------------
def test_usage() -> None:
    assert wire.usage(10, 5) == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                                "prompt_tokens_details": {"cached_tokens": 0}}
    assert wire.usage(10, 5, cached_tokens=8)["prompt_tokens_details"] == {"cached_tokens": 8}


def test_chunk() -> None:
    c = shapes.chunk("chatcmpl-1", 1700000000, "m", {"content": "hi"})
    assert c == {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": None,
                     "finish_reason": None}],
    }


def test_chunk_finish_and_extra() -> None:
    c = shapes.chunk("id", 1, "m", {}, "stop", dropped_messages=2)
    assert c["choices"][0]["finish_reason"] == "stop"
    assert c["choices"][0]["delta"] == {}
    assert c["dropped_messages"] == 2


def test_usage_chunk() -> None:
    use = wire.usage(3, 4)
    assert chat_api.usage_chunk("id", 1, "m", use) == {
        "id": "id", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [], "usage": use}


def test_completion() -> None:
    use = wire.usage(3, 4)
    c = shapes.completion("id", 1, "m", "Hello", "length", use, dropped_messages=1)
    assert c == {
        "id": "id", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                     "logprobs": None, "finish_reason": "length"}],
        "usage": use, "dropped_messages": 1,
    }


def test_models_list() -> None:
    assert operator.models_list("qwen", 123) == {"object": "list", "data": [
        {"id": "qwen", "object": "model", "created": 123, "owned_by": "appliance"}]}


def test_models_list_default_created_is_now() -> None:
    import time

    before = int(time.time())
    created = operator.models_list("qwen")["data"][0]["created"]
    assert before <= created <= int(time.time())


def test_sse_json() -> None:
    out = wire.sse({"a": 1, "b": [1, 2]})
    assert out == b'data: {"a":1,"b":[1,2]}\n\n'
    assert isinstance(out, bytes)


def test_sse_keeps_non_ascii() -> None:
    out = wire.sse({"content": "你好 😀 é"})
    assert out == 'data: {"content":"你好 😀 é"}\n\n'.encode()
    assert b"\\u" not in out


def test_sse_escapes_newlines_in_json() -> None:
    # A newline inside the JSON would end the SSE event early.
    out = wire.sse({"content": "a\n\nb"})
    assert out.count(b"\n") == 2 and out.endswith(b"\n\n")
    assert json.loads(out[len(b"data: "):]) == {"content": "a\n\nb"}


def test_sse_done() -> None:
    assert wire.sse("[DONE]") == b"data: [DONE]\n\n"


def test_new_session_id() -> None:
    ids = {v.new_session_id() for _ in range(100)}
    assert len(ids) == 100
    for sid in ids:
        assert re.fullmatch(r"[0-9a-f]{32}", sid)
        assert int(sid, 16).bit_length() <= 128
    # The id is accepted back as a session id.
    sid = ids.pop()
    assert parse_chat_request(req(), LIMITS, sid).session_id == sid


def test_new_id() -> None:
    a, b = chat_api.new_id(), chat_api.new_id()
    assert a != b
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", a)


# -- bounded input -----------------------------------------------------------------------------
def test_lone_surrogate_is_a_400_not_a_500() -> None:
    data = v.parse_json(b'{"messages":[{"role":"user","content":"\\ud800"}]}')
    err = bad(data, "messages[0].content")
    assert "surrogate" in err.message
    err = bad(v.parse_json(b'{"messages":[{"role":"user","content":"hi"}],"stop":"\\udfff"}'), "stop")


def test_lone_surrogate_in_content_parts() -> None:
    data = v.parse_json(b'{"messages":[{"role":"user","content":[{"type":"text","text":"a\\ud83d"}]}]}')
    bad(data, "messages[0].content")


def test_message_count_is_capped() -> None:
    limits = v.RequestBounds(default_max_tokens=16, max_tokens_limit=64, ctx_limit=4096, max_messages=10)
    ok = {"messages": [{"role": "user", "content": ""}] * 10}
    assert len(parse_chat_request(ok, limits).messages) == 10
    with pytest.raises(BadRequest) as e:
        parse_chat_request({"messages": [{"role": "user", "content": ""}] * 11}, limits)
    assert e.value.code == "too_many_messages" and "at most 10" in e.value.message


def test_characters_are_capped() -> None:
    limits = v.RequestBounds(default_max_tokens=16, max_tokens_limit=64, ctx_limit=4096, max_chars=100)
    assert parse_chat_request({"messages": [{"role": "user", "content": "x" * 100}]}, limits)
    with pytest.raises(PayloadTooLarge) as e:
        parse_chat_request({"messages": [{"role": "user", "content": "x" * 60}] * 2}, limits)
    assert e.value.status == 413 and e.value.code == "too_many_characters"


def test_content_parts_are_capped() -> None:
    parts = [{"type": "text", "text": "a"}] * (msgs.MAX_PARTS + 1)
    bad({"messages": [{"role": "user", "content": parts}]}, "messages[0].content")


def test_errors_do_not_echo_message_text() -> None:
    secret = "my password is hunter2 " * 3
    err = bad({"messages": [{"role": secret, "content": "x"}]}, "messages[0].role")
    assert "hunter2" not in err.message


def test_precheck_refuses_a_body_of_countless_messages_without_parsing() -> None:
    tiny = b'{"role":"user","content":""}'
    v.precheck(b'{"messages":[' + b",".join([tiny] * 100) + b"]}", 50)  # up to twice the cap: parse decides
    with pytest.raises(BadRequest) as e:
        v.precheck(b'{"messages":[' + b",".join([tiny] * 101) + b"]}", 50)
    assert e.value.code == "too_many_messages"
    # "role" inside a string is escaped, so message text cannot trip it.
    v.precheck(b'{"messages":[{"role":"user","content":"' + b'\\"role\\" ' * 1000 + b'"}]}', 50)


def test_a_lone_surrogate_in_a_schema_or_tool_is_a_400() -> None:
    schema = {"type": "object", "properties": {"\ud800": {"type": "string"}}}
    bad(req(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
        "response_format.json_schema.schema")
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    bad(req(tools=[tool], tool_choice="required"), "tools[0]")
