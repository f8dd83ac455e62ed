"""Ollama's generating routes over the same engine, bounds, fairness and keys as the
OpenAI routes, so tools that only speak Ollama (Open WebUI, Continue, Home Assistant, the
`ollama` client) connect unchanged: /api/chat and /api/generate parsed into one job each,
and their shapes: NDJSON streams (`stream` defaults to true), durations in nanoseconds.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.engine import Engine, EngineState
from appliance.engine.events import Delta, Done, Progress, TokenLogprob
from appliance.errors import ApplianceError, BadRequest, Unavailable
from appliance.http.api.ollama.wire import NDJSON, error_line, line, model_name, ollama_error, stamp
from appliance.http.grounded import Check
from appliance.http.intake import intake
from appliance.http.messages import parse_messages, parse_tools
from appliance.http.pipeline import Answer, Job, Timing, respond
from appliance.http.prompting import Ask, Infill, Messages, Raw, Source, prepare
from appliance.http.retrieval import citing
from appliance.http.state import App
from appliance.http.validate import (
    RequestBounds,
    boolean,
    check_chars,
    json_text,
    parse_choices,
    refuse_changed,
    sampling_as,
    text,
)
from appliance.sampling import SamplingParams
from appliance.structured.grammar import JSON_OBJECT, schema_grammar
from appliance.structured.tools import CallStream, ToolCall, answer_calls

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


# -- parsing ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Common:
    model: str
    params: SamplingParams  # with the format's grammar and the logprobs asked for
    stream: bool
    unload: bool  # keep_alive 0: the client asks to unload (we never do; the model stays)


def parse_options(raw: Any, bounds: RequestBounds) -> SamplingParams:
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
        opts["num_predict"] = bounds.max_tokens_limit
    return sampling_as(opts, bounds, {k: v for k, v in OPTIONS.items() if k != v}, "options.")


def parse_format(fmt: Any) -> str | None:
    """format -> the grammar the answer must follow: "json" any JSON object, or a JSON
    schema (checked as response_format's: a keyword we cannot enforce is a 400)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return JSON_OBJECT
    if isinstance(fmt, dict):
        return schema_grammar(json_text(fmt, "format"), "format")
    raise BadRequest("'format' must be \"json\" or a JSON schema object", param="format")


def parse_common(data: dict[str, Any], bounds: RequestBounds) -> Common:
    """What /api/chat and /api/generate share; fields that would change the answer and are
    not supported are a 400 naming them."""
    model = model_name(data)
    if data.get("think") not in (None, False):
        raise BadRequest("'think': this model does not think", param="think")
    _, logprobs = parse_choices({k: data[k] for k in ("logprobs", "top_logprobs") if k in data})
    keep_alive = data.get("keep_alive")
    if keep_alive is not None and (isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float, str))):
        raise BadRequest("'keep_alive' must be a duration such as \"5m\" or a number of seconds", param="keep_alive")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", param="stream")
    unload = keep_alive in (0, 0.0, "0", "0s", "0m", "0h")
    params = dataclasses.replace(parse_options(data.get("options"), bounds), grammar=parse_format(data.get("format")),
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


def parse_chat(data: dict[str, Any], bounds: RequestBounds) -> Chat:
    common = parse_common(data, bounds)
    tools, names, _ = parse_tools({"tools": data["tools"]} if data.get("tools") else {})
    raw = data.get("messages")
    if raw is None or raw == []:
        return Chat(common, [], tools, names)
    if isinstance(raw, list):
        for i, m in enumerate(raw):
            if isinstance(m, dict) and m.get("images"):
                raise BadRequest(f"'messages[{i}].images': this model reads text only", param=f"messages[{i}].images")
        raw = [{**m, "tool_calls": _openai_calls(m["tool_calls"])} if isinstance(m, dict) and m.get("tool_calls")
               else m for m in raw]
    return Chat(common, parse_messages(raw, bounds.max_messages, bounds.max_chars), tools, names)


@dataclass(frozen=True, slots=True)
class Generate:
    common: Common
    prompt: str  # "" = Ollama's load call
    system: str
    suffix: str  # not "": fill in the middle between prompt and suffix
    raw: bool  # the prompt is the whole model input: no chat template
    context: list[int]  # tokens of an earlier exchange (Ollama's deprecated memory)


def parse_generate(data: dict[str, Any], bounds: RequestBounds) -> Generate:
    common = parse_common(data, bounds)
    texts = {}
    for key in ("prompt", "system", "suffix", "template"):
        v = data.get(key)
        if v is not None and not isinstance(v, str):
            raise BadRequest(f"'{key}' must be a string", param=key)
        texts[key] = text(v or "", key)
    if texts["template"]:
        raise BadRequest("'template' is not supported: the model's own chat template is used", param="template")
    if data.get("images"):
        raise BadRequest("'images': this model reads text only", param="images")
    check_chars(bounds, *texts.values())
    context = data.get("context") or []
    if not isinstance(context, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise BadRequest("'context' must be an array of token ids", param="context")
    raw = boolean(data, "raw")
    return Generate(common, texts["prompt"], texts["system"], texts["suffix"], raw, context)


def generate_ask(req: Generate) -> Ask:
    """The prompt's source: fill in the middle, the client's whole input (raw), or the prompt
    (and system) through the chat template; `context` comes first, as Ollama puts it."""
    source: Source
    if req.suffix:
        source = Infill(req.prompt, req.suffix)
    elif req.raw:
        source = Raw(req.prompt)  # the client writes the whole input
    else:
        system = [{"role": "system", "content": req.system}] if req.system else []
        source = Messages([*system, {"role": "user", "content": req.prompt}])
    return Ask(source, req.common.params, context=req.context, length_param="num_predict")


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


def logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Ollama's logprobs: each token's text and log-probability, with its likeliest alternatives."""
    def text(token: bytes) -> str:
        return token.decode("utf-8", "replace")

    return [{"token": text(e.token), "logprob": e.logprob,
             "top_logprobs": [{"token": text(t), "logprob": lp} for t, lp in e.top]} for e in entries]


def _with_logprobs(part: dict[str, Any], params: SamplingParams, entries: list[TokenLogprob]) -> dict[str, Any]:
    if params.logprobs is not None:
        part["logprobs"] = logprobs(entries)
    return part


def _entries(parts: list[list[TokenLogprob]]) -> list[TokenLogprob]:
    return [e for part in parts for e in part]


def _loaded(engine: Engine, common: Common, part: dict[str, Any]) -> Response:
    """Ollama's load call (no messages, no prompt): nothing to generate once the model is up."""
    if engine.state is not EngineState.READY:
        raise Unavailable(f"the model is not ready ({engine.status})", retry_after=5)
    return JSONResponse({**part, "done_reason": "unload" if common.unload else "load"})


class _Ndjson:
    """What Ollama's two answers share: NDJSON, no queue notes, errors as {"error"}."""

    media_type = NDJSON
    notes = False

    def headers(self, stream: bool) -> dict[str, str]:
        return {}

    def start(self) -> list[bytes]:
        return []

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        return []  # never asked for (Ollama has no such field, and no notes)

    def close(self, ends: list[Done]) -> list[bytes]:
        return []

    def error(self, err: ApplianceError) -> bytes:
        return error_line(err)

    def failed(self, err: ApplianceError) -> Response:
        return ollama_error(err)


class ChatShape(_Ndjson):
    """/api/chat's answer: message parts, tool calls each whole (tools.CallStream), stats."""

    def __init__(self, req: Chat, check: Check | None = None) -> None:
        self.model, self.params, self.names = req.common.model, req.common.params, req.tool_names
        self.calls: CallStream[list[TokenLogprob]] = CallStream(req.tool_names)
        self.check = check  # ours, "library": true: sources and grounding on the last line

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        shown, calls, lps = self.calls.feed(ev.text, ev.logprobs)
        out = []
        if shown or (self.params.logprobs is not None and any(lps)):
            out.append(line(_with_logprobs(chat_part(self.model, shown), self.params, _entries(lps))))
        if calls:  # each call whole, as Ollama sends them
            out.append(line(chat_part(self.model, "", calls=calls)))
        return out

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        rest, calls, lps = self.calls.finish()
        out = [line(_with_logprobs(chat_part(self.model, rest, calls=calls), self.params, _entries(lps)))] \
            if rest or calls else []
        return [*out, line({**chat_part(self.model, "", True), **stats(done, timing), **self._checked()})]

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        [(deltas, done)] = answer
        shown, calls = answer_calls("".join(d.text for d in deltas), self.names)
        part = _with_logprobs(chat_part(self.model, shown, True, calls), self.params, _entries([d.logprobs for d in deltas]))
        return JSONResponse({**part, **stats(done, timing), **self._checked()})

    def _checked(self) -> dict[str, Any]:
        return self.check.wire(0) if self.check is not None else {}


class GenerateShape(_Ndjson):
    """/api/generate's answer: response parts, stats, and the `context` for the next call."""

    def __init__(self, engine: Engine, common: Common, prompt: list[int] | None) -> None:
        self.engine, self.model, self.params, self.prompt = engine, common.model, common.params, prompt
        self.parts: list[str] = []

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        self.parts.append(ev.text)
        return [line(_with_logprobs(generate_part(self.model, ev.text), self.params, ev.logprobs))]

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        return [line(await self._last(generate_part(self.model, "", True), done, timing, "".join(self.parts)))]

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        [(deltas, done)] = answer
        answer_text = "".join(d.text for d in deltas)
        part = _with_logprobs(generate_part(self.model, answer_text, True), self.params,
                              _entries([d.logprobs for d in deltas]))
        return JSONResponse(await self._last(part, done, timing, answer_text))

    async def _last(self, part: dict[str, Any], done: Done, timing: Timing, answer_text: str) -> dict[str, Any]:
        body = {**part, **stats(done, timing)}
        if self.prompt is not None:
            body["context"] = await _context(self.engine, self.prompt, answer_text)
        return body


async def _context(engine: Engine, prompt: list[int], answer: str) -> list[int]:
    """Prompt and answer as tokens, for the client's next `context` (the answer tokenized
    again: the same text, though not always the very tokens sampled)."""
    try:
        return prompt + (await engine.tokenize(answer, False) if answer else [])
    except ApplianceError:  # draining: the context is a nicety
        return prompt


# -- routes ----------------------------------------------------------------------------------
async def chat(app: App, request: Request) -> Response:
    async with intake(app, request, lambda data: (parse_chat(data, app.bounds), boolean(data, "library"))) \
            as (caller, (req, library)):
        common = req.common
        if not req.messages:
            return _loaded(app.engine, common, chat_part(common.model, "", True))
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), common.params,
                                              cite=citing(app, caller, library, request)))
    return await respond(app, request, Job(caller, ready.prompt, (ready.params,), common.stream, review=ready.check),
                         ChatShape(req, ready.check))


async def generate(app: App, request: Request) -> Response:
    async with intake(app, request, lambda data: parse_generate(data, app.bounds)) as (caller, req):
        common = req.common
        if not req.prompt:
            return _loaded(app.engine, common, generate_part(common.model, "", True))
        ready = await prepare(app.engine, generate_ask(req))
    # A raw prompt gets no `context` back, as Ollama answers it.
    shape = GenerateShape(app.engine, common, None if req.raw else ready.tokens)
    return await respond(app, request, Job(caller, ready.prompt, (ready.params,), common.stream), shape)
