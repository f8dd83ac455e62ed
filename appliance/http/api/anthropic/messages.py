"""The routes: POST /v1/messages (streamed or whole) and /v1/messages/count_tokens, on the
one request path (intake, prepare, respond) through the chat front-end's parser."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest
from appliance.http.api.anthropic.request import to_chat
from appliance.http.api.anthropic.shape import MessageShape
from appliance.http.intake import intake
from appliance.http.messages import message_chars, parse_messages, parse_tools
from appliance.http.pipeline import Job, respond
from appliance.http.prompting import Ask, Messages, prepare
from appliance.http.retrieval import citing
from appliance.http.state import App
from appliance.http.validate import SESSION_RULE, RequestBounds, boolean, new_session_id, parse_sampling, valid_session_id
from appliance.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # rendered by the chat template
    tool_names: frozenset[str]  # non-empty: the answer is parsed for tool calls
    params: SamplingParams
    stream: bool
    session_id: str | None
    library: bool = False  # ours, as on chat completions: answer from the library, with `sources`


def parse(data: dict[str, Any], bounds: RequestBounds, session: str | None, count_only: bool = False) -> MessagesRequest:
    """Checked as every chat request is (http/messages.py, validate.py), in the chat shape
    request.py turns it into."""
    chat = to_chat(data, need_max_tokens=not count_only)
    messages = parse_messages(chat["messages"], bounds.max_messages, bounds.max_chars)
    tools, names, forced = parse_tools(chat, bounds.max_chars, message_chars(messages))
    params = dataclasses.replace(parse_sampling(chat, bounds), grammar=forced)
    if session is not None and not valid_session_id(session):
        raise BadRequest(SESSION_RULE, param="session_id")
    return MessagesRequest(messages, tools, names, params, boolean(chat, "stream"), session, boolean(data, "library"))


async def create(app: App, request: Request) -> Response:
    """Anthropic's POST /v1/messages."""
    header = request.headers.get("x-session-id")
    async with intake(app, request, lambda data: parse(data, app.bounds, header)) as (caller, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), req.params,
                                              cite=citing(app, caller, req.library, request)))
    job = Job(caller, ready.prompt, (ready.params,), req.stream, req.session_id or new_session_id(),
              named=req.session_id is not None, review=ready.check)
    shape = MessageShape(app.model_id, req.tool_names, len(ready.tokens), job.session, ready.check)
    return await respond(app, request, job, shape)


async def count_tokens(app: App, request: Request) -> Response:
    """Anthropic's POST /v1/messages/count_tokens: the prompt's tokens as the template renders
    it (system, tools and messages), without generating."""
    async with intake(app, request, lambda data: parse(data, app.bounds, None, count_only=True)) as (_, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), dataclasses.replace(req.params, grammar=None)))
    return JSONResponse({"input_tokens": len(ready.tokens)})
