"""Ollama's API over the same engine, limits, fairness and keys as the OpenAI routes, so
tools that only speak Ollama (Open WebUI, Continue, Home Assistant, the `ollama` client)
connect unchanged: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version.

In Ollama's shapes: NDJSON streams (`stream` defaults to true), durations in nanoseconds,
and errors as {"error": "..."} (not OpenAI's). Request parsing and response shaping are
pure functions; one route function per endpoint takes the App.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from appliance.engine.engine import Engine, EngineState
from appliance.engine.events import Delta, Done, Failed, TokenLogprob
from appliance.errors import ApplianceError, BadRequest, ContextLengthExceeded, Unavailable
from appliance.http import openai_api as api
from appliance.http.completions import check_chars, check_tokens, fim_ids, fim_prompt, refuse_changed, sampling_as
from appliance.http.relay import Timing, collect, intake, relay, submit
from appliance.http.server import App, guarded
from appliance.sampling import SamplingParams
from appliance.structured.grammar import JSON_OBJECT, schema_grammar
from appliance.structured.tools import CLOSE, OPEN, ToolCall, ToolCallParser, split_answer

# The Ollama release whose /api shapes these routes follow; some tools check it.
VERSION = "0.12.11"
NDJSON = "application/x-ndjson"
# Ollama's sampling options that the appliance has, with its own names where they differ.
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "min_p": "min_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
           "stop": "stop"}
# Sampling options the appliance does not have: fine at their neutral value, else a 400.
# The rest of Ollama's options (num_ctx, num_batch, num_thread, num_gpu, use_mmap, num_keep,
# penalize_newline, ...) size or place the model at load time: the appliance's own
# configuration decides those, so they are accepted and ignored.
UNSUPPORTED_OPTIONS = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
FAR_FUTURE = "9999-12-31T23:59:59Z"  # expires_at of a model that is never unloaded


# -- errors and framing ----------------------------------------------------------------------
def error_response(err: ApplianceError) -> JSONResponse:
    """Ollama's error shape, with our status and Retry-After."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse({"error": err.message}, status_code=err.status, headers=headers)


Route = Callable[[App, Request], Awaitable[Response]]


def ollama_errors(route: Route) -> Route:
    @functools.wraps(route)
    async def wrapped(app: App, request: Request) -> Response:
        try:
            return await route(app, request)
        except ApplianceError as e:
            return error_response(e)

    return wrapped


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line; line separators inside strings escaped (some clients split on them)."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(api._SEPARATORS) + "\n").encode()


def error_line(err: ApplianceError) -> bytes:
    """The line that ends a stream which failed after its 200 (NDJSON has no other way)."""
    return line({"error": err.message})


def stamp(t: float | None = None) -> str:
    """Ollama's created_at: RFC 3339 in UTC with nanoseconds."""
    ns = time.time_ns() if t is None else int(t * 1e9)
    secs, frac = divmod(ns, 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


# -- parsing ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Common:
    model: str
    params: SamplingParams  # with the format's grammar and the logprobs asked for
    stream: bool
    unload: bool  # keep_alive 0: the client asks to unload (we never do; the model stays)


def _model(data: dict[str, Any]) -> str:
    model = data.get("model", data.get("name"))
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required", param="model")
    return model


def parse_options(raw: Any, limits: api.ServerLimits) -> SamplingParams:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("'options' must be an object", param="options")
    refuse_changed(raw, UNSUPPORTED_OPTIONS, "options.")
    opts = {k: v for k, v in raw.items() if k in OPTIONS}
    n = opts.get("num_predict")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):  # false == 0, -1.0 == -1
        raise BadRequest("'options.num_predict' must be an integer", param="options.num_predict")
    if n in (-2, -1, 0):  # -1 and 0: no limit; -2: fill the context
        opts["num_predict"] = limits.max_tokens_limit
    return sampling_as(opts, limits, {k: v for k, v in OPTIONS.items() if k != v}, "options.")


def parse_format(fmt: Any) -> str | None:
    """format -> the grammar the answer must follow: "json" any JSON object, or a JSON
    schema (checked as response_format's: a keyword we cannot enforce is a 400)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return JSON_OBJECT
    if isinstance(fmt, dict):
        return schema_grammar(api.json_text(fmt, "format"), "format")
    raise BadRequest("'format' must be \"json\" or a JSON schema object", param="format")


def parse_common(data: dict[str, Any], limits: api.ServerLimits) -> Common:
    """What /api/chat and /api/generate share; fields that would change the answer and are
    not supported are a 400 naming them."""
    model = _model(data)
    if data.get("think") not in (None, False):
        raise BadRequest("'think': this model does not think", param="think")
    _, logprobs = api.parse_choices({k: data[k] for k in ("logprobs", "top_logprobs") if k in data})
    keep_alive = data.get("keep_alive")
    if keep_alive is not None and (isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float, str))):
        raise BadRequest("'keep_alive' must be a duration such as \"5m\" or a number of seconds", param="keep_alive")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", param="stream")
    unload = keep_alive in (0, 0.0, "0", "0s", "0m", "0h")
    params = dataclasses.replace(parse_options(data.get("options"), limits), grammar=parse_format(data.get("format")),
                                 logprobs=logprobs)
    return Common(model, params, stream is not False, unload)


@dataclass(frozen=True, slots=True)
class Chat:
    common: Common
    messages: list[dict[str, Any]]  # [] = Ollama's load call
    tools: list[dict[str, Any]] | None  # for the chat template
    tool_names: frozenset[str]  # calls of these in the answer become tool_calls


def _openai_calls(calls: Any) -> Any:
    """Ollama's tool calls carry their arguments as an object; OpenAI's as JSON text."""
    if not isinstance(calls, list):
        return calls
    out = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if isinstance(f, dict) and isinstance(f.get("arguments"), dict):
            c = {**c, "function": {**f, "arguments": json.dumps(f["arguments"], ensure_ascii=False)}}
        out.append(c)
    return out


def parse_chat(data: dict[str, Any], limits: api.ServerLimits) -> Chat:
    common = parse_common(data, limits)
    tools, names, _ = api.parse_tools({"tools": data["tools"]} if data.get("tools") else {})
    raw = data.get("messages")
    if raw is None or raw == []:
        return Chat(common, [], tools, names)
    if isinstance(raw, list):
        for i, m in enumerate(raw):
            if isinstance(m, dict) and m.get("images"):
                raise BadRequest(f"'messages[{i}].images': this model reads text only", param=f"messages[{i}].images")
        raw = [{**m, "tool_calls": _openai_calls(m["tool_calls"])} if isinstance(m, dict) and m.get("tool_calls")
               else m for m in raw]
    return Chat(common, api.parse_messages(raw, limits.max_messages, limits.max_chars), tools, names)


@dataclass(frozen=True, slots=True)
class Generate:
    common: Common
    prompt: str  # "" = Ollama's load call
    system: str
    suffix: str  # not "": fill in the middle between prompt and suffix
    raw: bool  # the prompt is the whole model input: no chat template
    context: list[int]  # tokens of an earlier exchange (Ollama's deprecated memory)


def parse_generate(data: dict[str, Any], limits: api.ServerLimits) -> Generate:
    common = parse_common(data, limits)
    texts = {}
    for key in ("prompt", "system", "suffix", "template"):
        v = data.get(key)
        if v is not None and not isinstance(v, str):
            raise BadRequest(f"'{key}' must be a string", param=key)
        texts[key] = api._text(v or "", key)
    if texts["template"]:
        raise BadRequest("'template' is not supported: the model's own chat template is used", param="template")
    if data.get("images"):
        raise BadRequest("'images': this model reads text only", param="images")
    check_chars(limits, *texts.values())
    context = data.get("context") or []
    if not isinstance(context, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise BadRequest("'context' must be an array of token ids", param="context")
    raw = api._bool(data, "raw")
    return Generate(common, texts["prompt"], texts["system"], texts["suffix"], raw, context)


async def generate_prompt(engine: Engine, req: Generate) -> tuple[list[int], bool]:
    """The prompt's tokens, and whether a `context` can be returned (not for raw prompts,
    as Ollama). `context` comes first, as Ollama puts it."""
    check_tokens(req.context, engine.n_vocab, "context")
    limit = engine.prompt_limit(req.common.params.max_tokens) - len(req.context)
    if req.suffix:
        prefix = await engine.tokenize(req.prompt, False)
        tokens, _ = fim_prompt(fim_ids(engine), prefix, await engine.tokenize(req.suffix, False), limit)
    elif req.raw:
        tokens = await engine.tokenize(req.prompt, True)  # the client writes the whole input
    else:
        system = [{"role": "system", "content": req.system}] if req.system else []
        tokens = (await engine.prepare([*system, {"role": "user", "content": req.prompt}],
                                       req.common.params.max_tokens)).tokens
    if len(tokens) > limit:
        raise ContextLengthExceeded(f"the prompt is {len(req.context) + len(tokens)} tokens, and this server allows "
                                    f"{limit + len(req.context)} prompt tokens with this num_predict", param="prompt")
    return req.context + tokens, not req.raw


# -- responses -------------------------------------------------------------------------------
def stats(done: Done, timing: Timing) -> dict[str, Any]:
    """Ollama's counts and durations (ns, wall clock: the prompt's include any queueing)."""
    return {"done_reason": "length" if done.finish_reason == "length" else "stop",
            "total_duration": int(timing.total_s * 1e9), "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens, "prompt_eval_duration": int(timing.prompt_s * 1e9),
            "eval_count": done.completion_tokens, "eval_duration": int(timing.predict_s * 1e9)}


def chat_part(model: str, text: str, done: bool = False, calls: list[ToolCall] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]
    return {"model": model, "created_at": stamp(), "message": msg, "done": done}


def generate_part(model: str, text: str, done: bool = False) -> dict[str, Any]:
    return {"model": model, "created_at": stamp(), "response": text, "done": done}


def answer_calls(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """A whole answer -> (its text, its tool calls). Besides Qwen's tagged blocks, an answer
    that is nothing but one call's JSON is that call: the 0.5B model often leaves the tags
    out (measured: "What is the weather like in Paris?" with a get_weather tool, greedy)."""
    if not names:
        return text, []
    shown, calls = split_answer(text, names)
    if not calls and text.strip().startswith("{"):
        bare, calls = split_answer(f"{OPEN}{text.strip()}{CLOSE}", names)
        if calls and not bare.strip():
            return "", calls
        return text, []
    return shown, calls


class StreamedReply:
    """An answer as it streams, with tool calls taken out (tools.ToolCallParser). With tools,
    an answer that starts with "{" is held until it ends: it may be a call without its tags."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.parser = ToolCallParser(names) if names else None
        self.held: list[Delta] | None = [] if names else None  # undecided: could be a bare call

    def feed(self, ev: Delta) -> tuple[str, list[ToolCall], list[Delta]]:
        if self.parser is None:
            return ev.text, [], [ev]
        text, calls = self.parser.feed(ev.text)
        if self.held is None:
            return text, calls, [ev]
        self.held.append(Delta(text, ev.logprobs))
        so_far = "".join(d.text for d in self.held).lstrip()
        if calls or (so_far and not so_far.startswith("{")):
            held, self.held = self.held, None  # decided: not a bare call
            return "".join(d.text for d in held), calls, held
        return "", [], []

    def finish(self) -> tuple[str, list[ToolCall], list[Delta]]:
        rest = self.parser.flush() if self.parser else ""
        if self.held is None:
            return rest, [], []
        held = [*self.held, Delta(rest)]
        text, calls = answer_calls("".join(d.text for d in held), self.names)
        return text, calls, held


def logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Ollama's logprobs: each token's text and log-probability, with its likeliest alternatives."""
    def text(token: bytes) -> str:
        return token.decode("utf-8", "replace")

    return [{"token": text(e.token), "logprob": e.logprob,
             "top_logprobs": [{"token": text(t), "logprob": lp} for t, lp in e.top]} for e in entries]


def _with_logprobs(part: dict[str, Any], params: SamplingParams, deltas: list[Delta]) -> dict[str, Any]:
    if params.logprobs is not None:
        part["logprobs"] = logprobs([e for d in deltas for e in d.logprobs])
    return part


def ollama_name(model_id: str) -> str:
    """Ollama names carry a tag; a name without one is `latest`."""
    return model_id if ":" in model_id else f"{model_id}:latest"


def details() -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": "", "families": None,
            "parameter_size": "", "quantization_level": ""}


def model_entry(app: App) -> dict[str, Any]:
    name = ollama_name(app.model_id)
    return {"name": name, "model": name, "modified_at": stamp(app.created), "size": 0,
            "digest": hashlib.sha256(app.model_id.encode()).hexdigest(), "details": details()}


# -- routes ----------------------------------------------------------------------------------
def _ready(engine: Engine) -> None:
    if engine.state is not EngineState.READY:
        raise Unavailable(f"the model is not ready ({engine.status})", retry_after=5)


@ollama_errors
async def chat(app: App, request: Request) -> Response:
    async with intake(app, request) as (caller, data):
        req = parse_chat(data, app.limits)
        common = req.common
        if not req.messages:
            _ready(app.engine)
            return JSONResponse({**chat_part(common.model, "", True), "done_reason": "unload" if common.unload else "load"})
        prompt = await app.engine.prepare(req.messages, common.params.max_tokens, req.tools)
        await app.engine.check_grammar(common.params.grammar)
    timing = Timing()
    handle = submit(app, caller, prompt, common.params)
    if common.stream:
        return StreamingResponse(guarded(_chat_stream(app, handle, timing, req), [handle], error_line),
                                 media_type=NDJSON)
    result = await collect(app, request, handle, timing)
    if result is None:
        return Response(status_code=499)
    deltas, end = result
    if isinstance(end, Failed):
        return error_response(end.error)
    text, calls = answer_calls("".join(d.text for d in deltas), req.tool_names)
    part = _with_logprobs(chat_part(common.model, text, True, calls), common.params, deltas)
    return JSONResponse({**part, **stats(end, timing)})


async def _chat_stream(app: App, handle: Any, timing: Timing, req: Chat) -> AsyncGenerator[bytes, None]:
    model, params = req.common.model, req.common.params
    reply = StreamedReply(req.tool_names)
    async for ev in relay(app, handle, timing, notes=False):
        if isinstance(ev, Delta):
            text, calls, deltas = reply.feed(ev)
            if text or (params.logprobs is not None and any(d.logprobs for d in deltas)):
                yield line(_with_logprobs(chat_part(model, text), params, deltas))
            if calls:  # each call whole, as Ollama sends them
                yield line(chat_part(model, "", calls=calls))
        elif isinstance(ev, Done):
            text, calls, deltas = reply.finish()
            if text or calls:
                yield line(_with_logprobs(chat_part(model, text, calls=calls), params, deltas))
            yield line({**chat_part(model, "", True), **stats(ev, timing)})
        elif isinstance(ev, Failed):  # the 200 is sent: the error is the last line
            yield error_line(ev.error)


@ollama_errors
async def generate(app: App, request: Request) -> Response:
    async with intake(app, request) as (caller, data):
        req = parse_generate(data, app.limits)
        if not req.prompt:
            _ready(app.engine)
            part = generate_part(req.common.model, "", True)
            return JSONResponse({**part, "done_reason": "unload" if req.common.unload else "load"})
        tokens, with_context = await generate_prompt(app.engine, req)
        await app.engine.check_grammar(req.common.params.grammar)
    timing = Timing()
    handle = submit(app, caller, tokens, req.common.params)
    model = req.common.model
    if req.common.stream:
        stream = _generate_stream(app, handle, timing, req.common, tokens if with_context else None)
        return StreamingResponse(guarded(stream, [handle], error_line), media_type=NDJSON)
    result = await collect(app, request, handle, timing)
    if result is None:
        return Response(status_code=499)
    deltas, end = result
    if isinstance(end, Failed):
        return error_response(end.error)
    text = "".join(d.text for d in deltas)
    body = {**_with_logprobs(generate_part(model, text, True), req.common.params, deltas), **stats(end, timing)}
    if with_context:
        body["context"] = await _context(app.engine, tokens, text)
    return JSONResponse(body)


async def _context(engine: Engine, prompt: list[int], answer: str) -> list[int]:
    """Prompt and answer as tokens, for the client's next `context` (the answer tokenized
    again: the same text, though not always the very tokens sampled)."""
    try:
        return prompt + (await engine.tokenize(answer, False) if answer else [])
    except ApplianceError:  # draining: the context is a nicety
        return prompt


async def _generate_stream(app: App, handle: Any, timing: Timing, common: Common,
                           prompt: list[int] | None) -> AsyncGenerator[bytes, None]:
    model = common.model
    parts: list[str] = []
    async for ev in relay(app, handle, timing, notes=False):
        if isinstance(ev, Delta):
            parts.append(ev.text)
            yield line(_with_logprobs(generate_part(model, ev.text), common.params, [ev]))
        elif isinstance(ev, Done):
            body = {**generate_part(model, "", True), **stats(ev, timing)}
            if prompt is not None:
                body["context"] = await _context(app.engine, prompt, "".join(parts))
            yield line(body)
        elif isinstance(ev, Failed):
            yield error_line(ev.error)


@ollama_errors
async def tags(app: App, request: Request) -> Response:
    return JSONResponse({"models": [model_entry(app)]})


@ollama_errors
async def ps(app: App, request: Request) -> Response:
    if app.engine.state is not EngineState.READY:
        return JSONResponse({"models": []})
    entry = {**model_entry(app), "expires_at": FAR_FUTURE, "size_vram": 0, "context_length": app.limits.ctx_limit}
    del entry["modified_at"]
    return JSONResponse({"models": [entry]})


@ollama_errors
async def show(app: App, request: Request) -> Response:
    async with intake(app, request) as (_, data):
        _model(data)  # any name: this server has one model
    ctx = app.limits.ctx_limit
    # Tool calls go through the model's chat template (Qwen2.5's has a tools section).
    capabilities = ["completion", "tools"] + (["insert"] if app.engine.fim_tokens else [])
    return JSONResponse({
        "license": "", "modelfile": f"FROM {app.model_id}\nPARAMETER num_ctx {ctx}\n",
        "parameters": f"num_ctx                        {ctx}", "template": "",
        "details": details(), "model_info": {"general.context_length": ctx},
        "capabilities": capabilities, "modified_at": stamp(app.created),
    })


@ollama_errors
async def version(app: App, request: Request) -> Response:
    return JSONResponse({"version": VERSION})
