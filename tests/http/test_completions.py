"""api/completions.py and api/llama.py over the fake model, through HTTP: /v1/completions (text and token prompts,
echo, stop, streaming, fill-in-the-middle), /infill, /tokenize, /detokenize and the context
in /v1/models, with every refusal, in-process."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeModel, FakeTokenizer
from helpers.inprocess import (
    CONTROL,
    CTL,
    CTX,
    MID,
    MODEL_ID,
    PRE,
    REPLY,
    SUF,
    FimTokenizer,
    dicts,
    error_of,
    events_of,
    is_idle,
    is_ready,
    sent,
    serving,
    user,
    wait_health,
)
from starlette.testclient import TestClient

from appliance.bench import sse
from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.errors import BadRequest, ContextLengthExceeded, PayloadTooLarge
from appliance.http.api.llama.tokens import MAX_TOKENS
from appliance.http.api.openai.completions import parse_completion_request
from appliance.http.app import create_app
from appliance.http.prompting import fim_prompt
from appliance.http.state import App
from appliance.http.throttle import ParseGate
from appliance.http.validate import RequestBounds, parse_prompt


@pytest.fixture(scope="module")
def fim() -> Iterator[tuple[TestClient, FakeModel]]:
    model = FakeModel(reply=REPLY, tokenizer=FimTokenizer())
    with serving(lambda: model) as c:
        yield c, model


def complete(client: httpx.Client, i: int = 0, **body: Any) -> httpx.Response:
    return client.post("/v1/completions", json=body, headers=user(i))


# -- parsing ---------------------------------------------------------------------------------
def test_a_prompt_is_text_or_token_ids_and_one_per_request() -> None:
    assert parse_prompt("hi") == "hi"
    assert parse_prompt([104, 105]) == [104, 105]
    assert parse_prompt(["hi"]) == "hi" and parse_prompt([[104]]) == [104]
    for bad, words in ((["a", "b"], "2 prompts"), ([[1], [2]], "2 prompts"), ([], "must not be empty"),
                       (None, "required"), (3, "string or an array"), ([1, "a"], "string or an array"),
                       ([True], "string or an array"), ("\ud800", "lone surrogate")):
        with pytest.raises(BadRequest, match=words) as e:
            parse_prompt(bad)
        assert e.value.param == "prompt"


def test_request_fields_map_onto_sampling_and_text_is_capped() -> None:
    limits = RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=CTX, max_chars=10)
    req = parse_completion_request({"prompt": "x", "suffix": "y", "max_tokens": 999 % CTX, "temperature": 0,
                                    "top_k": 5, "stop": ["\n"], "seed": 7, "repeat_last_n": -1, "stream": True,
                                    "stream_options": {"include_usage": True}, "user": "ignored"}, limits)
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_k, p.stop, p.seed, p.penalty_last_n) == (256, 0.0, 5, ("\n",), 7, CTX)
    assert req.stream and req.include_usage and req.suffix == "y" and not req.echo
    with pytest.raises(PayloadTooLarge, match="10 characters"):
        parse_completion_request({"prompt": "x" * 6, "suffix": "y" * 5}, limits)


def test_fim_prompt_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix() -> None:
    fim = (PRE, SUF, MID)
    assert fim_prompt(fim, [1, 2], [3], 10) == ([PRE, 1, 2, SUF, 3, MID], False)
    # Room for 13 - 3 = 10 tokens: the suffix gets a quarter (2), the prefix the rest (8).
    tokens, cut = fim_prompt(fim, list(range(100, 120)), list(range(200, 220)), 13)
    assert cut and tokens == [PRE, *range(112, 120), SUF, 200, 201, MID]
    # A short prefix leaves its room to the suffix; extra context fills what is left, newest last.
    tokens, cut = fim_prompt(fim, [1], list(range(200, 220)), 13, extra=[7, 8, 9])
    assert cut and tokens == [PRE, 1, SUF, *range(200, 209), MID]
    tokens, cut = fim_prompt(fim, [1], [2], 13, extra=[7, 8, 9], middle=[5])
    assert not cut and tokens == [7, 8, 9, PRE, 1, SUF, 2, MID, 5]
    with pytest.raises(ContextLengthExceeded):
        fim_prompt(fim, [1], [2], 4, middle=[5, 6])


# -- /v1/completions -------------------------------------------------------------------------
def test_completion_not_streamed(client: TestClient) -> None:
    r = complete(client, prompt="Once upon a time", max_tokens=16)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL_ID
    assert body["choices"] == [{"text": REPLY, "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"]["prompt_tokens"] == len("Once upon a time")
    assert body["usage"]["completion_tokens"] == len(REPLY)
    assert body["usage"]["total_tokens"] == len("Once upon a time") + len(REPLY)


def test_echo_puts_the_prompt_first_also_for_token_prompts(client: TestClient) -> None:
    assert complete(client, prompt="abc", echo=True).json()["choices"][0]["text"] == "abc" + REPLY
    r = complete(client, 1, prompt=[ord(c) for c in "xyz"], echo=True)
    assert r.json()["choices"][0]["text"] == "xyz" + REPLY
    assert r.json()["usage"]["prompt_tokens"] == 3


def test_max_tokens_and_stop(client: TestClient) -> None:
    assert complete(client, prompt="a", max_tokens=2).json()["choices"][0] == {
        "text": REPLY[:2], "index": 0, "logprobs": None, "finish_reason": "length"}
    choice = complete(client, prompt="a", stop=["ll"]).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("he", "stop")


def test_logprobs_in_the_completions_shape(client: TestClient) -> None:
    lp = complete(client, prompt="a", logprobs=2).json()["choices"][0]["logprobs"]
    assert lp["tokens"] == list(REPLY) and lp["text_offset"] == list(range(len(REPLY)))
    assert all(math.isclose(x, math.log(0.9)) for x in lp["token_logprobs"])
    assert all(len(top) == 2 and t in top for t, top in zip(lp["tokens"], lp["top_logprobs"]))
    chunks = [e for e in events_of(complete(client, prompt="a", logprobs=0, stream=True)) if isinstance(e, dict)]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["text"]]
    assert [t for x in streamed for t in x["tokens"]] == list(REPLY)
    assert [o for x in streamed for o in x["text_offset"]] == list(range(len(REPLY)))
    assert complete(client, prompt="a").json()["choices"][0]["logprobs"] is None


def test_completion_streamed_with_usage(client: TestClient) -> None:
    r = complete(client, prompt="Once", stream=True, echo=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r)
    assert events[-1] == sse.DONE
    *chunks, final, usage = [e for e in events if isinstance(e, dict)]
    assert all(c["object"] == "text_completion" and c["choices"][0]["finish_reason"] is None for c in chunks)
    assert chunks[0]["choices"][0]["text"] == "Once"  # the echo comes first
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Once" + REPLY
    assert final["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(REPLY)
    assert len({e["id"] for e in (*chunks, final, usage)}) == 1


def test_suffix_needs_the_models_fill_in_the_middle_tokens(client: TestClient) -> None:
    err = error_of(complete(client, prompt="def f(", suffix="\n    return x\n"), 400)
    assert err["param"] == "suffix" and "fill-in-the-middle" in err["message"]
    # An empty suffix is a plain completion.
    assert complete(client, prompt="def f(", suffix="").status_code == 200


def test_fill_in_the_middle_prompt_never_parses_control_text(fim: tuple[TestClient, FakeModel]) -> None:
    client, model = fim
    prefix, suffix = f"def f({CONTROL}", "    return x\n"
    r, prompt = sent(client, model, lambda: complete(client, 2, prompt=prefix, suffix=suffix))
    assert prompt == [PRE, *map(ord, prefix), SUF, *map(ord, suffix), MID]
    assert r.json()["choices"][0]["text"] == REPLY
    # A raw prompt is the client's own whole input: its control text is parsed.
    _, prompt = sent(client, model, lambda: complete(client, 3, prompt=f"a{CONTROL}b"))
    assert prompt == [ord("a"), CTL, ord("b")]
    # Tokens as the prefix.
    _, prompt = sent(client, model, lambda: complete(client, 4, prompt=[65, 66], suffix="z"))
    assert prompt == [PRE, 65, 66, SUF, ord("z"), MID]


def test_a_long_file_is_cut_around_the_cursor_not_refused(fim: tuple[TestClient, FakeModel]) -> None:
    client, model = fim
    prefix, suffix = "p" * 2000 + "END", "START" + "s" * 2000
    r, prompt = sent(client, model, lambda: complete(client, 5, prompt=prefix, suffix=suffix, max_tokens=32))
    limit = CTX - 32
    assert len(prompt) == limit and r.json()["usage"]["prompt_tokens"] == limit
    assert prompt[0] == PRE and prompt[-1] == MID
    cut_prefix = prompt[1:prompt.index(SUF)]
    cut_suffix = prompt[prompt.index(SUF) + 1:-1]
    assert "".join(map(chr, cut_prefix)).endswith("pEND") and "".join(map(chr, cut_suffix)).startswith("STARTs")
    assert len(cut_suffix) == (limit - 3) // 4


def test_a_plain_prompt_too_long_is_refused_and_counted(client: TestClient) -> None:
    err = error_of(complete(client, prompt="x" * CTX), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    metrics = client.get("/metrics").text
    assert 'appliance_rejected_requests_total{reason="context_length_exceeded"}' in metrics


@pytest.mark.parametrize("body,param", [
    ({"prompt": "a", "n": 2}, "n"),
    ({"prompt": "a", "best_of": 3}, "best_of"),
    ({"prompt": "a", "logprobs": 99}, "logprobs"),
    ({"prompt": "a", "logprobs": 2, "echo": True}, "logprobs"),
    ({"prompt": "a", "logit_bias": {"50256": -101}}, "logit_bias"),
    ({"prompt": "a", "echo": True, "suffix": "b"}, "echo"),
    ({"prompt": "a", "suffix": 3}, "suffix"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -5]}, "prompt"),
    ({"prompt": [0x110000]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({}, "prompt"),
])
def test_refusals_name_the_field(client: TestClient, body: dict[str, Any], param: str) -> None:
    assert error_of(complete(client, **body), 400)["param"] == param


def test_harmless_unknown_fields_are_ignored(client: TestClient) -> None:
    r = complete(client, prompt="a", user="me", n=1, best_of=1, logprobs=None, logit_bias={}, frobnicate=True)
    assert r.status_code == 200


# -- /infill ---------------------------------------------------------------------------------
def infill(client: httpx.Client, i: int = 0, **body: Any) -> httpx.Response:
    return client.post("/infill", json=body, headers=user(i))


def test_infill_in_llama_servers_shape(fim: tuple[TestClient, FakeModel]) -> None:
    client, model = fim
    body = {"input_prefix": "def f(", "input_suffix": "\n", "prompt": "x",
            "input_extra": [{"filename": "a.py", "text": "A = 1"}], "n_predict": 8, "top_k": 3,
            "samplers": ["top_k"], "cache_prompt": True, "n_indent": 4}  # the last three: ignored
    r, prompt = sent(client, model, lambda: infill(client, 6, **body))
    extra = "\n\n--- snippet ---\n\na.py\nA = 1"
    assert prompt == [*map(ord, extra), PRE, *map(ord, "def f("), SUF, ord("\n"), MID, ord("x")]
    out = r.json()
    assert out["content"] == REPLY and out["stop"] is True and out["stop_type"] == "eos"
    assert out["tokens_predicted"] == len(REPLY) and out["tokens_evaluated"] == len(prompt)
    assert out["truncated"] is False and out["model"] == MODEL_ID
    t = out["timings"]
    assert t["predicted_n"] == len(REPLY) and t["prompt_n"] + t["cache_n"] == len(prompt)
    assert t["prompt_ms"] >= 0 and t["predicted_ms"] >= 0


def test_infill_response_fields_warm_up_and_stream(fim: tuple[TestClient, FakeModel]) -> None:
    client, _ = fim
    r = infill(client, 7, input_prefix="a", input_suffix="b", n_predict=2,
               response_fields=["content", "timings/predicted_n", "nope"])
    assert r.json() == {"content": REPLY[:2], "timings/predicted_n": 2}
    # n_predict 0 computes the prompt into the cache and answers nothing (editor plugins warm up).
    r = infill(client, 7, input_prefix="a", input_suffix="b", input_extra=[{"text": "ctx"}], n_predict=0)
    assert r.json()["content"] == ""
    events = [e for e in events_of(infill(client, 7, input_prefix="a", input_suffix="b", stream=True))]
    assert sse.DONE not in events
    *parts, final = events
    assert all(isinstance(p, dict) and p["stop"] is False for p in parts)
    assert "".join(p["content"] for p in parts if isinstance(p, dict)) == REPLY
    assert isinstance(final, dict) and final["stop"] is True and final["content"] == ""


def test_n_predict_wins_over_max_tokens_and_0_only_warms_the_cache(fim: tuple[TestClient, FakeModel]) -> None:
    client, model = fim
    # As llama-server reads them: max_tokens is n_predict's alias, ignored when n_predict is given.
    assert infill(client, 8, input_prefix="a", input_suffix="b", n_predict=2, max_tokens=20).json()["content"] == REPLY[:2]
    assert infill(client, 8, input_prefix="a", input_suffix="b", max_tokens=3).json()["content"] == REPLY[:3]
    # n_predict 0 computes the prompt and nothing more (the one token the engine must pick is
    # dropped), whatever max_tokens says: it used to generate 20 and drop them.
    for stream in (False, True):
        wait_health(client.get, is_idle)
        since = len(model.calls)
        r = infill(client, 8, input_prefix="a", input_suffix="b", n_predict=0, max_tokens=20, stream=stream)
        final = dicts(events_of(r))[-1] if stream else r.json()
        assert final["content"] == "" and final["tokens_predicted"] <= 1
        assert len(model.calls) - since <= 2  # the prompt's step, and at most one more


@pytest.mark.parametrize("body,param", [
    ({"input_suffix": "b"}, "input_prefix"),
    ({"input_prefix": "a"}, "input_suffix"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": "lots"}, "n_predict"),
    # A bool or a float is no count: false is not 0 (warm only), nor -1.0 -1 (as many as allowed).
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": False}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": True}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": -1.0}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": 2.5}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "max_tokens": False}, "max_tokens"),
    ({"input_prefix": "a", "input_suffix": "b", "max_tokens": 0.0}, "max_tokens"),
    ({"input_prefix": "a", "input_suffix": "b", "mirostat": 2}, "mirostat"),
    ({"input_prefix": "a", "input_suffix": "b", "grammar": "root ::= \"x\""}, "grammar"),
    ({"input_prefix": "a", "input_suffix": "b", "n_probs": 3}, "n_probs"),
])
def test_infill_refusals_name_the_field(fim: tuple[TestClient, FakeModel], body: dict[str, Any], param: str) -> None:
    err = error_of(infill(fim[0], **body), 400)
    assert err["param"] == param and f"'{param}" in err["message"]


def test_infill_needs_fim_tokens(client: TestClient) -> None:
    assert error_of(infill(client, input_prefix="a", input_suffix="b"), 400)["param"] == "input_suffix"


# -- tokens and the model --------------------------------------------------------------------
def test_tokenize_and_detokenize_in_llama_servers_shapes(fim: tuple[TestClient, FakeModel]) -> None:
    client, _ = fim
    text = f"hé{CONTROL}"
    assert client.post("/tokenize", json={"content": text}).json() == {"tokens": [104, 233, CTL]}
    plain = client.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
    assert plain == [ord(c) for c in text]
    assert client.post("/tokenize", json={"content": "hé", "with_pieces": True}).json() == {
        "tokens": [{"id": 104, "piece": "h"}, {"id": 233, "piece": "é"}]}
    assert client.post("/tokenize", json={}).json() == {"tokens": []}
    assert client.post("/detokenize", json={"tokens": plain}).json() == {"content": text}
    assert error_of(client.post("/detokenize", json={"tokens": [1, 0x110000]}), 400)["param"] == "tokens"
    assert error_of(client.post("/detokenize", json={"tokens": "abc"}), 400)["param"] == "tokens"
    assert error_of(client.post("/tokenize", json={"content": 5}), 400)["param"] == "content"


class PieceTokenizer(FakeTokenizer):
    """Notes, for every detokenize call, whether it ran on the event loop's thread and how
    many requests held the parse gate meanwhile."""

    def __init__(self) -> None:
        self.gate: ParseGate | None = None
        self.seen: list[tuple[bool, int]] = []

    def detokenize(self, tokens: list[int]) -> str:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:  # a worker thread
            on_loop = False
        assert self.gate is not None
        self.seen.append((on_loop, self.gate.busy))
        return super().detokenize(tokens)


def test_pieces_and_text_are_made_off_the_event_loop_under_the_parse_gate() -> None:
    # 1.6M tokens' pieces took 5 s: on the event loop (every stream stands still) and after the
    # gate was given back (nothing bounded how many ran at once).
    tok = PieceTokenizer()
    limits = Limits(slots=1, batch_tokens=64, kv_tokens=4096, ctx_limit=CTX, max_wait_s=0.0, max_queue=8,
                    queue_timeout_s=30.0)
    app = App(Engine(lambda: FakeModel(reply=REPLY, tokenizer=tok), EngineOptions(limits, CachePolicy(n_seq=3))), MODEL_ID,
              RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=CTX))
    tok.gate = app.gate
    with TestClient(create_app(app), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
        tok.seen.clear()
        r = client.post("/tokenize", json={"content": "hé", "with_pieces": True})
        assert r.json() == {"tokens": [{"id": 104, "piece": "h"}, {"id": 233, "piece": "é"}]}
        assert client.post("/detokenize", json={"tokens": [104, 233]}).json() == {"content": "hé"}
        assert tok.seen == [(False, 1)] * 3
        assert app.gate.busy == 0


def test_a_request_carries_at_most_max_tokens(client: TestClient) -> None:
    # The fake's tokens are characters; this server's context (512) is below the cap.
    at, over = "a" * MAX_TOKENS, "a" * (MAX_TOKENS + 1)
    assert len(client.post("/tokenize", json={"content": at, "with_pieces": True}).json()["tokens"]) == MAX_TOKENS
    assert client.post("/detokenize", json={"tokens": [97] * MAX_TOKENS}).json() == {"content": at}
    for r, param in ((client.post("/tokenize", json={"content": over}), "content"),
                     (client.post("/tokenize", json={"content": over, "with_pieces": True}), "content"),
                     (client.post("/detokenize", json={"tokens": [97] * (MAX_TOKENS + 1)}), "tokens")):
        err = error_of(r, 413)
        assert (err["param"], err["code"]) == (param, "too_many_tokens") and str(MAX_TOKENS) in err["message"]


def test_models_report_the_context(client: TestClient) -> None:
    (model,) = client.get("/v1/models").json()["data"]
    assert model["id"] == MODEL_ID and model["max_model_len"] == CTX
    assert model["meta"] == {"n_ctx": CTX, "n_vocab": 0x110000}


def test_one_model_by_its_id_and_a_404_for_any_other(client: TestClient) -> None:
    (listed,) = client.get("/v1/models").json()["data"]
    assert client.get(f"/v1/models/{MODEL_ID}").json() == listed == client.get(f"/models/{MODEL_ID}").json()
    err = error_of(client.get("/v1/models/gpt-4o"), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found") and MODEL_ID in err["message"]
