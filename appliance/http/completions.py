"""Text completion without a chat template: OpenAI's /v1/completions (a prompt string or
tokens; fill-in-the-middle through `suffix`), llama-server's /infill, /tokenize and
/detokenize. Request parsing and response shaping are pure functions; one route function
per endpoint takes the App.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from appliance.engine.engine import Engine
from appliance.engine.events import Delta, Done, Failed, TokenLogprob
from appliance.errors import BadRequest, ContextLengthExceeded, PayloadTooLarge
from appliance.http import openai_api as api
from appliance.http.relay import Timing, collect, intake, relay, submit
from appliance.http.server import App, error_response, guarded, sse_error
from appliance.sampling import SamplingParams

MAX_EXTRA = 64  # input_extra chunks in one /infill request
# Between input_extra chunks when the model has no file-separator token (llama-server's).
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: str | list[int]
    suffix: str  # "" = a plain completion; else fill in the middle between prompt and suffix
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool
    model: str | None


# -- parsing ----------------------------------------------------------------------------------
def _is_tokens(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def parse_prompt(raw: Any, param: str = "prompt") -> str | list[int]:
    """A string or a list of token ids; a list holding one of them is that one. Several
    prompts in one request are refused: send them as separate requests, which are batched
    together anyway."""
    if isinstance(raw, list) and len(raw) == 1 and (isinstance(raw[0], str) or _is_tokens(raw[0])):
        raw = raw[0]
    if isinstance(raw, str):
        return api._text(raw, param)
    if _is_tokens(raw):
        if not raw:
            raise BadRequest(f"'{param}' must not be empty", param=param)
        return list(raw)
    if isinstance(raw, list) and all(isinstance(p, str) or _is_tokens(p) for p in raw):
        raise BadRequest(f"'{param}' holds {len(raw)} prompts; this server takes one per request "
                         "(send them as separate requests: they are decoded together)", param=param)
    if raw is None:
        raise BadRequest(f"'{param}' is required", param=param)
    raise BadRequest(f"'{param}' must be a string or an array of token ids", param=param)


def _refuse_unsupported(data: dict[str, Any]) -> None:
    """Fields that would change the answer and are not supported: a 400 naming them."""
    n = api._integer(data, "n")
    if n is not None and n != 1:
        raise BadRequest("only 'n': 1 is supported", param="n")
    best_of = api._integer(data, "best_of")
    if best_of is not None and best_of != 1:
        raise BadRequest("only 'best_of': 1 is supported", param="best_of")
    if data.get("logit_bias"):
        raise BadRequest("'logit_bias' is not supported", param="logit_bias")


def check_chars(limits: api.ServerLimits, *texts: str | list[int]) -> None:
    if sum(len(t) for t in texts if isinstance(t, str)) > limits.max_chars:
        raise PayloadTooLarge(f"the prompt holds more than {limits.max_chars} characters of text",
                              param="prompt", code="too_many_characters")


def parse_completion_request(data: dict[str, Any], limits: api.ServerLimits) -> CompletionRequest:
    prompt = parse_prompt(data.get("prompt"))
    suffix = data.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise BadRequest("'suffix' must be a string", param="suffix")
    suffix = api._text(suffix or "", "suffix")
    check_chars(limits, prompt, suffix)
    _refuse_unsupported(data)
    echo = api._bool(data, "echo")
    if echo and suffix:
        raise BadRequest("'echo' cannot be combined with 'suffix'", param="echo")
    logprobs = api._integer(data, "logprobs")  # completions': how many alternatives per token
    if logprobs is not None and not 0 <= logprobs <= api.MAX_TOP_LOGPROBS:
        raise BadRequest(f"'logprobs' must be between 0 and {api.MAX_TOP_LOGPROBS}", param="logprobs")
    if logprobs is not None and echo:
        raise BadRequest("'logprobs' with 'echo' would need the prompt's log-probabilities, which are not computed",
                         param="logprobs")
    params = dataclasses.replace(api.parse_sampling(data, limits), logprobs=logprobs)
    stream, include_usage = api.parse_stream(data)
    return CompletionRequest(prompt, suffix, params, stream, include_usage, echo, api.parse_model(data))


# -- prompts ---------------------------------------------------------------------------------
def check_tokens(tokens: Sequence[int], n_vocab: int, param: str = "prompt") -> None:
    """Ids the model has: llama.cpp would fail the whole decode step on one it has not."""
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise BadRequest(f"'{param}' holds token id {bad}, but this model's ids are 0-{n_vocab - 1}", param=param)


def fit(tokens: list[int], limit: int, param: str = "prompt") -> list[int]:
    if not tokens:
        raise BadRequest(f"'{param}' must not be empty", param=param)
    if len(tokens) > limit:
        raise ContextLengthExceeded(f"the prompt is {len(tokens)} tokens, and this server allows {limit} prompt "
                                    "tokens with this max_tokens", param=param)
    return tokens


def fim_prompt(fim: tuple[int, int, int], prefix: Sequence[int], suffix: Sequence[int], limit: int,
               extra: Sequence[int] = (), middle: Sequence[int] = ()) -> tuple[list[int], bool]:
    """[extra] PRE prefix SUF suffix MID [middle] within `limit` tokens, and whether anything
    was cut. Like llama-server: the end of the prefix and the start of the suffix are kept,
    the suffix gets at least a quarter of the room if it needs it, extra context the rest."""
    pre, suf, mid = fim
    room = limit - 3 - len(middle)
    if room < 0:
        raise ContextLengthExceeded(f"the infill prompt is {len(middle)} tokens, and this server allows {limit} "
                                    "prompt tokens with this max_tokens", param="prompt")
    n_suf = min(len(suffix), room // 4)
    n_pre = min(len(prefix), room - n_suf)
    n_suf = min(len(suffix), room - n_pre)
    n_extra = min(len(extra), room - n_pre - n_suf)
    tokens = [*extra[len(extra) - n_extra:], pre, *prefix[len(prefix) - n_pre:], suf, *suffix[:n_suf], mid, *middle]
    return tokens, (n_pre, n_suf, n_extra) != (len(prefix), len(suffix), len(extra))


async def _tokens(engine: Engine, prompt: str | list[int], special: bool) -> list[int]:
    if isinstance(prompt, str):
        return await engine.tokenize(prompt, special) if prompt else []
    check_tokens(prompt, engine.n_vocab)
    return prompt


def fim_ids(engine: Engine, param: str = "suffix") -> tuple[int, int, int]:
    fim = engine.fim_tokens
    if fim is None:
        raise BadRequest(f"this model has no fill-in-the-middle tokens, so '{param}' is not supported", param=param)
    return fim


async def completion_prompt(engine: Engine, req: CompletionRequest) -> tuple[list[int], bool]:
    """The prompt's tokens and whether they were cut to fit. A raw prompt is the client's own
    text, so its control-token text is parsed; fill-in-the-middle text never is (the FIM
    tokens come from us only)."""
    limit = engine.prompt_limit(req.params.max_tokens)
    if req.suffix:
        fim = fim_ids(engine)
        prefix = await _tokens(engine, req.prompt, special=False)
        suffix = await engine.tokenize(req.suffix, False)
        return fim_prompt(fim, prefix, suffix, limit)
    return fit(await _tokens(engine, req.prompt, special=True), limit), False


# -- responses -------------------------------------------------------------------------------
def new_id() -> str:
    return "cmpl-" + api.new_id().removeprefix("chatcmpl-")


def finish_reason(done: Done) -> str:
    return "stop" if done.finish_reason == "cancelled" else done.finish_reason


def legacy_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """Completions' logprobs: parallel lists of tokens, their log-probabilities, the likeliest
    alternatives and each token's character offset in the text (from `offset`)."""
    tokens = [e.token.decode("utf-8", "replace") for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.decode("utf-8", "replace"): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def completion_body(cid: str, created: int, model: str, text: str, finish: str, use: dict[str, Any],
                    logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}], "usage": use}


def completion_chunk(cid: str, created: int, model: str, text: str, finish: str | None = None,
                     logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}


def usage_chunk(cid: str, created: int, model: str, use: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [], "usage": use}


def _usage(done: Done) -> dict[str, Any]:
    return api.usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)


# -- /v1/completions -------------------------------------------------------------------------
async def completions(app: App, request: Request) -> Response:
    async with intake(app, request) as (caller, data):
        req = parse_completion_request(data, app.limits)
        tokens, _ = await completion_prompt(app.engine, req)
    echo = ""
    if req.echo:
        echo = req.prompt if isinstance(req.prompt, str) else app.engine.detokenize(req.prompt)
    timing = Timing()
    handle = submit(app, caller, tokens, req.params)
    cid, created = new_id(), int(time.time())
    if req.stream:
        return StreamingResponse(guarded(_stream(app, handle, timing, req, cid, created, echo), [handle]),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    result = await collect(app, request, handle, timing)
    if result is None:
        return Response(status_code=499)
    deltas, end = result
    text = "".join(d.text for d in deltas)
    if isinstance(end, Failed):
        return error_response(end.error)
    lps = legacy_logprobs([e for d in deltas for e in d.logprobs]) if req.params.logprobs is not None else None
    return JSONResponse(completion_body(cid, created, app.model_id, echo + text, finish_reason(end), _usage(end), lps))


async def _stream(app: App, handle: Any, timing: Timing, req: CompletionRequest, cid: str, created: int,
                  echo: str) -> AsyncGenerator[bytes, None]:
    model = app.model_id
    if echo:
        yield api.sse(completion_chunk(cid, created, model, echo))
    offset = 0  # characters of the answer so far (logprobs' text_offset)
    async for ev in relay(app, handle, timing, notes=True):
        if isinstance(ev, int):
            yield app.queue_note(ev)
        elif isinstance(ev, Delta):
            lps = legacy_logprobs(ev.logprobs, offset) if req.params.logprobs is not None else None
            offset += len(ev.text)
            yield api.sse(completion_chunk(cid, created, model, ev.text, logprobs=lps))
        elif isinstance(ev, Done):
            yield api.sse(completion_chunk(cid, created, model, "", finish_reason(ev)))
            if req.include_usage:
                yield api.sse(usage_chunk(cid, created, model, _usage(ev)))
            yield api.sse("[DONE]")
        else:  # the 200 is already sent: the error travels as one event, then the stream ends
            yield sse_error(ev.error)


# -- llama-server's names --------------------------------------------------------------------
def sampling_as(data: dict[str, Any], limits: api.ServerLimits, names: dict[str, str], where: str = "") -> SamplingParams:
    """parse_sampling over fields another API spells its own way (`names`: theirs -> ours);
    a refusal names the field as the client spelled it (`where` + theirs)."""
    ours = {names.get(k, k): v for k, v in data.items()}
    try:
        return api.parse_sampling(ours, limits)
    except BadRequest as e:
        theirs = next((t for t, o in names.items() if o == e.param and t in data), e.param)
        if e.param is None or theirs is None:
            raise
        name = f"'{where}{theirs}'"
        said = f"'{e.param}'"
        message = e.message.replace(said, name) if said in e.message else f"{name}: {e.message}"
        raise BadRequest(message, param=f"{where}{theirs}") from None


def refuse_changed(data: dict[str, Any], defaults: dict[str, Any], where: str = "") -> None:
    """Sampling fields we do not implement are fine at their neutral value, else a 400."""
    for key, neutral in defaults.items():
        v = data.get(key)
        if v is None or v == neutral or (neutral in ("", []) and not v):  # [] and {}: no biases, no adapters
            continue
        raise BadRequest(f"'{where}{key}' is not supported here (leave it out or at {neutral!r})", param=f"{where}{key}")


# Neutral values of llama-server's sampling fields that the appliance does not have.
LLAMA_UNSUPPORTED = {"mirostat": 0, "typical_p": 1.0, "dynatemp_range": 0.0, "dry_multiplier": 0.0,
                     "xtc_probability": 0.0, "n_probs": 0, "ignore_eos": False, "grammar": "",
                     "json_schema": None, "logit_bias": [], "n_cmpl": 1, "lora": []}


def _n_predict(data: dict[str, Any], limits: api.ServerLimits) -> tuple[dict[str, Any], bool]:
    """The fields with llama-server's answer length mapped onto ours, and whether the request
    only warms the cache. n_predict, or max_tokens when it is absent (as llama-server reads
    its alias: given both, max_tokens is ignored): -1 = as many as allowed; 0 = only compute
    the prompt into the cache (one token is generated and dropped, whatever max_tokens says)."""
    key = "n_predict" if data.get("n_predict") is not None else "max_tokens"
    n = api._integer(data, key)  # a bool or a float is a 400 naming the field, not 0 or -1
    rest = {k: v for k, v in data.items() if k not in ("n_predict", "max_tokens")}
    if n is None:
        return rest, False
    if n == -1:
        n = limits.max_tokens_limit
    return {**rest, key: 1 if n == 0 else n}, n == 0


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


def parse_infill_request(data: dict[str, Any], limits: api.ServerLimits) -> InfillRequest:
    texts = {}
    for key, required in (("input_prefix", True), ("input_suffix", True), ("prompt", False)):
        v = data.get(key)
        if v is None and not required:
            v = ""
        if not isinstance(v, str):
            raise BadRequest(f"'{key}' must be a string" + (" and is required" if required else ""), param=key)
        texts[key] = api._text(v, key)
    raw_extra = data.get("input_extra") or []
    if not isinstance(raw_extra, list) or len(raw_extra) > MAX_EXTRA:
        raise BadRequest(f"'input_extra' must be an array of at most {MAX_EXTRA} {{\"filename\", \"text\"}} objects",
                         param="input_extra")
    extra = []
    for i, chunk in enumerate(raw_extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise BadRequest(f"'input_extra[{i}]' must be {{\"filename\": string, \"text\": string}}",
                             param="input_extra")
        extra.append((api._text(chunk.get("filename", "") or "tmp", "input_extra"), api._text(chunk["text"], "input_extra")))
    check_chars(limits, *texts.values(), *(t for _, t in extra))
    refuse_changed(data, LLAMA_UNSUPPORTED)
    fields = data.get("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise BadRequest("'response_fields' must be an array of strings", param="response_fields")
    sampling, warm_only = _n_predict(data, limits)
    params = sampling_as(sampling, limits, {"n_predict": "max_tokens"})
    return InfillRequest(texts["input_prefix"], texts["input_suffix"], extra, texts["prompt"], params,
                         api._bool(data, "stream"), warm_only, fields)


async def infill_prompt(engine: Engine, req: InfillRequest) -> tuple[list[int], bool]:
    fim = fim_ids(engine, "input_suffix")
    extra: list[int] = []
    for filename, text in req.extra:
        # No file-separator token is known here: llama-server's plain-text separator.
        extra += await engine.tokenize(f"{CHUNK_SEPARATOR}{filename}\n{text}", False)
    prefix = await engine.tokenize(req.prefix, False) if req.prefix else []
    suffix = await engine.tokenize(req.suffix, False) if req.suffix else []
    middle = await engine.tokenize(req.middle, False) if req.middle else []
    return fim_prompt(fim, prefix, suffix, engine.prompt_limit(req.params.max_tokens), extra, middle)


def timings(done: Done, timing: Timing) -> dict[str, Any]:
    """llama-server's timings, from wall-clock marks (the prompt's includes any queueing)."""
    prompt_n, predicted_n = done.prompt_tokens - done.cached_tokens, done.completion_tokens
    prompt_ms, predicted_ms = timing.prompt_s * 1000, timing.predict_s * 1000
    return {
        "cache_n": done.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 3) if prompt_ms else 0.0,
        "predicted_n": predicted_n, "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(predicted_n * 1000 / predicted_ms, 3) if predicted_ms else 0.0,
    }


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


async def infill(app: App, request: Request) -> Response:
    """llama-server's /infill: editor plugins' code completion (llama.vim, llama.vscode)."""
    async with intake(app, request) as (caller, data):
        req = parse_infill_request(data, app.limits)
        tokens, truncated = await infill_prompt(app.engine, req)
    timing = Timing()
    handle = submit(app, caller, tokens, req.params)
    ctx = app.limits.ctx_limit
    if req.stream:
        return StreamingResponse(guarded(_infill_stream(app, handle, timing, req, truncated), [handle]),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    result = await collect(app, request, handle, timing)
    if result is None:
        return Response(status_code=499)
    deltas, end = result
    text = "".join(d.text for d in deltas)
    if isinstance(end, Failed):
        return error_response(end.error)
    if req.warm_only:
        text = ""
    return JSONResponse(pick_fields(infill_body(app.model_id, text, end, timing, truncated, ctx), req.fields))


async def _infill_stream(app: App, handle: Any, timing: Timing, req: InfillRequest,
                         truncated: bool) -> AsyncGenerator[bytes, None]:
    n = 0
    async for ev in relay(app, handle, timing, notes=True):
        if isinstance(ev, int):
            yield app.queue_note(ev)
        elif isinstance(ev, Delta):
            n += 1
            if not req.warm_only:
                yield api.sse({"index": 0, "content": ev.text, "tokens": [], "stop": False, "tokens_predicted": n})
        elif isinstance(ev, Done):
            body = infill_body(app.model_id, "", ev, timing, truncated, app.limits.ctx_limit)
            yield api.sse(pick_fields(body, req.fields))
        else:
            yield sse_error(ev.error)


# -- /tokenize, /detokenize ----------------------------------------------------------------
# Tokens one /tokenize or /detokenize request may carry. Their work is per token and holds
# the GIL (a piece each, then the JSON of the list: 1.6M tokens with pieces froze every
# stream for 5 s), so the count is bounded. 100k is ~25 of the default 4,096-token contexts,
# enough to count a long document before cutting it into prompts, and ~0.3 s of work in a
# worker; a context configured larger than that still fits whole.
MAX_TOKENS = 100_000


def check_token_count(n: int, limits: api.ServerLimits, param: str) -> None:
    cap = max(MAX_TOKENS, limits.ctx_limit)
    if n > cap:
        raise PayloadTooLarge(f"'{param}' holds {n} tokens; one request may carry at most {cap} (send it in parts)",
                              param=param, code="too_many_tokens")


def _tokenized(engine: Engine, tokens: list[int], pieces: bool) -> Response:
    """/tokenize's answer, rendered here (in a worker: a long list takes a while)."""
    if not pieces:
        return JSONResponse({"tokens": tokens})
    return JSONResponse({"tokens": [{"id": t, "piece": engine.detokenize([t])} for t in tokens]})


def _detokenized(engine: Engine, tokens: Any) -> Response:
    """/detokenize's answer: each id checked, then the text (in a worker, as _tokenized)."""
    if not _is_tokens(tokens):
        raise BadRequest("'tokens' must be an array of token ids", param="tokens")
    check_tokens(tokens, engine.n_vocab, "tokens")
    return JSONResponse({"content": engine.detokenize(tokens)})


async def tokenize(app: App, request: Request) -> Response:
    """llama-server's /tokenize: {"content", "parse_special" (default true), "with_pieces"}."""
    async with intake(app, request) as (_, data):
        content = data.get("content", "")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string", param="content")
        check_chars(app.limits, api._text(content, "content"))
        special = api._bool(data, "parse_special", True)
        pieces = api._bool(data, "with_pieces")
        api._bool(data, "add_special")  # no BOS is ever added here: checked, then moot
        tokens = await app.engine.tokenize(content, special) if content else []
        check_token_count(len(tokens), app.limits, "content")
        # Under the gate, so that a client cannot start more of these at once than of anything
        # else, and off the event loop, which every stream needs.
        return await asyncio.to_thread(_tokenized, app.engine, tokens, pieces)


async def detokenize(app: App, request: Request) -> Response:
    """llama-server's /detokenize: {"tokens": [ids]} -> {"content": text}."""
    async with intake(app, request) as (_, data):
        tokens = data.get("tokens", [])
        if isinstance(tokens, list):
            check_token_count(len(tokens), app.limits, "tokens")  # before any per-id work
        return await asyncio.to_thread(_detokenized, app.engine, tokens)
