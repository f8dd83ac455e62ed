"""llama-server's native routes: POST /completion (its own completion format: a prompt as
text or tokens, n_predict, cache_prompt, id_slot, timings) parsed into one job with its
shape, and the read-only GET /props and GET /slots (engine snapshot).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, TokenLogprob
from appliance.errors import BadRequest
from appliance.http import wire
from appliance.http.api.llama.infill import LLAMA_UNSUPPORTED, InfillShape, n_predict
from appliance.http.completion import RawRequest, parse_raw
from appliance.http.guard import caller_of
from appliance.http.intake import intake
from appliance.http.pipeline import Answer, Job, Timing, respond
from appliance.http.prompting import Ask, Raw, prepare
from appliance.http.state import App
from appliance.http.validate import (
    RequestBounds,
    boolean,
    check_chars,
    integer,
    logprob_count,
    parse_constraint,
    parse_prompt,
    refuse_changed,
    sampling_as,
)
from appliance.sampling import SamplingParams


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeRequest(RawRequest):
    warm_only: bool  # n_predict 0: compute the prompt into the cache, answer nothing
    fields: list[str]  # response_fields, as /infill reads them
    grammar_param: str | None = None  # "grammar": the client's own GBNF, named in a refusal
    post_probs: int = 0  # post_sampling_probs: this many alternatives, as the sampler saw them
    return_tokens: bool = False  # the whole answer's token ids in `tokens` (a stream's events always carry theirs)


# /infill's refusals, less what /completion implements: n_probs, a grammar or schema, logit_bias, ignore_eos.
NATIVE_UNSUPPORTED = {k: v for k, v in LLAMA_UNSUPPORTED.items() if k not in ("n_probs", "grammar", "json_schema",
                                                                             "logit_bias", "ignore_eos")}
# post_sampling_probs rebuilds the sampler's distribution from this many raw alternatives:
# top_k's default 40 and then some (min_p's 0.05 already keeps far fewer).
POST_SAMPLING_K = 64


# -- parsing ---------------------------------------------------------------------------------
def native_prompt(raw: Any) -> str | list[int]:
    """A prompt as text or ids, or llama-server's object form {"prompt_string": text}; its
    multimodal_data is refused (the appliance reads no images or audio)."""
    if isinstance(raw, dict):
        if raw.get("multimodal_data"):
            raise BadRequest("'prompt.multimodal_data' is not supported: this server reads text only",
                             param="prompt.multimodal_data")
        if not isinstance(raw.get("prompt_string"), str):
            raise BadRequest("'prompt' as an object needs a 'prompt_string'", param="prompt")
        raw = raw["prompt_string"]
    return parse_prompt(raw)


def parse_native_request(data: dict[str, Any], bounds: RequestBounds, slots: int) -> NativeRequest:
    prompt = native_prompt(data.get("prompt"))
    check_chars(bounds, prompt)
    refuse_changed(data, NATIVE_UNSUPPORTED)
    # cache_prompt is accepted: what is cached and for whom follows the appliance's own client
    # isolation (a client's conversations are reused by prefix, nobody else's), whatever it says.
    boolean(data, "cache_prompt", True)
    # One scheduler places every request; a named slot is accepted and not honoured, and
    # one that does not exist is refused as llama-server refuses it.
    slot = integer(data, "id_slot")
    if slot is not None and slot != -1 and not 0 <= slot < slots:
        raise BadRequest(f"'id_slot' must be -1 or between 0 and {slots - 1}", param="id_slot")
    fields = data.get("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise BadRequest("'response_fields' must be an array of strings", param="response_fields")
    sampling, warm_only = n_predict(data, bounds)
    grammar, grammar_param = parse_constraint(data)
    n_probs = logprob_count(data, "n_probs") or None
    post = n_probs if n_probs and boolean(data, "post_sampling_probs") else 0
    params = dataclasses.replace(sampling_as(sampling, bounds, {"n_predict": "max_tokens"}), grammar=grammar,
                                 logprobs=POST_SAMPLING_K if post else n_probs)
    return parse_raw(NativeRequest, data, prompt, params, boolean(data, "stream"), warm_only=warm_only, fields=fields,
                     grammar_param=grammar_param, post_probs=post, return_tokens=boolean(data, "return_tokens"))


# -- responses -------------------------------------------------------------------------------
def generation_settings(params: SamplingParams, ctx: int) -> dict[str, Any]:
    """llama-server's generation_settings, for the sampling the appliance has."""
    return {"n_ctx": ctx, "n_predict": params.max_tokens, "temperature": params.temperature,
            "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
            "repeat_penalty": params.repeat_penalty, "repeat_last_n": params.penalty_last_n,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            "seed": -1 if params.seed is None else params.seed, "stop": list(params.stop),
            # JSON has no -inf: a banned token's bias is null, as llama-server writes it.
            "logit_bias": [{"token": t, "bias": b if math.isfinite(b) else None} for t, b in params.logit_bias]}


def _prob(token: bytes, tid: int, logprob: float) -> dict[str, Any]:
    return {"id": tid, "token": token.decode("utf-8", "replace"), "bytes": list(token), "logprob": logprob}


def sampled_distribution(e: TokenLogprob, params: SamplingParams) -> list[tuple[int, bytes, float]]:
    """The distribution the sampler drew token `e` from, rebuilt from the raw log-probabilities
    of its likeliest alternatives in llama.cpp's order: top_k, top_p, min_p, then temperature.
    Tokens the chain cut are not in it (llama-server's post_sampling_probs leaves out zeros)."""
    cands = [(tid, tok, lp) for (tok, lp), tid in zip(e.top, e.top_ids) if math.isfinite(lp)]
    if params.greedy or not cands:
        return [(e.id, e.token, 1.0)]
    if params.top_k > 0:
        cands = cands[:params.top_k]
    total = sum(math.exp(lp) for _, _, lp in cands)
    kept, mass = [], 0.0
    for c in cands:  # top_p: the smallest head holding top_p of the mass
        kept.append(c)
        mass += math.exp(c[2]) / total
        if mass >= params.top_p:
            break
    floor = cands[0][2] + math.log(params.min_p) if params.min_p > 0 else -math.inf
    kept = [c for c in kept if c[2] >= floor]  # min_p: at least min_p of the likeliest's
    weights = [math.exp((lp - kept[0][2]) / params.temperature) for _, _, lp in kept]
    z = sum(weights)
    return [(tid, tok, w / z) for (tid, tok, _), w in zip(kept, weights)]


def _post(tid: int, token: bytes, prob: float) -> dict[str, Any]:
    return {"id": tid, "token": token.decode("utf-8", "replace"), "bytes": list(token), "prob": prob}


def completion_probabilities(entries: list[TokenLogprob], params: SamplingParams | None = None,
                             n: int = 0) -> list[dict[str, Any]]:
    """llama-server's n_probs answer: each token with its likeliest alternatives, before
    sampling (log-probabilities), or with `params` after it (post_sampling_probs: the n
    likeliest of what the sampler kept, as probabilities)."""
    if params is None:
        return [{**_prob(e.token, e.id, e.logprob),
                 "top_logprobs": [_prob(t, tid, lp) for (t, lp), tid in zip(e.top, e.top_ids)]} for e in entries]
    out = []
    for e in entries:
        dist = sampled_distribution(e, params)
        # A token a grammar or a bias forced may be outside the rebuilt set: its raw probability.
        chosen = next((p for tid, _, p in dist if tid == e.id), math.exp(e.logprob))
        out.append({**_post(e.id, e.token, chosen), "top_probs": [_post(*d) for d in dist[:n]]})
    return out


class NativeShape(InfillShape):
    """llama-server's /completion answer: /infill's, with the slot, the sampling settings and
    (n_probs) each token's probabilities."""

    def __init__(self, app: App, req: NativeRequest, truncated: bool) -> None:
        super().__init__(app, req, truncated)
        self.probs: list[TokenLogprob] = []  # a whole answer's, gathered as its deltas are read
        self.ids: list[int] = []  # the answer's token ids so far (return_tokens)

    def body(self, text: str, done: Done, timing: Timing) -> dict[str, Any]:
        assert isinstance(self.req, NativeRequest)
        prompt = {"prompt": self.req.prompt} if isinstance(self.req.prompt, str) else {}  # the client's own text
        probs = {"completion_probabilities": self._probs(self.probs)} if self.probs and text else {}
        return {**super().body(text, done, timing), **prompt, "id_slot": 0, **probs,
                "tokens": self.ids if self.req.return_tokens and not self.req.warm_only else [],
                "generation_settings": generation_settings(self.req.params, self.ctx)}

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        self.ids += ev.tokens
        event = {**self.event(ev), "id_slot": 0}
        if self.req.warm_only:
            return []
        if not ev.logprobs:
            return [wire.sse(event)]
        # One event per token, as llama-server streams them: a delta holding several (bytes of
        # one character, a stop string's held-back text) carries its text on the first.
        probs = self._probs(ev.logprobs)
        return [wire.sse({**event, "content": ev.text if k == 0 else "", "tokens": [e.id],
                          "completion_probabilities": [p]}) for k, (e, p) in enumerate(zip(ev.logprobs, probs))]

    def _probs(self, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        assert isinstance(self.req, NativeRequest)
        post = self.req.post_probs
        return completion_probabilities(entries, self.req.params if post else None, post)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        self.probs = [e for d in answer[0][0] for e in d.logprobs]
        self.ids = [t for d in answer[0][0] for t in d.tokens]
        return await super().whole(answer, timing)


async def completion(app: App, request: Request) -> Response:
    """llama-server's POST /completion: a raw prompt (text, control-token text parsed, or ids)."""
    slots = max(1, app.engine.snapshot.slots)
    async with intake(app, request, lambda data: parse_native_request(data, app.bounds, slots)) as (caller, req):
        ready = await prepare(app.engine, Ask(Raw(req.prompt), req.params, req.bias, req.ignore_eos, req.grammar_param))
    req = dataclasses.replace(req, params=ready.params)  # generation_settings shows the resolved biases
    job = Job(caller, ready.prompt, (ready.params,), req.stream, report=req.telemetry.report)
    return await respond(app, request, job, NativeShape(app, req, ready.truncated))


# -- /props, /slots --------------------------------------------------------------------------
def _slot(app: App, i: int, busy: bool) -> dict[str, Any]:
    # No prompt, no generated text, no session: a slot serves many clients in turn.
    return {"id": i, "id_task": -1, "n_ctx": app.bounds.ctx_limit, "speculative": False, "is_processing": busy}


async def props(app: App, request: Request) -> Response:
    """llama-server's GET /props: the defaults, the slot count and the context; the model's
    name (never a file path) only for the operator, as /health shows it."""
    caller = caller_of(request.scope["state"])
    b = app.bounds
    defaults = SamplingParams(max_tokens=b.default_max_tokens, temperature=b.default_temperature, seed=b.default_seed)
    body: dict[str, Any] = {
        "default_generation_settings": {**_slot(app, 0, False),
                                        "params": generation_settings(defaults, app.bounds.ctx_limit)},
        "total_slots": app.engine.snapshot.slots,
        "n_ctx": app.bounds.ctx_limit,
        "modalities": {"vision": False, "audio": False},
        "is_sleeping": False,
    }
    if caller.local or caller.admin:
        body["model_alias"] = app.model_id
    return JSONResponse(body)


async def slots(app: App, request: Request) -> Response:
    """llama-server's GET /slots: each slot's id, context and whether it is busy, read from
    the engine's published snapshot (busy slots are counted there, not named)."""
    snap = app.engine.snapshot
    return JSONResponse([_slot(app, i, i < snap.running) for i in range(snap.slots)])
