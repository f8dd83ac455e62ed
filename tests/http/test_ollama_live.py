"""Ollama's API on the real bundled model over a real socket, through the `ollama` client
from PyPI pointed at the appliance: chat streamed and not, generate, list models; NDJSON
line by line; errors in Ollama's shape."""

from __future__ import annotations

import json

import ollama
import pytest
from helpers.live import Live

pytestmark = pytest.mark.integration
HI = [{"role": "user", "content": "Say hello in one short sentence."}]
NAME = "qwen2.5-coder:0.5b"  # whatever name a tool was set up with: this server's one model
SHORT = {"temperature": 0, "num_predict": 12}


def client(server: Live) -> ollama.Client:
    return ollama.Client(host=server.url, trust_env=False)


def test_chat_not_streamed_and_streamed(server: Live) -> None:
    c = client(server)
    whole = c.chat(model=NAME, messages=HI, options=SHORT)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count is not None and 1 <= whole.eval_count <= 12
    assert whole.prompt_eval_count and whole.total_duration and whole.total_duration > 0
    parts = list(c.chat(model=NAME, messages=HI, options=SHORT, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    # Greedy: the same answer, in pieces.
    assert "".join(p.message.content or "" for p in parts) == whole.message.content


def test_generate_and_its_context(server: Live) -> None:
    c = client(server)
    first = c.generate(model=NAME, prompt="What is 2 + 2? Answer with the number only.", options=SHORT)
    assert "4" in first.response and first.context
    # The context carries the exchange: a follow-up without repeating it.
    again = c.generate(model=NAME, prompt="And 3 + 3? The number only.", context=first.context, options=SHORT)
    assert "6" in again.response
    assert again.prompt_eval_count is not None and again.prompt_eval_count > len(first.context)


def test_list_show_ps_version(server: Live) -> None:
    c = client(server)
    (model,) = c.list().models
    assert model.model and model.model.endswith(":latest") and model.details and model.details.format == "gguf"
    shown = c.show(NAME)
    assert shown.capabilities == ["completion", "tools", "insert"]  # the Coder model has FIM tokens
    assert shown.modelinfo and shown.modelinfo["general.context_length"] == 1024
    (running,) = c.ps().models
    assert running.context_length == 1024
    assert server.client.get("/api/version").json()["version"]


def test_ndjson_line_by_line(server: Live) -> None:
    body = {"model": NAME, "prompt": "Count from 1 to 5.", "options": SHORT}
    with server.client.stream("POST", "/api/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        objects = [json.loads(line) for line in r.iter_lines()]
    *parts, final = objects
    assert len(parts) >= 2 and all(p["done"] is False and "response" in p for p in parts)
    assert final["done"] is True and final["eval_count"] >= len(parts)  # a line holds one step's text


def test_errors_in_ollamas_shape(server: Live) -> None:
    c = client(server)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model=NAME, messages=HI, options={"mirostat": 2})
    assert e.value.status_code == 400 and "'options.mirostat'" in e.value.error
    r = server.client.post("/api/chat", json={"messages": HI})
    assert r.status_code == 400 and r.json() == {"error": "'model' is required"}
    r = server.client.post("/api/generate", json={"model": NAME, "prompt": "x" * 20_000, "raw": True})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "prompt tokens" in r.json()["error"]


def test_format_schema_and_a_tool_call(server: Live) -> None:
    c = client(server)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    out = c.chat(model=NAME, messages=[{"role": "user", "content": "Alice is 31. Give her name and age as JSON."}],
                 format=schema, options={"temperature": 0, "num_predict": 30})
    person = json.loads(out.message.content or "")
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]}}}
    asked = [{"role": "system", "content": "You are a helpful assistant with tools."},
             {"role": "user", "content": "What is the weather like in Paris right now?"}]
    out = c.chat(model=NAME, messages=asked, tools=[weather], options={"temperature": 0, "num_predict": 40})
    (call,) = out.message.tool_calls or []
    assert call.function.name == "get_weather" and "paris" in str(call.function.arguments.get("city", "")).lower()
    # The follow-up turn, as the client sends it: the call (arguments as an object) and its result.
    follow = c.chat(model=NAME, messages=[*asked, out.message, {"role": "tool", "content": '{"temp_c": 21, "sky": "sunny"}',
                                                                "tool_name": "get_weather"}],
                    tools=[weather], options={"temperature": 0, "num_predict": 24})
    assert follow.message.content and "21" in follow.message.content and not follow.message.tool_calls
