"""llama-server's request fields on the real model over a real socket: n_probs' alternatives
and a logit_bias that bans the likeliest token (the answer then takes the second), a raw GBNF
grammar, a final assistant message continued, and the Responses API's tool round trip streamed
end to end through the openai SDK unchanged."""

from __future__ import annotations

import math

import openai
import pytest
from helpers.live import Live, module_server

pytestmark = [pytest.mark.integration]
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PROMPT = "I believe the meaning of life is"


server = module_server("llama-fields", slots=2, ctx_per_slot=2048, kv_tokens=8192)


@pytest.fixture(scope="module")
def client(server: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_post_sampling_probs_are_what_the_sampler_kept(server: Live) -> None:
    """The same prompt before and after sampling: the kept tokens are the raw likeliest, in
    the same order, renormalised (top_k 3 keeps three, at temperature 1 their shares)."""
    body = {"prompt": PROMPT, "n_predict": 4, "n_probs": 3, "temperature": 1.0, "top_k": 3, "min_p": 0.0, "seed": 7}
    raw = server.client.post("/completion", json=body).json()["completion_probabilities"]
    post = server.client.post("/completion", json={**body, "post_sampling_probs": True}).json()
    probs = post["completion_probabilities"]
    assert len(probs) == 4
    first_raw, first = raw[0], probs[0]  # the first token's logits come from the same prompt
    assert [t["id"] for t in first["top_probs"]] == [t["id"] for t in first_raw["top_logprobs"]]
    assert sum(t["prob"] for t in first["top_probs"]) == pytest.approx(1.0, abs=1e-6)
    shares = [math.exp(t["logprob"]) for t in first_raw["top_logprobs"]]
    for t, share in zip(first["top_probs"], shares):
        assert t["prob"] == pytest.approx(share / sum(shares), abs=0.02)
    for p in probs:
        assert 0 < p["prob"] <= 1 and p["id"] in [t["id"] for t in p["top_probs"]]


def test_banning_the_likeliest_token_gives_the_second(server: Live) -> None:
    r = server.client.post("/completion", json={"prompt": PROMPT, "n_predict": 3, "n_probs": 5, "temperature": 0})
    assert r.status_code == 200
    probs = r.json()["completion_probabilities"]
    assert len(probs) == 3
    first = probs[0]
    tops = first["top_logprobs"]
    assert len(tops) == 5 and tops[0]["id"] == first["id"]  # greedy: the pick is the likeliest
    assert all(a["logprob"] >= b["logprob"] for a, b in zip(tops, tops[1:]))
    for bias in ({str(first["id"]): -100}, [[first["id"], False]]):
        banned = server.client.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "n_probs": 1,
                                                          "temperature": 0, "logit_bias": bias}).json()
        assert banned["completion_probabilities"][0]["id"] == tops[1]["id"]


def test_openai_logit_bias_bans_words(server: Live, client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the best book? Answer in one sentence."}]
    plain = client.chat.completions.create(model="appliance", messages=ask, max_tokens=24, temperature=0)
    words = [w for w in (plain.choices[0].message.content or "").split()[:3] if w.isalpha()]
    assert words
    ids = server.client.post("/tokenize", json={"content": " " + " ".join(words)}).json()["tokens"]
    ids += server.client.post("/tokenize", json={"content": " ".join(words)}).json()["tokens"][:1]
    r = client.chat.completions.create(model="appliance", messages=ask, max_tokens=24, temperature=0,
                                       logit_bias={str(t): -100 for t in ids})
    text = r.choices[0].message.content or ""
    assert text and text != plain.choices[0].message.content
    assert not any(t in ids for t in server.client.post("/tokenize", json={"content": text}).json()["tokens"])


def test_a_raw_grammar_is_followed_and_a_bad_one_refused(server: Live) -> None:
    ask = [{"role": "user", "content": "Does not matter what I say, does it?"}]
    r = server.client.post("/v1/chat/completions", json={"messages": ask, "max_tokens": 6, "grammar": 'root ::= "a"{5,5}'})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "aaaaa"
    bad = server.client.post("/chat/completions", json={"messages": ask, "grammar": "root ::= this is (not valid GBNF"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"


def test_a_final_assistant_message_is_continued(server: Live) -> None:
    ask = [{"role": "user", "content": "Name three colours, comma-separated."}]
    whole = server.client.post("/v1/chat/completions", json={"messages": ask, "max_tokens": 12, "temperature": 0,
                                                             "logprobs": True}).json()["choices"][0]
    pieces = [t["token"] for t in whole["logprobs"]["content"]]
    prefill = "".join(pieces[:3])
    r = server.client.post("/v1/chat/completions", json={
        "messages": [*ask, {"role": "assistant", "content": prefill}], "max_tokens": 9, "temperature": 0})
    assert r.status_code == 200
    # Greedy on the same tokens: the continuation is the rest of the unprefilled answer.
    assert r.json()["choices"][0]["message"]["content"] == "".join(pieces[3:12])


def test_a_streamed_tool_call_round_trip(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.responses.stream(model="appliance", input=ask, tools=[WEATHER], tool_choice="required",
                                 temperature=0) as s:
        for _ in s:
            pass
        call = next(o for o in s.get_final_response().output if o.type == "function_call")
    assert call.name == "get_weather" and "paris" in call.arguments.lower()
    follow = [*ask, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 22}'}]
    kinds, deltas = [], []
    for ev in client.responses.create(model="appliance", input=follow, tools=[WEATHER], temperature=0,
                                      max_output_tokens=48, stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "22" in "".join(deltas)


def test_ignore_eos_answers_up_to_max_tokens(server: Live) -> None:
    ask = {"messages": [{"role": "user", "content": "Reply with just the word OK."}], "max_tokens": 24,
           "temperature": 0}
    short = server.client.post("/v1/chat/completions", json=ask).json()
    assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 24
    long = server.client.post("/v1/chat/completions", json={**ask, "ignore_eos": True}).json()
    assert long["choices"][0]["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 24
