"""llama-server's /infill (editor plugins' code completion: llama.vim, llama.vscode) parsed
into one job with its shape, which /completion's answer extends; the sampling fields
llama-server has and the appliance does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, Progress
from appliance.errors import ApplianceError, BadRequest
from appliance.http import wire
from appliance.http.intake import intake
from appliance.http.pipeline import Answer, Job, Timing, respond
from appliance.http.prompting import Ask, Infill, prepare
from appliance.http.state import App
from appliance.http.telemetry import Meter, Telemetry, parse_telemetry, timings
from appliance.http.validate import (
    RequestBounds,
    boolean,
    check_chars,
    integer,
    refuse_changed,
    sampling_as,
    text,
)
from appliance.sampling import SamplingParams

MAX_EXTRA = 64  # input_extra chunks in one /infill request
# Neutral values of llama-server's sampling fields that the appliance does not have.
LLAMA_UNSUPPORTED = {"mirostat": 0, "typical_p": 1.0, "dynatemp_range": 0.0, "dry_multiplier": 0.0,
                     "xtc_probability": 0.0, "n_probs": 0, "ignore_eos": False, "grammar": "",
                     "json_schema": None, "logit_bias": [], "n_cmpl": 1, "lora": []}


@dataclass(frozen=True, slots=True)
class InfillRequest:
    prefix: str
    suffix: str
    extra: list[tuple[str, str]]  # (filename, text)
    middle: str  # text after the middle token (llama-server's `prompt`)
    params: SamplingParams
    stream: bool
    warm_only: bool  # n_predict 0: compute the prompt into the cache, answer nothing
    fields: list[str]  # response_fields: only these, "a/b" = b of a, named "a/b"
    telemetry: Telemetry = Telemetry()  # timings_per_token, return_progress


# -- parsing ---------------------------------------------------------------------------------
def n_predict(data: dict[str, Any], bounds: RequestBounds) -> tuple[dict[str, Any], bool]:
    """The fields with llama-server's answer length mapped onto ours, and whether the request
    only warms the cache. n_predict, or max_tokens when it is absent (as llama-server reads
    its alias: given both, max_tokens is ignored): -1 = as many as allowed; 0 = only compute
    the prompt into the cache (one token is generated and dropped, whatever max_tokens says)."""
    key = "n_predict" if data.get("n_predict") is not None else "max_tokens"
    n = integer(data, key)  # a bool or a float is a 400 naming the field, not 0 or -1
    rest = {k: v for k, v in data.items() if k not in ("n_predict", "max_tokens")}
    if n is None:
        return rest, False
    if n == -1:
        n = bounds.max_tokens_limit
    return {**rest, key: 1 if n == 0 else n}, n == 0


def _texts(data: dict[str, Any]) -> dict[str, str]:
    texts = {}
    for key, required in (("input_prefix", True), ("input_suffix", True), ("prompt", False)):
        v = data.get(key)
        if v is None and not required:
            v = ""
        if not isinstance(v, str):
            raise BadRequest(f"'{key}' must be a string" + (" and is required" if required else ""), param=key)
        texts[key] = text(v, key)
    return texts


def _extra(raw_extra: Any) -> list[tuple[str, str]]:
    if not isinstance(raw_extra, list) or len(raw_extra) > MAX_EXTRA:
        raise BadRequest(f"'input_extra' must be an array of at most {MAX_EXTRA} {{\"filename\", \"text\"}} objects",
                         param="input_extra")
    extra = []
    for i, chunk in enumerate(raw_extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise BadRequest(f"'input_extra[{i}]' must be {{\"filename\": string, \"text\": string}}",
                             param="input_extra")
        extra.append((text(chunk.get("filename", "") or "tmp", "input_extra"), text(chunk["text"], "input_extra")))
    return extra


def parse_infill_request(data: dict[str, Any], bounds: RequestBounds) -> InfillRequest:
    texts = _texts(data)
    extra = _extra(data.get("input_extra") or [])
    check_chars(bounds, *texts.values(), *(t for _, t in extra))
    refuse_changed(data, LLAMA_UNSUPPORTED)
    fields = data.get("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise BadRequest("'response_fields' must be an array of strings", param="response_fields")
    sampling, warm_only = n_predict(data, bounds)
    params = sampling_as(sampling, bounds, {"n_predict": "max_tokens"})
    return InfillRequest(texts["input_prefix"], texts["input_suffix"], extra, texts["prompt"], params,
                         boolean(data, "stream"), warm_only, fields, parse_telemetry(data))


# -- responses -------------------------------------------------------------------------------
def pick_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's response_fields: "a/b" is body["a"]["b"], named "a/b"; missing ones are left out."""
    if not fields:
        return body
    out = {}
    for f in fields:
        v: Any = body
        for part in f.split("/"):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            out[f] = v
    return out


def infill_body(model: str, text: str, done: Done, timing: Timing, truncated: bool, ctx: int) -> dict[str, Any]:
    stop_type = "limit" if done.finish_reason == "length" else "eos"
    return {"index": 0, "content": text, "tokens": [], "stop": True, "model": model,
            "tokens_predicted": done.completion_tokens, "tokens_evaluated": done.prompt_tokens,
            "generation_settings": {"n_ctx": ctx}, "has_new_line": "\n" in text, "truncated": truncated,
            "stop_type": stop_type, "stopping_word": "", "tokens_cached": done.cached_tokens,
            "timings": timings(done, timing)}


class LlamaAsk(Protocol):
    """What a llama-server answer's shape reads of its request (/infill's, /completion's)."""

    @property
    def warm_only(self) -> bool: ...
    @property
    def fields(self) -> list[str]: ...
    @property
    def telemetry(self) -> Telemetry: ...


class InfillShape:
    """llama-server's infill answer: SSE events of content, then the whole body's fields."""

    media_type = wire.SSE
    notes = True

    def __init__(self, app: App, req: LlamaAsk, truncated: bool) -> None:
        self.model, self.ctx, self.req, self.truncated = app.model_id, app.bounds.ctx_limit, req, truncated
        self.n = 0
        self.meter = Meter(req.telemetry)

    def body(self, text: str, done: Done, timing: Timing) -> dict[str, Any]:
        """The whole answer's fields (the last streamed event's), before response_fields picks."""
        return infill_body(self.model, text, done, timing, self.truncated, self.ctx)

    def headers(self, stream: bool) -> dict[str, str]:
        return wire.SSE_HEADERS if stream else {}

    def start(self) -> list[bytes]:
        return []

    def event(self, ev: Delta) -> dict[str, Any]:
        """One streamed event: the delta's text and token ids (and its timings, if asked)."""
        self.n += len(ev.tokens)
        return {"index": 0, "content": ev.text, "tokens": ev.tokens, "stop": False, "tokens_predicted": self.n,
                **self.meter.delta(0, ev)}

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        asked = self.meter.progress(i, ev)
        if not asked or self.req.warm_only:
            return []
        return [wire.sse({"index": 0, "content": "", "tokens": [], "stop": False, "tokens_predicted": 0, **asked})]

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        event = self.event(ev)
        return [] if self.req.warm_only else [wire.sse(event)]

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        return [wire.sse(pick_fields(self.body("", done, timing), self.req.fields))]

    def close(self, ends: list[Done]) -> list[bytes]:
        return []

    def error(self, err: ApplianceError) -> bytes:
        return wire.sse_error(err)

    def failed(self, err: ApplianceError) -> Response:
        return wire.openai_error(err)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        [(deltas, done)] = answer
        content = "" if self.req.warm_only else "".join(d.text for d in deltas)
        return JSONResponse(pick_fields(self.body(content, done, timing), self.req.fields))


async def infill(app: App, request: Request) -> Response:
    """llama-server's /infill: editor plugins' code completion (llama.vim, llama.vscode)."""
    async with intake(app, request, lambda data: parse_infill_request(data, app.bounds)) as (caller, req):
        ready = await prepare(app.engine, Ask(Infill(req.prefix, req.suffix, tuple(req.extra), req.middle, "input_suffix"),
                                              req.params))
    job = Job(caller, ready.prompt, (req.params,), req.stream, report=req.telemetry.report)
    return await respond(app, request, job, InfillShape(app, req, ready.truncated))
