"""OpenAI's /v1/completions: text completion without a chat template (a prompt string or
tokens; fill-in-the-middle through `suffix`), parsed into one job, and its shape.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, Progress, TokenLogprob
from appliance.errors import ApplianceError, BadRequest
from appliance.http.completion import RawRequest, parse_raw
from appliance.http.intake import intake
from appliance.http.pipeline import Answer, Job, Timing, respond
from appliance.http.prompting import Ask, Infill, Raw, prepare
from appliance.http.state import App
from appliance.http.telemetry import Meter, timings
from appliance.http.validate import (
    RequestBounds,
    boolean,
    check_chars,
    integer,
    logprob_count,
    parse_gbnf,
    parse_model,
    parse_prompt,
    parse_sampling,
    parse_stream,
    text,
)
from appliance.http.wire import SSE, SSE_HEADERS, openai_error, sse, sse_error, usage


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(RawRequest):
    suffix: str  # "" = a plain completion; else fill in the middle between prompt and suffix
    include_usage: bool
    echo: bool
    model: str | None


# -- parsing ----------------------------------------------------------------------------------
def _refuse_unsupported(data: dict[str, Any]) -> None:
    """Fields that would change the answer and are not supported: a 400 naming them."""
    n = integer(data, "n")
    if n is not None and n != 1:
        raise BadRequest("only 'n': 1 is supported", param="n")
    best_of = integer(data, "best_of")
    if best_of is not None and best_of != 1:
        raise BadRequest("only 'best_of': 1 is supported", param="best_of")


def parse_completion_request(data: dict[str, Any], bounds: RequestBounds) -> CompletionRequest:
    prompt = parse_prompt(data.get("prompt"))
    suffix = data.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise BadRequest("'suffix' must be a string", param="suffix")
    suffix = text(suffix or "", "suffix")
    check_chars(bounds, prompt, suffix)
    _refuse_unsupported(data)
    echo = boolean(data, "echo")
    if echo and suffix:
        raise BadRequest("'echo' cannot be combined with 'suffix'", param="echo")
    logprobs = logprob_count(data, "logprobs")  # completions': how many alternatives per token
    if logprobs is not None and echo:
        raise BadRequest("'logprobs' with 'echo' would need the prompt's log-probabilities, which are not computed",
                         param="logprobs")
    grammar = parse_gbnf(data.get("grammar"))  # llama-server's raw GBNF, here too
    params = dataclasses.replace(parse_sampling(data, bounds), logprobs=logprobs, grammar=grammar)
    stream, include_usage = parse_stream(data)
    return parse_raw(CompletionRequest, data, prompt, params, stream, suffix=suffix, include_usage=include_usage,
                     echo=echo, model=parse_model(data))


def completion_ask(req: CompletionRequest) -> Ask:
    """A raw prompt is the client's own text, so its control-token text is parsed;
    fill-in-the-middle text never is (the FIM tokens come from us only)."""
    source = Infill(req.prompt, req.suffix) if req.suffix else Raw(req.prompt)
    return Ask(source, req.params, req.bias, req.ignore_eos, "grammar")


# -- responses -------------------------------------------------------------------------------
def new_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


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
    return usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens)


class CompletionShape:
    """OpenAI's text completion: SSE chunks of text, or one body."""

    media_type = SSE
    notes = True

    def __init__(self, app: App, req: CompletionRequest, echo: str) -> None:
        self.model, self.req, self.echo = app.model_id, req, echo
        self.cid, self.created = new_id(), int(time.time())
        self.offset = 0  # characters of the answer so far (logprobs' text_offset)
        self.meter = Meter(req.telemetry)
        # On every chunk and body, as llama-server (and OpenAI) write it.
        self.fingerprint = {"system_fingerprint": app.engine.system_fingerprint}

    def headers(self, stream: bool) -> dict[str, str]:
        return SSE_HEADERS if stream else {}

    def _chunk(self, text: str, finish: str | None = None, logprobs: dict[str, Any] | None = None,
               **extra: Any) -> bytes:
        return sse({**completion_chunk(self.cid, self.created, self.model, text, finish, logprobs),
                    **self.fingerprint, **extra})

    def start(self) -> list[bytes]:
        return [self._chunk(self.echo)] if self.echo else []

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        asked = self.meter.progress(i, ev)
        return [self._chunk("", **asked)] if asked else []

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        lps = legacy_logprobs(ev.logprobs, self.offset) if self.req.params.logprobs is not None else None
        self.offset += len(ev.text)
        return [self._chunk(ev.text, None, lps, **self.meter.delta(i, ev))]

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        # llama-server's timings ride on the stream's last chunk: the usage chunk when there is one.
        if not self.req.include_usage:
            return [self._chunk("", finish_reason(done), timings=timings(done, timing))]
        use = usage_chunk(self.cid, self.created, self.model, _usage(done))
        return [self._chunk("", finish_reason(done)), sse({**use, **self.fingerprint, "timings": timings(done, timing)})]

    def close(self, ends: list[Done]) -> list[bytes]:
        return [sse("[DONE]")]

    def error(self, err: ApplianceError) -> bytes:
        return sse_error(err)

    def failed(self, err: ApplianceError) -> Response:
        return openai_error(err)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        [(deltas, done)] = answer
        text = "".join(d.text for d in deltas)
        lps = legacy_logprobs([e for d in deltas for e in d.logprobs]) if self.req.params.logprobs is not None else None
        use = _usage(done)
        body = completion_body(self.cid, self.created, self.model, self.echo + text, finish_reason(done), use, lps)
        return JSONResponse({**body, **self.fingerprint, "timings": timings(done, timing)})


async def completions(app: App, request: Request) -> Response:
    async with intake(app, request, lambda data: parse_completion_request(data, app.bounds)) as (caller, req):
        ready = await prepare(app.engine, completion_ask(req))
    echo = ""
    if req.echo:
        echo = req.prompt if isinstance(req.prompt, str) else app.engine.detokenize(req.prompt)
    job = Job(caller, ready.prompt, (ready.params,), req.stream, report=req.telemetry.report)
    return await respond(app, request, job, CompletionShape(app, req, echo))
