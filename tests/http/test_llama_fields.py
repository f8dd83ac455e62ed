"""The llama-server request fields the OpenAI routes and POST /completion take, over the fake
model in process: logit_bias (OpenAI's object, llama-server's pairs and texts), n_probs'
completion_probabilities (whole and one token per streamed event), a raw GBNF `grammar` and a
top-level `json_schema`, and a final assistant message continued; every bad value a 400."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.fakes import FakeModel, FakeSampler
from helpers.inprocess import REPLY, USER, chat, dicts, error_of, events_of, serving

from appliance.engine.events import TokenLogprob
from appliance.http.api.llama.completion import sampled_distribution
from appliance.http.validate import MAX_GBNF_CHARS, MAX_GBNF_DEPTH, MAX_LOGIT_BIAS, gbnf_depth
from appliance.sampling import SamplingParams


@dataclass
class Recording(FakeModel):
    """The fake model, keeping each sequence's sampling parameters and the prompts it read."""

    params: list[SamplingParams] = field(default_factory=list)

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        self.params.append(params)
        return super().new_sampler(params)


def recording() -> Recording:
    return Recording(reply=REPLY)


# The routes that sample, each with the smallest body it takes.
SAMPLING_ROUTES = [
    ("/v1/chat/completions", {"messages": USER}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/completion", {"prompt": "hi"}),
]


# -- logit_bias ------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body", SAMPLING_ROUTES)
def test_logit_bias_reaches_the_sampler_in_each_spelling(path: str, body: dict[str, Any]) -> None:
    model = recording()
    with serving(lambda: model) as c:
        assert c.post(path, json={**body, "logit_bias": {"104": -100, "105": 2.5}}).status_code == 200
        assert model.params[-1].logit_bias == ((104, -100.0), (105, 2.5))
        # llama-server's pairs: an id or a text (each of its tokens biased), false bans.
        assert c.post(path, json={**body, "logit_bias": [[104, False], [" ab", -1]]}).status_code == 200
        assert model.params[-1].logit_bias == ((104, -math.inf), (32, -1.0), (97, -1.0), (98, -1.0))
        assert c.post(path, json={**body, "logit_bias": {}}).status_code == 200
        assert model.params[-1].logit_bias == ()


@pytest.mark.parametrize("bias", [
    {"104": 101}, {"104": "up"}, {"104": True}, {"104": None}, [[104]], [104, 1], "104",
    {"": 1}, {str(0x110000): 1}, {"-3": 1}, {"x" * 257: 1},
    {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)},
])
def test_a_bad_logit_bias_is_a_400_naming_it(bias: Any) -> None:
    with serving() as c:
        for r in (chat(c, logit_bias=bias), c.post("/completion", json={"prompt": "hi", "logit_bias": bias})):
            assert error_of(r, 400)["param"] == "logit_bias"


# -- n_probs ---------------------------------------------------------------------------------
def test_n_probs_gives_llama_servers_completion_probabilities() -> None:
    with serving() as c:
        body = c.post("/completion", json={"prompt": "hi", "n_predict": 4, "n_probs": 3}).json()
        probs = body["completion_probabilities"]
        assert [p["id"] for p in probs] == [ord(ch) for ch in REPLY[:4]]
        for p, ch in zip(probs, REPLY):
            assert p["token"] == ch and p["bytes"] == list(ch.encode()) and p["logprob"] == pytest.approx(math.log(0.9))
            assert [t["id"] for t in p["top_logprobs"]] == [ord(ch), ord(ch) + 1, ord(ch) + 2]
            assert all(t["token"] == chr(t["id"]) and t["logprob"] < 0 for t in p["top_logprobs"])
        assert "completion_probabilities" not in c.post("/completion", json={"prompt": "hi", "n_predict": 4}).json()


def test_n_probs_streams_one_token_per_event() -> None:
    with serving() as c:
        events = dicts(events_of(c.post("/completion", json={"prompt": "hi", "n_predict": 4, "n_probs": 2,
                                                             "stream": True})))
        running = [e for e in events if not e["stop"]]
        assert [len(e["completion_probabilities"]) for e in running] == [1] * 4
        assert "".join(e["content"] for e in running) == REPLY[:4]
        assert "completion_probabilities" not in events[-1]


def _entry(*probs: float) -> TokenLogprob:
    return TokenLogprob(b"a", math.log(probs[0]), [(chr(97 + i).encode(), math.log(p)) for i, p in enumerate(probs)],
                        1, tuple(range(1, len(probs) + 1)))


def test_the_sampled_distribution_follows_llama_cpps_chain() -> None:
    e = _entry(0.5, 0.3, 0.15, 0.05)
    base = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)

    def dist(**kw: Any) -> list[tuple[int, float]]:
        return [(tid, round(p, 3)) for tid, _, p in sampled_distribution(e, dataclasses.replace(base, **kw))]

    assert dist() == [(1, 0.5), (2, 0.3), (3, 0.15), (4, 0.05)]
    assert dist(top_k=2) == [(1, 0.625), (2, 0.375)]
    assert dist(top_p=0.7) == [(1, 0.625), (2, 0.375)]  # 0.5 + 0.3 is the smallest head with 0.7
    assert dist(min_p=0.2) == [(1, 0.526), (2, 0.316), (3, 0.158)]  # 0.05 < 0.2 x 0.5
    assert dist(top_k=2, temperature=0.5) == [(1, 0.735), (2, 0.265)]  # 0.25 : 0.09
    assert dist(temperature=0.0) == [(1, 1.0)]  # greedy: the chosen token, surely


def test_post_sampling_probs_gives_probabilities_the_sampler_drew_from() -> None:
    with serving() as c:
        for stream in (False, True):
            r = c.post("/completion", json={"prompt": "hi", "n_predict": 4, "n_probs": 2, "temperature": 1.0,
                                            "min_p": 0.0, "post_sampling_probs": True, "stream": stream})
            probs = ([p for e in dicts(events_of(r)) for p in e.get("completion_probabilities", [])] if stream
                     else r.json()["completion_probabilities"])
            assert len(probs) == 4
            for p, ch in zip(probs, REPLY):
                assert p["id"] == ord(ch) and p["token"] == ch and "logprob" not in p
                assert 0 < p["prob"] <= 1 and p["prob"] == p["top_probs"][0]["prob"]
                assert len(p["top_probs"]) == 2 and sum(t["prob"] for t in p["top_probs"]) <= 1 + 1e-9
                assert all(0 < t["prob"] <= 1 and t["bytes"] == list(t["token"].encode()) for t in p["top_probs"])


@pytest.mark.parametrize("body,param", [
    ({"n_probs": 21}, "n_probs"), ({"n_probs": -1}, "n_probs"), ({"n_probs": "3"}, "n_probs"),
])
def test_bad_n_probs_are_400s(body: dict[str, Any], param: str) -> None:
    with serving() as c:
        assert error_of(c.post("/completion", json={"prompt": "hi", **body}), 400)["param"] == param


# -- grammar and json_schema -----------------------------------------------------------------
def test_a_raw_grammar_or_a_json_schema_becomes_the_answers_grammar() -> None:
    model = recording()
    with serving(lambda: model) as c:
        assert chat(c, grammar='root ::= "a"{5,5}').status_code == 200
        assert model.params[-1].grammar == 'root ::= "a"{5,5}'
        for path, body in (("/completion", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": USER})):
            assert c.post(path, json={**body, "json_schema": {"type": "object"}}).status_code == 200
            assert model.params[-1].grammar is not None and "root" in model.params[-1].grammar
        assert c.post("/v1/completions", json={"prompt": "hi", "grammar": 'root ::= "b"'}).status_code == 200
        assert model.params[-1].grammar == 'root ::= "b"'
        assert chat(c, grammar="").status_code == 200 and model.params[-1].grammar is None


def deep(n: int) -> str:
    return "root ::= " + "(" * n + '"a"' + ")" * n


@pytest.mark.parametrize("body,param", [
    ({"grammar": 5}, "grammar"),
    ({"grammar": "root ::= " + '"a" ' * (MAX_GBNF_CHARS // 4)}, "grammar"),
    ({"grammar": deep(MAX_GBNF_DEPTH + 1)}, "grammar"),
    ({"grammar": 'root ::= "a"', "json_schema": {}}, "grammar"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
    ({"json_schema": "an object"}, "json_schema"),
])
def test_bad_grammars_are_400s_before_any_parse(body: dict[str, Any], param: str) -> None:
    with serving() as c:
        assert error_of(chat(c, **body), 400)["param"] == param


def test_a_grammar_llama_cpp_refuses_is_a_400_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers.fakes import FakeTokenizer
    monkeypatch.setattr(FakeTokenizer, "grammar_parses", lambda self, g: "(not" not in g)
    with serving() as c:
        for r in (chat(c, grammar="root ::= this is (not valid GBNF"),
                  c.post("/completion", json={"prompt": "hi", "grammar": "root ::= (not"}),
                  c.post("/v1/completions", json={"prompt": "hi", "grammar": "root ::= (not"})):
            err = error_of(r, 400)
            assert err["param"] == "grammar" and "'grammar'" in err["message"]


def test_gbnf_depth_reads_brackets_in_text_as_text() -> None:
    assert gbnf_depth('root ::= ("(" [()] x) # ((((') == 1
    assert gbnf_depth(deep(3)) == 3 and gbnf_depth('root ::= "a\\"("') == 0


# -- a final assistant message ---------------------------------------------------------------
def test_a_final_assistant_message_is_continued() -> None:
    model = recording()
    with serving(lambda: model) as c:
        r = chat(c, messages=[*USER, {"role": "assistant", "content": "Whill"}])
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == REPLY
    read = "".join(chr(t) for call in model.calls for t in call[0])  # every token decoded, in order
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nWhillhello" in read
    assert "Whill<|im_end|>" not in read


@pytest.mark.parametrize("body", [
    {"messages": [*USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
    {"messages": [*USER, {"role": "assistant", "content": "a"}], "continue_final_message": True,
     "add_generation_prompt": True},
    {"messages": USER, "continue_final_message": True},
    {"messages": [*USER, {"role": "assistant", "content": "a"}], "continue_final_message": "yes"},
])
def test_prefill_refusals(body: dict[str, Any]) -> None:
    with serving() as c:
        assert error_of(c.post("/v1/chat/completions", json=body), 400)["param"] in ("messages", "continue_final_message")


def prefilled(**fields: Any) -> str:
    """Every token a fresh server decodes for a chat ending with the assistant's "a", in order."""
    model = recording()
    with serving(lambda: model) as c:
        r = c.post("/v1/chat/completions", json={"messages": [*USER, {"role": "assistant", "content": "a"}], **fields})
        assert r.status_code == 200
    return "".join(chr(t) for call in model.calls for t in call[0])


def test_continue_final_message_is_the_same_prefill() -> None:
    continued = prefilled(continue_final_message=True, add_generation_prompt=False)
    assert continued == prefilled()  # vLLM's flag asks for what a final assistant message does anyway
    assert "<|im_start|>assistant\nahello" in continued and "a<|im_end|>" not in continued


# -- ignore_eos ------------------------------------------------------------------------------
def test_ignore_eos_bans_the_end_of_generation_tokens() -> None:
    model = recording()
    with serving(lambda: model) as c:
        body = c.post("/completion", json={"prompt": "hi", "n_predict": 2, "ignore_eos": True}).json()
        assert model.params[-1].logit_bias == ((0, -math.inf),)  # the fake's one EOG token
        assert body["generation_settings"]["logit_bias"] == [{"token": 0, "bias": None}]  # JSON has no -inf
        assert c.post("/completion", json={"prompt": "hi", "n_predict": 2}).json()["generation_settings"]["logit_bias"] == []
        for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})):
            assert c.post(path, json={**body, "ignore_eos": True, "logit_bias": {"104": 1}}).status_code == 200
            assert model.params[-1].logit_bias == ((104, 1.0), (0, -math.inf))
        assert error_of(chat(c, ignore_eos="yes"), 400)["param"] == "ignore_eos"


# -- timings ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})])
def test_llama_servers_timings_end_each_openai_answer(path: str, body: dict[str, Any]) -> None:
    with serving() as c:
        whole = c.post(path, json={**body, "max_tokens": 3}).json()
        assert whole["timings"]["predicted_n"] == 3 and whole["timings"]["prompt_n"] + whole["timings"]["cache_n"] > 0
        chunks = dicts(events_of(c.post(path, json={**body, "max_tokens": 3, "stream": True})))
        assert [("timings" in ch) for ch in chunks] == [False] * (len(chunks) - 1) + [True]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["timings"]["predicted_n"] == 3
        used = dicts(events_of(c.post(path, json={**body, "max_tokens": 3, "stream": True,
                                                  "stream_options": {"include_usage": True}})))
        assert used[-1]["choices"] == [] and used[-1]["timings"]["predicted_n"] == 3
        assert not any("timings" in ch for ch in used[:-1])


# -- llama-server's other spellings ----------------------------------------------------------
def test_a_json_object_with_a_schema_and_a_prompt_object() -> None:
    model = recording()
    with serving(lambda: model) as c:
        schema = {"type": "object", "properties": {"answer": {"const": "42"}}}
        assert chat(c, response_format={"type": "json_object", "schema": schema}).status_code == 200
        assert model.params[-1].grammar is not None and "42" in model.params[-1].grammar
        assert error_of(chat(c, response_format={"type": "json_object", "schema": 123}), 400)["param"] == \
            "response_format.schema"
        r = c.post("/completion", json={"prompt": {"prompt_string": "hi"}, "n_predict": 2})
        assert r.status_code == 200 and r.json()["prompt"] == "hi"
        for prompt, param in (({"prompt_string": "hi", "multimodal_data": ["aGk="]}, "prompt.multimodal_data"),
                              ({"text": "hi"}, "prompt")):
            assert error_of(c.post("/completion", json={"prompt": prompt}), 400)["param"] == param


def test_schema_refusals_name_the_field_they_came_in() -> None:
    with serving() as c:
        tuple_items = {"items": [{"type": "integer"}]}  # draft-04's tuple form: prefixItems is the one taken
        err = error_of(chat(c, response_format={"type": "json_object", "schema": tuple_items}), 400)
        assert err["param"] == "response_format.schema" and "#/items" in err["message"]
        assert error_of(chat(c, json_schema=tuple_items), 400)["param"] == "json_schema"


# -- the server's defaults (llama-server's --temp and --seed) --------------------------------
@pytest.mark.parametrize("path,body", SAMPLING_ROUTES)
def test_a_request_without_temperature_or_seed_takes_the_servers(path: str, body: dict[str, Any]) -> None:
    model = recording()
    with serving(lambda: model, defaults={"default_temperature": 0.25, "default_seed": 42}) as c:
        assert c.post(path, json=body).status_code == 200
        assert (model.params[-1].temperature, model.params[-1].seed) == (0.25, 42)
        assert c.post(path, json={**body, "temperature": 1.0, "seed": 7}).status_code == 200
        assert (model.params[-1].temperature, model.params[-1].seed) == (1.0, 7)
        settings = c.get("/props").json()["default_generation_settings"]["params"]
        assert (settings["temperature"], settings["seed"]) == (0.25, 42)


def test_without_a_server_seed_each_unseeded_request_samples_afresh() -> None:
    model = recording()
    with serving(lambda: model) as c:
        assert c.post("/completion", json={"prompt": "hi"}).json()["generation_settings"]["seed"] == -1
        assert model.params[-1].seed is None and model.params[-1].temperature == SamplingParams().temperature
