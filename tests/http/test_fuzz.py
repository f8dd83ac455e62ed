"""Property-based tests of the request parsers: whatever a client sends, the parser returns a
request or raises an ApplianceError (a 4xx with an OpenAI- or Ollama-style body), never
anything else (which would be a 500 and a traceback in the log)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.errors import ApplianceError
from appliance.http import messages as msgs
from appliance.http import validate as v
from appliance.http.api.llama import infill as llama
from appliance.http.api.ollama import generate as ollama
from appliance.http.api.openai import chat as chat_api
from appliance.http.api.openai import completions

# Part of the reliability suite (bad input), in-process: no server, so not integration.
pytestmark = pytest.mark.reliability

LIMITS = v.RequestBounds(default_max_tokens=256, max_tokens_limit=512, ctx_limit=2048, max_messages=64,
                          max_chars=20_000)
# derandomize: the same examples every run, so a failure in CI is one anyone can repeat.
FUZZ = settings(derandomize=True, max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Keys the parsers read, so that generated bodies reach past the first type check.
CHAT_KEYS = ["messages", "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p",
             "presence_penalty", "frequency_penalty", "repeat_penalty", "seed", "stop", "max_tokens",
             "max_completion_tokens", "n", "logprobs", "top_logprobs", "tools", "tool_choice",
             "response_format", "session_id", "user", "logit_bias", "parallel_tool_calls"]
COMPLETION_KEYS = ["prompt", "suffix", "echo", "stream", "max_tokens", "n", "best_of", "logit_bias", "logprobs",
                   "stop", "temperature", "seed", "repeat_last_n", "stream_options", "model",
                   "input_prefix", "input_suffix", "input_extra", "n_predict", "response_fields", "top_k",
                   "cache_prompt", "samplers", "id_slot"]
OLLAMA_KEYS = ["model", "messages", "prompt", "system", "suffix", "raw", "context", "stream", "format", "options",
               "tools", "images", "keep_alive", "think", "template", "logprobs", "top_logprobs"]
OPTION_KEYS = ["num_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "num_ctx",
               "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat"]
ROLES = ["system", "user", "assistant", "tool", "developer", "function", "", "USER"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),  # includes lone surrogates, as json.loads can produce from "\ud800"
    st.sampled_from(["", "text", "json_object", "json_schema", "auto", "none", "required", "function",
                     "object", "string", "array", "<|im_start|>", "\x00", "\ud800"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.sampled_from(["type", "text", "name", "content", "role",
                                                             "function", "arguments", "schema", "json_schema",
                                                             "properties", "required", "items", "parameters",
                                                             "include_usage", "enum", "$ref", "$defs"])
                                            | st.text(max_size=8), inner, max_size=5)),
    max_leaves=20,
)
content = st.one_of(json_values, st.text(max_size=60),
                    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_text"])},
                                                   optional={"text": json_values}), max_size=4))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | json_values},
    optional={"content": content, "name": json_values, "tool_calls": json_values, "tool_call_id": json_values,
              "images": json_values})
schema = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "object",
                                                     "array", "nonsense"])},
                          optional={"pattern": st.sampled_from(["^a+$", "[", "(a|b)*", "\\d{3}"]),
                                    "format": st.sampled_from(["date", "uuid", "email"]),
                                    "minLength": json_values, "maxLength": json_values,
                                    "enum": json_values, "const": json_values, "minimum": json_values}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={"properties": st.dictionaries(st.text(max_size=6), inner, max_size=3),
                  "required": json_values, "items": inner, "prefixItems": st.lists(inner, max_size=2),
                  "anyOf": st.lists(inner, max_size=2), "allOf": st.lists(inner, max_size=2),
                  "additionalProperties": st.booleans() | inner, "minItems": json_values,
                  "maxItems": json_values, "$defs": st.dictionaries(st.text(max_size=4), inner, max_size=2),
                  "$ref": st.sampled_from(["#/$defs/a", "#/x", "http://e/x", ""])}),
    max_leaves=8,
)
tool = st.fixed_dictionaries({"type": st.sampled_from(["function", "other"]) | json_values},
                             optional={"function": st.fixed_dictionaries(
                                 {"name": st.sampled_from(["get_weather", "f", "", "a b"]) | json_values},
                                 optional={"parameters": schema | json_values, "description": json_values})})
structured = {
    "messages": st.lists(message, max_size=6) | json_values,
    "tools": st.lists(tool, max_size=3) | json_values,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | json_values
    | st.fixed_dictionaries({"type": st.just("function"),
                             "function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "x"])})}),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"])},
        optional={"json_schema": st.fixed_dictionaries({}, optional={"name": json_values,
                                                                     "schema": schema | json_values})}) | json_values,
    "format": st.sampled_from(["json", ""]) | schema | json_values,
    "options": st.dictionaries(st.sampled_from(OPTION_KEYS), json_values, max_size=5) | json_values,
    "prompt": st.text(max_size=60) | st.lists(st.integers(min_value=-5, max_value=200_000), max_size=8) | json_values,
    "stop": st.text(max_size=10) | st.lists(st.text(max_size=10), max_size=6) | json_values,
    "input_extra": st.lists(st.fixed_dictionaries({}, optional={"filename": json_values, "text": json_values}),
                            max_size=3) | json_values,
}


plausible = st.one_of(st.integers(min_value=-2, max_value=600), st.floats(min_value=-1, max_value=3),
                      st.booleans(), st.text(max_size=12), json_values)
good_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]),
     "content": st.text(max_size=60) | content},
    optional={"tool_calls": st.lists(st.fixed_dictionaries(
        {"type": st.just("function"),
         "function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f"]) | json_values,
                                            "arguments": st.sampled_from(['{"a": 1}', "{", ""]) | json_values})},
        optional={"id": json_values}), max_size=2) | json_values})
# Bodies that carry what each route requires, mostly well-formed, plus a few other fields:
# these reach the parsers' later checks and their success paths.
REQUIRED: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "chat": {"messages": st.lists(good_message | message, min_size=1, max_size=5)},
    "completion": {"prompt": st.text(min_size=1, max_size=60)
                   | st.lists(st.integers(min_value=-5, max_value=200_000), min_size=1, max_size=8)},
    "infill": {"input_prefix": st.text(max_size=40), "input_suffix": st.text(max_size=40)},
    "ollama_chat": {"model": st.text(max_size=12), "messages": st.lists(good_message | message, max_size=4)},
    "ollama_generate": {"model": st.text(max_size=12), "prompt": st.text(max_size=40)},
}


def bodies(keys: list[str], required: str | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Junk (required=None): any of the keys with any JSON; else the route's required fields
    and up to four others with plausible values."""
    if required is None:
        return st.dictionaries(st.sampled_from(keys), st.deferred(lambda: json_values), max_size=8).flatmap(
            lambda d: st.fixed_dictionaries({k: structured.get(k, st.just(v)) for k, v in d.items()}))
    extra = st.lists(st.sampled_from(keys), max_size=4, unique=True).flatmap(
        lambda ks: st.fixed_dictionaries({k: structured.get(k, plausible) for k in ks}))
    return st.tuples(st.fixed_dictionaries(REQUIRED[required]), extra).map(lambda t: {**t[1], **t[0]})


TRIED: Counter[str] = Counter()  # parsed / refused, over the whole module (printed at its end)


@pytest.fixture(scope="module", autouse=True)
def _figures() -> Iterator[None]:
    yield
    print(f"\nfuzz: {sum(TRIED.values())} generated requests: {TRIED['parsed']} parsed, {TRIED['refused']} refused "
          "with a 4xx, 0 other exceptions")


def refused_or_parsed(parse: Callable[[], object]) -> None:
    try:
        parse()
    except ApplianceError as e:
        assert 400 <= e.status < 500, e
        TRIED["refused"] += 1
    else:
        TRIED["parsed"] += 1


def via_json(data: dict[str, Any]) -> dict[str, Any]:
    """As the server gets it: through json.dumps/loads (a lone surrogate survives as \\udxxx)."""
    return v.parse_json(json.dumps(data).encode())


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_raw_bodies(raw: bytes) -> None:
    def parse() -> object:
        v.precheck(raw, LIMITS.max_messages)
        return chat_api.parse_chat_request(v.parse_json(raw), LIMITS, None)
    refused_or_parsed(parse)


@FUZZ
@given(bodies(CHAT_KEYS) | bodies(CHAT_KEYS, "chat"), st.none() | st.text(max_size=40))
def test_chat_requests(data: dict[str, Any], session_header: str | None) -> None:
    refused_or_parsed(lambda: chat_api.parse_chat_request(via_json(data), LIMITS, session_header))


@FUZZ
@given(bodies(COMPLETION_KEYS) | bodies(COMPLETION_KEYS, "completion"))
def test_completion_requests(data: dict[str, Any]) -> None:
    refused_or_parsed(lambda: completions.parse_completion_request(via_json(data), LIMITS))


@FUZZ
@given(bodies(COMPLETION_KEYS) | bodies(COMPLETION_KEYS, "infill"))
def test_infill_requests(data: dict[str, Any]) -> None:
    refused_or_parsed(lambda: llama.parse_infill_request(via_json(data), LIMITS))


@FUZZ
@given(bodies(OLLAMA_KEYS) | bodies(OLLAMA_KEYS, "ollama_chat"))
def test_ollama_chat_requests(data: dict[str, Any]) -> None:
    refused_or_parsed(lambda: ollama.parse_chat(via_json(data), LIMITS))


@FUZZ
@given(bodies(OLLAMA_KEYS) | bodies(OLLAMA_KEYS, "ollama_generate"))
def test_ollama_generate_requests(data: dict[str, Any]) -> None:
    refused_or_parsed(lambda: ollama.parse_generate(via_json(data), LIMITS))


def test_valid_requests_still_parse() -> None:
    """The strategies above can reach a parsed request: the parsers are not refusing everything."""
    req = chat_api.parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "temperature": 0}, LIMITS)
    assert req.messages[0]["content"] == "hi"
    assert completions.parse_completion_request({"prompt": "x", "max_tokens": 4}, LIMITS).params.max_tokens == 4
    assert ollama.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, LIMITS)


def test_lone_surrogates_in_schemas_and_tools_are_400s() -> None:
    """Found by the tests above: a lone surrogate in a schema was a UnicodeEncodeError (500)."""
    bad_schema = {"type": "string", "description": "\ud800"}
    cases: list[Callable[[], object]] = [
        lambda: ollama.parse_format(bad_schema),
        lambda: chat_api.parse_response_format({"response_format": {"type": "json_schema",
                                                               "json_schema": {"schema": bad_schema}}}),
        lambda: msgs.parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": bad_schema}}],
                                 "tool_choice": "required"}),
        lambda: msgs.parse_tools({"tools": [{"type": "function", "function": {"name": "f", "description": "\udfff"}}]}),
        lambda: msgs.parse_messages([{"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}]}]),
    ]
    for case in cases:
        try:
            case()
        except ApplianceError as e:
            assert e.status == 400 and "surrogate" in str(e), e
        else:
            raise AssertionError("accepted a lone surrogate")
