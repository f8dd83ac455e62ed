"""OpenAI's Responses API routes: POST /v1/responses parsed (responses_input) into one job
on the chat machinery, previous_response_id continuing its conversation's session
(response_store), answered in the Responses shape; and POST /v1/responses/input_tokens.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import NotFound
from appliance.http.api.openai.response_store import ResponseStore
from appliance.http.api.openai.responses_input import ResponsesRequest, parse_previous, parse_responses_request
from appliance.http.api.openai.responses_shape import ResponseShape
from appliance.http.guard import caller_of
from appliance.http.intake import intake
from appliance.http.pipeline import Job, respond
from appliance.http.prompting import Ask, Messages, prepare
from appliance.http.retrieval import citing
from appliance.http.state import App
from appliance.http.validate import RequestBounds, boolean, new_session_id


def _prior(store: ResponseStore, client: str, data: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The session and messages of the response named by previous_response_id, if any."""
    prev = parse_previous(data)
    if prev is None:
        return None, []
    got = store.get(client, prev)
    if got is None:  # expired, never stored, or another caller's: all alike to the caller
        raise NotFound(f"no response {prev[:64]!r} (it may have expired)", param="previous_response_id")
    return got.session, json.loads(json.dumps(got.messages))  # a copy: parsing must not touch the stored one


# -- the routes ------------------------------------------------------------------------------
@dataclass(slots=True)
class Asked:
    """A request as parsed, the session of the response it continues (None: a new one), and
    whether it asks for the library (ours, as on chat completions)."""

    client: str
    session: str | None = None
    library: bool = False

    def parse(self, store: ResponseStore, bounds: RequestBounds, data: dict[str, Any]) -> ResponsesRequest:
        self.session, prior = _prior(store, self.client, data)
        req = parse_responses_request(data, bounds, prior)
        self.library = boolean(data, "library")
        return req


async def create(store: ResponseStore, app: App, request: Request) -> Response:
    """OpenAI's POST /v1/responses."""
    asked = Asked(caller_of(request.scope["state"]).client)
    async with intake(app, request, lambda data: asked.parse(store, app.bounds, data)) as (caller, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), req.params,
                                              cite=citing(app, caller, asked.library, request)))
    # The conversation continues in its own session, so the next turn finds its KV cells; the
    # id is the server's, never the client's, so it is not kept on disk (named=False).
    job = Job(caller, ready.prompt, (ready.params,), req.stream, asked.session or new_session_id(),
              report=req.telemetry.report, review=ready.check)
    shape = ResponseShape(app, req, store if req.store else None, asked.client, job.session, ready.check)
    return await respond(app, request, job, shape)


async def input_tokens(store: ResponseStore, app: App, request: Request) -> Response:
    """OpenAI's POST /v1/responses/input_tokens: the prompt's tokens as the template renders
    the request (instructions, tools and a previous response's conversation included)."""
    asked = Asked(caller_of(request.scope["state"]).client)
    async with intake(app, request, lambda data: asked.parse(store, app.bounds, data)) as (_, req):
        ready = await prepare(app.engine, Ask(Messages(req.messages, req.tools), dataclasses.replace(req.params, grammar=None)))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(ready.tokens)})
