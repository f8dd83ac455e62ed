"""api/ollama.py over the fake model, through HTTP: Ollama's shapes (NDJSON streams by default,
durations in ns, load calls, {"error": "..."}), its options mapped onto our sampling, and
the `ollama` client itself against the app on a socket."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import ollama as ollama_client
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import (
    CTX,
    MID,
    MODEL_ID,
    PRE,
    REPLY,
    SUF,
    FimTokenizer,
    Served,
    failing_after,
    is_idle,
    sent,
    serving,
    user,
    wait_health,
)
from starlette.testclient import TestClient

from appliance.errors import BadRequest
from appliance.http.api.ollama.generate import parse_common, parse_options
from appliance.http.api.ollama.wire import stamp
from appliance.http.validate import RequestBounds
from appliance.structured.grammar import JSON_OBJECT

LIMITS = RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=CTX)
HI = [{"role": "user", "content": "hi"}]
NAME = "qwen2.5-coder:0.5b"  # what an Ollama client asks for: any name is this server's model


def post(client: httpx.Client, path: str, i: int = 0, **body: Any) -> httpx.Response:
    return client.post(path, json={"model": NAME, **body}, headers=user(i))


def lines(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    assert r.text.endswith("\n")
    return [json.loads(s) for s in r.text.splitlines()]


def ollama_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    return str(body["error"])


def check_stats(body: dict[str, Any]) -> None:
    assert body["done"] is True and body["done_reason"] in ("stop", "length")
    for key in ("total_duration", "prompt_eval_duration", "eval_duration", "load_duration"):
        assert isinstance(body[key], int) and body[key] >= 0
    assert body["total_duration"] >= body["eval_duration"]
    assert isinstance(body["prompt_eval_count"], int) and isinstance(body["eval_count"], int)


# -- options ---------------------------------------------------------------------------------
def test_options_map_onto_our_sampling() -> None:
    p = parse_options({"num_predict": 10, "temperature": 0.2, "top_k": 7, "top_p": 0.9, "min_p": 0.1,
                       "repeat_penalty": 1.1, "repeat_last_n": 32, "presence_penalty": 0.5,
                       "frequency_penalty": 0.25, "seed": 42, "stop": ["\n", "User:"],
                       "num_ctx": 8192, "num_thread": 8, "num_gpu": 99, "use_mmap": True, "num_keep": 5,
                       "penalize_newline": True, "mirostat": 0, "typical_p": 1.0}, LIMITS)
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (10, 0.2, 7, 0.9, 0.1)
    assert (p.repeat_penalty, p.penalty_last_n, p.presence_penalty, p.frequency_penalty) == (1.1, 32, 0.5, 0.25)
    assert p.seed == 42 and p.stop == ("\n", "User:")
    for n in (-1, -2, 0):  # Ollama's "no limit" and "fill the context": as many as we allow
        assert parse_options({"num_predict": n}, LIMITS).max_tokens == LIMITS.max_tokens_limit
    assert parse_options(None, LIMITS).max_tokens == LIMITS.default_max_tokens
    for bad, param in (({"mirostat": 2}, "options.mirostat"), ({"typical_p": 0.5}, "options.typical_p"),
                       ({"temperature": "warm"}, "options.temperature"), ({"num_predict": -3}, "options.num_predict"),
                       ({"stop": "x" * 300}, "options.stop"),
                       # false == 0 and -1.0 == -1 in Python: they were taken as "no limit".
                       ({"num_predict": False}, "options.num_predict"), ({"num_predict": True}, "options.num_predict"),
                       ({"num_predict": -1.0}, "options.num_predict"), ({"num_predict": 0.0}, "options.num_predict"),
                       ({"num_predict": 2.5}, "options.num_predict")):
        with pytest.raises(BadRequest) as e:
            parse_options(bad, LIMITS)
        assert e.value.param == param and f"'{param}'" in e.value.message
    with pytest.raises(BadRequest, match="'options' must be an object"):
        parse_options([1], LIMITS)


def test_format_is_a_grammar_and_logprobs_are_asked_for() -> None:
    assert parse_common({"model": NAME}, LIMITS).params.grammar is None
    assert parse_common({"model": NAME, "format": "json"}, LIMITS).params.grammar == JSON_OBJECT
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    grammar = parse_common({"model": NAME, "format": schema}, LIMITS).params.grammar
    assert grammar and "age" in grammar
    assert parse_common({"model": NAME}, LIMITS).params.logprobs is None
    assert parse_common({"model": NAME, "logprobs": True, "top_logprobs": 3}, LIMITS).params.logprobs == 3


def test_created_at_is_rfc3339_utc_with_nanoseconds() -> None:
    assert stamp(1700000000.5) == "2023-11-14T22:13:20.500000000Z"


# -- /api/chat -------------------------------------------------------------------------------
def test_chat_streams_ndjson_by_default(client: TestClient) -> None:
    parts = lines(post(client, "/api/chat", messages=HI))
    *deltas, final = parts
    assert all(p["done"] is False and p["model"] == NAME and p["message"]["role"] == "assistant" for p in deltas)
    assert "".join(p["message"]["content"] for p in deltas) == REPLY
    assert final["message"] == {"role": "assistant", "content": ""}
    check_stats(final)
    assert final["eval_count"] == len(REPLY) and final["done_reason"] == "stop"


def test_chat_not_streamed(client: TestClient) -> None:
    r = post(client, "/api/chat", messages=HI, stream=False, options={"num_predict": 3}, keep_alive="10m")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["message"] == {"role": "assistant", "content": REPLY[:3]} and body["model"] == NAME
    check_stats(body)
    assert body["done_reason"] == "length" and body["eval_count"] == 3
    assert body["created_at"].endswith("Z")


def test_load_and_unload_calls_answer_at_once(client: TestClient) -> None:
    for path, body in (("/api/chat", {"messages": []}), ("/api/chat", {}), ("/api/generate", {})):
        r = post(client, path, **body)
        assert r.json()["done"] is True and r.json()["done_reason"] == "load"
        r = post(client, path, **body, keep_alive=0)
        assert r.json()["done_reason"] == "unload"
    assert post(client, "/api/chat", messages=[]).json()["message"] == {"role": "assistant", "content": ""}
    assert post(client, "/api/generate").json()["response"] == ""
    assert wait_health(client.get, is_idle)["engine"]["steps"] >= 0  # nothing was queued


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
LONG = {"num_predict": 200}  # the whole call (the fake's default answer is 32 tokens)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tool_calls_come_back_with_arguments_as_an_object() -> None:
    with serving(lambda: FakeModel(reply=CALL)) as client:
        body = post(client, "/api/chat", messages=HI, tools=[WEATHER], stream=False, options=LONG).json()
        assert body["message"] == {"role": "assistant", "content": "",
                                   "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
        *parts, final = lines(post(client, "/api/chat", 1, messages=HI, tools=[WEATHER], options=LONG))
        calls = [c for p in parts for c in p["message"].get("tool_calls", [])]
        assert calls == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
        assert "".join(p["message"]["content"] for p in parts) == "" and final["done"]
        # Without tools the same text is just text.
        assert post(client, "/api/chat", 2, messages=HI, stream=False, options=LONG).json()["message"]["content"] == CALL
        # The follow-up turn: the call (arguments as an object, as Ollama sends it) and its result.
        history = [*HI, {"role": "assistant", "content": "", "tool_calls": calls},
                   {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"}]
        assert post(client, "/api/chat", 3, messages=history, tools=[WEATHER], stream=False).status_code == 200


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("reply,content,calls", [
    (BARE, "", [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]),  # the tags left out
    ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but not a call: text
    ("It is sunny.", "It is sunny.", []),
])
def test_a_call_without_its_tags_is_still_a_call(reply: str, content: str, calls: list[Any]) -> None:
    with serving(lambda: FakeModel(reply=reply)) as client:
        body = post(client, "/api/chat", messages=HI, tools=[WEATHER], stream=False, options=LONG).json()
        assert body["message"] == {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        *parts, _ = lines(post(client, "/api/chat", 1, messages=HI, tools=[WEATHER], options=LONG))
        assert "".join(p["message"]["content"] for p in parts) == content
        assert [c for p in parts for c in p["message"].get("tool_calls", [])] == calls
        if not reply.startswith("{"):
            assert len(parts) == len(reply)  # plain text is not held back


def test_logprobs_in_ollamas_shape(client: TestClient) -> None:
    body = post(client, "/api/chat", messages=HI, stream=False, logprobs=True, top_logprobs=2).json()
    assert [e["token"] for e in body["logprobs"]] == list(REPLY)
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in body["logprobs"])
    parts = lines(post(client, "/api/generate", prompt="x", logprobs=True))
    assert [e["token"] for p in parts for e in p.get("logprobs", [])] == list(REPLY)
    assert "logprobs" not in post(client, "/api/chat", messages=HI, stream=False).json()


# -- /api/generate ---------------------------------------------------------------------------
def test_generate_templates_the_prompt_and_returns_a_context(client: TestClient) -> None:
    r = post(client, "/api/generate", prompt="hi", system="Be brief.", stream=False)
    body = r.json()
    assert body["response"] == REPLY
    check_stats(body)
    # The fake speaks ChatML, one token per character: the context is prompt + answer.
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert body["context"] == [ord(c) for c in chatml + REPLY]
    assert body["prompt_eval_count"] == len(chatml)


def test_generate_streamed_and_raw(client: TestClient) -> None:
    *parts, final = lines(post(client, "/api/generate", 1, prompt="hi"))
    assert "".join(p["response"] for p in parts) == REPLY and all(not p["done"] for p in parts)
    check_stats(final)
    assert final["response"] == "" and final["context"][-len(REPLY):] == [ord(c) for c in REPLY]
    # raw: the prompt is the whole input, and no context comes back (as Ollama).
    body = post(client, "/api/generate", 2, prompt="abc", raw=True, stream=False).json()
    assert body["prompt_eval_count"] == 3 and "context" not in body


def test_generate_puts_a_context_first() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as client:
        context = [ord(c) for c in "earlier"]
        r, prompt = sent(client, model, lambda: post(client, "/api/generate", prompt="x", raw=True,
                                                     context=context, stream=False))
        assert prompt == [*context, ord("x")]
        assert r.json()["prompt_eval_count"] == len(context) + 1


def test_generate_with_a_suffix_fills_in_the_middle() -> None:
    model = FakeModel(reply=REPLY, tokenizer=FimTokenizer())
    with serving(lambda: model) as client:
        r, prompt = sent(client, model, lambda: post(client, "/api/generate", prompt="def f(", suffix="  return 1",
                                                     options={"temperature": 0}, stream=False))
        assert prompt == [PRE, *map(ord, "def f("), SUF, *map(ord, "  return 1"), MID]
        assert r.json()["response"] == REPLY
        show = post(client, "/api/show").json()
        assert "insert" in show["capabilities"]


# -- errors in Ollama's shape ----------------------------------------------------------------
@pytest.mark.parametrize("path,body,words", [
    ("/api/chat", {"model": "", "messages": HI}, "'model' is required"),
    ("/api/generate", {"model": None, "prompt": "x"}, "'model' is required"),
    ("/api/show", {"model": ""}, "'model' is required"),
    ("/api/chat", {"messages": HI, "options": {"temperature": 9}}, "'options.temperature'"),
    ("/api/chat", {"messages": HI, "options": {"mirostat": 1}}, "'options.mirostat'"),
    ("/api/chat", {"messages": HI, "format": "xml"}, "'format'"),
    ("/api/chat", {"messages": HI, "format": {"type": "integer", "minimum": 1}}, "'minimum'"),
    ("/api/chat", {"messages": HI, "tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "'tools[0]'"),
    ("/api/chat", {"messages": HI, "think": True}, "'think'"),
    ("/api/chat", {"messages": HI, "logprobs": True, "top_logprobs": 99}, "'top_logprobs'"),
    ("/api/chat", {"messages": HI, "stream": "yes"}, "'stream'"),
    ("/api/chat", {"messages": HI, "keep_alive": [5]}, "'keep_alive'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ("/api/chat", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("/api/chat", {"messages": "hi"}, "'messages'"),
    ("/api/generate", {"prompt": "x", "images": ["aGk="]}, "'images'"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "'template'"),
    ("/api/generate", {"prompt": "x", "context": ["a"]}, "'context'"),
    ("/api/generate", {"prompt": "x", "context": [-1]}, "'context'"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "fill-in-the-middle"),
    ("/api/generate", {"prompt": "x" * CTX, "raw": True}, "prompt tokens"),
])
def test_refusals_are_ollama_errors_naming_the_field(client: TestClient, path: str, body: dict[str, Any],
                                                     words: str) -> None:
    r = client.post(path, json={"model": NAME, **body})
    assert words in ollama_error(r, 400)


def test_bad_json_and_unknown_fields(client: TestClient) -> None:
    r = client.post("/api/chat", content=b"{nope", headers={"content-type": "application/json"})
    assert "not valid JSON" in ollama_error(r, 400)
    r = post(client, "/api/chat", messages=HI, stream=False, frobnicate=1, options={"numa": True})
    assert r.status_code == 200


def test_a_failure_mid_stream_is_the_last_line_and_not_streamed_a_500() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as client:
        failing_after(1, client, model)
        *parts, last = lines(post(client, "/api/chat", messages=HI))
        assert "".join(p["message"]["content"] for p in parts) == REPLY[0]
        assert set(last) == {"error"} and "decoding failed" in last["error"]
        failing_after(0, client, model)
        assert "decoding failed" in ollama_error(post(client, "/api/generate", prompt="x", stream=False), 500)


def test_a_full_queue_is_429_with_retry_after_in_ollamas_shape() -> None:
    with serving(max_queue=0) as client:  # no queue at all: every request is beyond it
        for stream in (False, True):
            r = post(client, "/api/chat", messages=HI, stream=stream)
            assert "busy" in ollama_error(r, 429) and int(r.headers["retry-after"]) > 0


# -- the other routes ------------------------------------------------------------------------
def test_tags_ps_show_version(client: TestClient) -> None:
    (tag,) = client.get("/api/tags").json()["models"]
    assert tag["name"] == tag["model"] == f"{MODEL_ID}:latest"
    assert tag["details"]["format"] == "gguf" and len(tag["digest"]) == 64
    (running,) = client.get("/api/ps").json()["models"]
    assert running["name"] == tag["name"] and running["context_length"] == CTX and running["size_vram"] == 0
    show = post(client, "/api/show").json()
    assert show["capabilities"] == ["completion", "tools"] and show["model_info"]["general.context_length"] == CTX
    assert client.get("/api/version").json()["version"].count(".") == 2
    r = client.post("/api/tags")
    assert r.status_code == 405


def test_ps_is_empty_while_loading() -> None:
    gate = threading.Event()

    def slow() -> FakeModel:
        gate.wait(5)
        return FakeModel(reply=REPLY)

    with serving(slow, ready=False) as client:
        try:
            assert client.get("/api/ps").json() == {"models": []}
            assert "not ready" in ollama_error(post(client, "/api/chat", messages=[]), 503)
            assert "loading" in ollama_error(post(client, "/api/chat", messages=HI), 503)
        finally:
            gate.set()


# -- the ollama client -----------------------------------------------------------------------
def test_the_ollama_client_talks_to_the_app() -> None:
    with Served(lambda: FakeModel(reply=REPLY)) as srv:
        c = ollama_client.Client(host=srv.url, trust_env=False)
        assert c.chat(model=NAME, messages=HI).message.content == REPLY
        assert "".join(p.message.content or "" for p in c.chat(model=NAME, messages=HI, stream=True)) == REPLY
        assert c.generate(model=NAME, prompt="hi").response == REPLY
        assert [m.model for m in c.list().models] == [f"{MODEL_ID}:latest"]
        assert c.ps().models[0].context_length == CTX
        assert c.show(NAME).capabilities == ["completion", "tools"]
        with pytest.raises(ollama_client.ResponseError) as e:
            c.chat(model=NAME, messages=HI, options={"mirostat": 2})
        assert e.value.status_code == 400 and "'options.mirostat'" in e.value.error
