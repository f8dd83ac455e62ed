"""The Responses API and llama-server's native routes on the real model over a real socket,
through the openai SDK unchanged: text whole and streamed, a function tool round trip, and
previous_response_id continuing a conversation from the KV cache."""

from __future__ import annotations

import json

import openai
import pytest
from helpers.live import Live, module_server

pytestmark = pytest.mark.integration
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


server = module_server("responses", slots=2, ctx_per_slot=2048, kv_tokens=8192)


@pytest.fixture(scope="module")
def client(server: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_text_response_whole_and_streamed(client: openai.OpenAI) -> None:
    r = client.responses.create(model="appliance", input="Say hello in one word.", max_output_tokens=16, temperature=0)
    assert r.status in ("completed", "incomplete") and r.output_text.strip()
    assert r.usage is not None and r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    stream = client.responses.create(model="appliance", input="Say hello in one word.", max_output_tokens=16,
                                     temperature=0, stream=True)
    kinds, deltas = [], []
    for ev in stream:
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed",
                                                                                       "response.incomplete")
    assert "".join(deltas) == r.output_text  # greedy: the same answer


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model="appliance", input=ask, tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    assert "paris" in json.loads(calls[0].arguments)["city"].lower()
    follow = [*ask, calls[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature_c": 22}'}]
    answer = client.responses.create(model="appliance", input=follow, tools=[WEATHER], temperature=0,
                                     max_output_tokens=48)
    assert answer.output_text.strip() and "22" in answer.output_text


def test_a_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="appliance", input="What is the weather in Rome?", tools=[WEATHER],
                                 tool_choice="required", temperature=0) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [o.name for o in final.output if o.type == "function_call"] == ["get_weather"]


def test_previous_response_id_continues_from_the_cache(client: openai.OpenAI) -> None:
    first = client.responses.create(model="appliance", instructions="You are terse.", temperature=0,
                                    input="My name is Ada. Remember it.", max_output_tokens=24)
    second = client.responses.create(model="appliance", instructions="You are terse.", temperature=0,
                                     input="What is my name?", previous_response_id=first.id, max_output_tokens=24)
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert "ada" in second.output_text.lower()


def test_llama_server_native_completion_and_props(server: Live) -> None:
    r = server.client.post("/completion", json={"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["content"] and body["tokens_predicted"] == 8
    assert body["timings"]["predicted_n"] == 8
    props = server.client.get("/props").json()
    assert props["total_slots"] == 2 and props["n_ctx"] == 2048 and "model_path" not in props
