"""The OpenAI chat front-end: the body parsed into one job (messages templated, tools, one
sampling set per choice, the session), and the shape its chunks and answers take.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, Progress
from appliance.errors import ApplianceError, BadRequest
from appliance.http.api.openai.formats import parse_response_format
from appliance.http.choices import Choice
from appliance.http.grounded import Check
from appliance.http.intake import intake
from appliance.http.messages import message_chars, parse_messages, parse_tools
from appliance.http.pipeline import Answer, Job, Timing, choices, respond
from appliance.http.prompting import Ask, Messages, prepare
from appliance.http.retrieval import citing
from appliance.http.state import App
from appliance.http.telemetry import Meter, Telemetry, parse_telemetry, timings
from appliance.http.validate import (
    SESSION_RULE,
    Biases,
    RequestBounds,
    boolean,
    new_session_id,
    parse_choices,
    parse_constraint,
    parse_logit_bias,
    parse_model,
    parse_sampling,
    parse_stream,
    valid_session_id,
)
from appliance.http.wire import SSE, SSE_HEADERS, openai_error, sse, sse_error, usage
from appliance.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str | None
    session_id: str | None
    n: int = 1
    tools: list[dict[str, Any]] | None = None  # rendered by the chat template
    tool_names: frozenset[str] = frozenset()  # non-empty: the answer is parsed for tool calls
    bias: Biases = ()  # logit_bias, resolved to token ids after intake (prompting.biased)
    grammar_param: str | None = None  # "grammar": the client's own GBNF, named in a refusal
    ignore_eos: bool = False  # llama-server's: answer up to max_tokens
    telemetry: Telemetry = Telemetry()  # llama-server's timings_per_token, return_progress
    library: bool = False  # ours: answer from the office library, with `sources` (http/retrieval.py)


# -- parsing ---------------------------------------------------------------------------------
def check_prefill(data: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """A final assistant message is continued, as llama-server does (the chat template renders
    the turns before it and the prompt ends with its text); vLLM's continue_final_message
    asks for the same explicitly."""
    last_two = [m["role"] for m in messages[-2:]]
    if last_two == ["assistant", "assistant"]:
        raise BadRequest("the messages end with two assistant messages: the last one is continued, so there "
                         "may be only one", param="messages")
    if boolean(data, "continue_final_message"):
        if boolean(data, "add_generation_prompt"):
            raise BadRequest("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                             param="continue_final_message")
        if last_two[-1:] != ["assistant"]:
            raise BadRequest("'continue_final_message' needs a final assistant message", param="continue_final_message")


def parse_chat_request(data: dict[str, Any], bounds: RequestBounds, session_header: str | None = None) -> ChatRequest:
    messages = parse_messages(data.get("messages"), bounds.max_messages, bounds.max_chars)
    check_prefill(data, messages)
    model = parse_model(data)

    n, logprobs = parse_choices(data)
    tools, tool_names, forced = parse_tools(data, bounds.max_chars, message_chars(messages))
    constraint, raw_param = parse_constraint(data)
    given = [g for g in (forced, parse_response_format(data), constraint) if g is not None]
    if len(given) > 1:
        raise BadRequest("give one of a forced tool call, 'response_format', 'grammar' or 'json_schema'",
                         param="grammar" if data.get("grammar") else "response_format")
    params = dataclasses.replace(parse_sampling(data, bounds), grammar=given[0] if given else None, logprobs=logprobs)
    stream, include_usage = parse_stream(data)

    session = session_header if session_header else data.get("session_id")
    # It is echoed in a response header and named in logs by digest: a safe alphabet only.
    if session is not None and not valid_session_id(session):
        raise BadRequest(SESSION_RULE, param="session_id")
    return ChatRequest(messages, params, stream, include_usage, model, session, n, tools, tool_names,
                       parse_logit_bias(data.get("logit_bias")), raw_param, boolean(data, "ignore_eos"),
                       parse_telemetry(data), boolean(data, "library"))


# -- responses -------------------------------------------------------------------------
def new_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def chunks(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A chunk carrying ready `choices` entries (choices.py), for n >= 1 and tool calls."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}


def completion_of(cid: str, created: int, model: str, choices: list[dict[str, Any]], use: dict[str, Any],
                  **extra: Any) -> dict[str, Any]:
    """A whole chat completion from ready `choices` entries (choices.py)."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": use, **extra}


def usage_chunk(cid: str, created: int, model: str, use: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": use}


def _usage(ends: list[Done]) -> dict[str, Any]:
    """One prompt (computed once for all choices), every choice's completion tokens."""
    first = ends[0]
    return usage(first.prompt_tokens, sum(d.completion_tokens for d in ends), first.cached_tokens)


def _all(ends: list[Done]) -> Done:
    """The choices' ends as one, for llama-server's timings: one prompt, every choice's tokens."""
    return dataclasses.replace(ends[0], completion_tokens=sum(d.completion_tokens for d in ends))


class ChatShape:
    """OpenAI's chat answer: chunks of `choices` entries (choices.py) as SSE, or one body."""

    media_type = SSE
    notes = True

    def __init__(self, app: App, req: ChatRequest, session: str, dropped: int) -> None:
        self.model = app.model_id
        self.req = req
        self.cid, self.created = new_id(), int(time.time())
        self.choices = [Choice(i, req.tool_names, req.params.logprobs is not None) for i in range(req.n)]
        self._headers = {"X-Session-Id": session}
        self.extra: dict[str, Any] = {}
        self.timing = Timing()
        self.meter = Meter(req.telemetry, req.n)
        self.check: Check | None = None  # "library": true: the answer's sources and grounding at its end
        # On every chunk and body, as llama-server (and OpenAI) write it.
        self.fingerprint = {"system_fingerprint": app.engine.system_fingerprint}
        if dropped:
            self._headers["X-Dropped-Messages"] = str(dropped)
            self.extra["dropped_messages"] = dropped

    def headers(self, stream: bool) -> dict[str, str]:
        return {**self._headers, **SSE_HEADERS} if stream else self._headers

    def _chunk(self, entries: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(chunks(self.cid, self.created, self.model, entries, **self.fingerprint, **extra))

    def start(self) -> list[bytes]:
        # Content null, not "": what OpenAI sends before a tool call (so every OpenAI client
        # takes it) and what llama-server sends always (its tests assert it).
        return [self._chunk([c.entry({"role": "assistant", "content": None}) for c in self.choices], **self.extra)]

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        asked = self.meter.progress(i, ev)
        return [self._chunk([self.choices[i].entry({})], **asked)] if asked else []

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        entries = self.choices[i].delta(ev)
        timed = self.meter.delta(i, ev)  # on the delta's last chunk, as llama-server puts it
        return [self._chunk([e], **(timed if k == len(entries) - 1 else {})) for k, e in enumerate(entries)]

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        entries, reason = self.choices[i].finish(done)
        out = [self._chunk([entry]) for entry in entries]
        # llama-server's timings ride on the stream's last chunk: the usage chunk when there is one.
        self.timing = timing
        extra = {} if self.req.include_usage else {"timings": timings(done, timing)}
        if self.check is not None:
            extra.update(self.check.wire(i))
        return [*out, self._chunk([{**self.choices[i].entry({}), "finish_reason": reason}], **extra)]

    def close(self, ends: list[Done]) -> list[bytes]:
        if not self.req.include_usage:
            return [sse("[DONE]")]
        use = usage_chunk(self.cid, self.created, self.model, _usage(ends))
        return [sse({**use, **self.fingerprint, "timings": timings(_all(ends), self.timing)}), sse("[DONE]")]

    def error(self, err: ApplianceError) -> bytes:
        return sse_error(err)

    def failed(self, err: ApplianceError) -> Response:
        return openai_error(err)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        messages = []
        for choice, (deltas, done) in zip(self.choices, answer):
            for d in deltas:
                choice.delta(d)
            messages.append(choice.message(done))
        ends = [d for _, d in answer]
        checked = self.check.wire(0) if self.check is not None else {}  # the first choice's, as its sources
        body = completion_of(self.cid, self.created, self.model, messages, _usage(ends), **self.fingerprint,
                             **{**self.extra, **checked}, timings=timings(_all(ends), timing))
        return JSONResponse(body, headers=self._headers)


# -- the route -------------------------------------------------------------------------------
async def chat(app: App, request: Request) -> Response:
    """OpenAI's /v1/chat/completions."""
    header = request.headers.get("x-session-id")
    async with intake(app, request, lambda data: parse_chat_request(data, app.bounds, header)) as (caller, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), req.params, req.bias, req.ignore_eos,
                                              req.grammar_param, cite=citing(app, caller, req.library, request)))
    job = Job(caller, ready.prompt, choices(ready.params, req.n), req.stream, req.session_id or new_session_id(),
              named=req.session_id is not None, report=req.telemetry.report, review=ready.check)
    shape = ChatShape(app, req, job.session, ready.dropped)
    if ready.check is not None:  # in the first chunk, and checked at the end (a whole answer's body)
        shape.extra["sources"], shape.check = ready.check.sources, ready.check
    return await respond(app, request, job, shape)


async def input_tokens(app: App, request: Request) -> Response:
    """llama-server's POST /chat/completions/input_tokens: a chat request's prompt tokens as
    the template renders it (tools included), without generating (no grammar is checked)."""
    async with intake(app, request, lambda data: parse_chat_request(data, app.bounds)) as (_, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), dataclasses.replace(req.params, grammar=None)))
    return JSONResponse({"input_tokens": len(ready.tokens)})
