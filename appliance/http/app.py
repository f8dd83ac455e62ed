"""The Starlette app: the routes of every front-end, the lifespan that starts the engine,
and the exception handlers that turn errors into OpenAI's error bodies.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from appliance.errors import ApplianceError, EngineFailure, NotFound
from appliance.http.api.anthropic import messages as anthropic
from appliance.http.api.appliance import admin, documents, library, operator
from appliance.http.api.llama import completion as llama_completion
from appliance.http.api.llama import infill as llama_infill
from appliance.http.api.llama import tokens as llama_tokens
from appliance.http.api.ollama import generate as ollama
from appliance.http.api.ollama import info as ollama_info
from appliance.http.api.ollama.wire import ollama_error
from appliance.http.api.openai import chat, completions, embeddings, responses
from appliance.http.api.openai.response_store import ResponseStore
from appliance.http.api.people import admin as people_admin
from appliance.http.api.people import auth, keys
from appliance.http.api.people import chats as people_chats
from appliance.http.guard import Guard, caller_of
from appliance.http.lifecycle import running
from appliance.http.outcome import refused
from appliance.http.state import App
from appliance.http.wire import anthropic_error, openai_error

log = logging.getLogger(__name__)
Handler = Callable[[App, Request], Awaitable[Response]]
ErrorBody = Callable[[ApplianceError], Response]


async def _appliance_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApplianceError)
    return openai_error(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return openai_error(NotFound(f"no route {request.method} {request.url.path}"))
    err = ApplianceError(str(exc.detail))
    err.status, err.type = exc.status_code, "invalid_request_error"
    response = openai_error(err)
    response.headers.update(exc.headers or {})  # e.g. a 405's Allow
    return response


async def _client_left(request: Request, exc: Exception) -> Response:
    # Mid-body (or dropped by conn.py's deadline): nobody to answer and nothing to log.
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return openai_error(EngineFailure("internal error; see the server log"))


async def _answer(app: App, handler: Handler, errors: ErrorBody, request: Request) -> Response:
    """A route's answer, or its refusal: counted (outcome.refused, the one place every
    route's refusals are counted) and written in its API's error shape."""
    try:
        return await handler(app, request)
    except ApplianceError as e:
        refused(app, e.code, caller_of(request.scope["state"]), e)
        return errors(e)


def people_routes(route: Callable[..., Route]) -> list[Route]:
    """People mode: signing in, a person's chats and keys, the operator's list of people (in
    open mode each answers 404 people_mode_off, but /auth/me, which says the mode)."""
    post = ["POST"]
    return [
        route("/auth/me", auth.me),
        route("/auth/signin", auth.signin, post),
        route("/auth/signout", auth.signout, post),
        route("/auth/signout-everywhere", auth.signout, post),
        route("/auth/password", auth.password, post),
        route("/auth/invite", auth.invite, post),
        route("/auth/invite/accept", auth.invite, post),
        route("/v1/chats", people_chats.collection, ["GET", "POST"]),
        route("/v1/chats/{cid}", people_chats.one, ["GET", "PUT", "PATCH", "DELETE"]),
        route("/v1/chats/{cid}/share", people_chats.share, ["POST", "DELETE"]),
        route("/v1/shared", people_chats.shared, post),
        route("/v1/me/keys", keys.collection, ["GET", "POST"]),
        route("/v1/me/keys/{kid}", keys.one, ["DELETE"]),
        route("/admin/people", people_admin.collection, ["GET", "POST"]),
        route("/admin/people/{pid}", people_admin.one, ["PATCH", "DELETE"]),
        route("/admin/people/{pid}/invite", people_admin.invite, post),
    ]


def library_routes(route: Callable[..., Route]) -> list[Route]:
    """Embeddings on the bundled embedding model (OpenAI's and Ollama's), and the office
    library chats search (404 library_off / embeddings_off when off)."""
    post = ["POST"]
    return [
        route("/api/embed", embeddings.ollama_embed, post, errors=ollama_error),
        route("/api/embeddings", embeddings.ollama_embeddings, post, errors=ollama_error),
        route("/v1/embeddings", embeddings.openai, post),
        route("/embeddings", embeddings.openai, post),
        route("/v1/library", library.collection, ["GET", "POST"]),
        route("/v1/library/{doc}", library.one, ["GET", "PUT", "DELETE"]),
        route("/admin/library", library.office, ["GET", "POST"]),
        route("/admin/library/{doc}", library.office_one, ["GET", "PUT", "DELETE"]),
    ]


def routes(app: App) -> list[BaseRoute]:
    def route(path: str, handler: Handler, methods: list[str] | None = None, errors: ErrorBody = openai_error) -> Route:
        return Route(path, partial(_answer, app, handler, errors), methods=methods)

    post = ["POST"]
    store = ResponseStore()  # previous_response_id -> the conversation, per caller
    # OpenAI's paths, each also without /v1 (the same handler) for clients configured for
    # llama-server; /completions without /v1 is llama-server's native format, as it routes it.
    openai_paths: list[tuple[str, Handler, list[str] | None]] = [
        ("/models", operator.models, None), ("/models/{model:path}", operator.model, None),
        ("/chat/completions", chat.chat, post), ("/chat/completions/input_tokens", chat.input_tokens, post),
        ("/responses", partial(responses.create, store), post),
        ("/responses/input_tokens", partial(responses.input_tokens, store), post)]
    return [
        route("/health", operator.health),
        *(route(v1 + path, handler, methods) for path, handler, methods in openai_paths for v1 in ("/v1", "")),
        route("/v1/completions", completions.completions, post),
        route("/v1/system_prompts", operator.system_prompts),
        route("/metrics", operator.prometheus),
        route("/debug/steps", operator.steps),
        # llama-server's fill-in-the-middle, tokens, native /completion, /props and /slots.
        route("/infill", llama_infill.infill, post),
        route("/tokenize", llama_tokens.tokenize, post),
        route("/detokenize", llama_tokens.detokenize, post),
        route("/completion", llama_completion.completion, post),
        route("/completions", llama_completion.completion, post),
        route("/props", llama_completion.props),
        route("/slots", llama_completion.slots),
        # Anthropic's Messages API, its errors in Anthropic's shape.
        route("/v1/messages", anthropic.create, post, errors=anthropic_error),
        route("/v1/messages/count_tokens", anthropic.count_tokens, post, errors=anthropic_error),
        # Ollama's API.
        route("/api/chat", ollama.chat, post, errors=ollama_error),
        route("/api/generate", ollama.generate, post, errors=ollama_error),
        route("/api/tags", ollama_info.tags, errors=ollama_error),
        route("/api/show", ollama_info.show, post, errors=ollama_error),
        route("/api/ps", ollama_info.ps, errors=ollama_error),
        route("/api/version", ollama_info.version, errors=ollama_error),
        *library_routes(route),
        route("/v1/sessions/{sid}", operator.session, ["GET", "DELETE"]),
        # Documents: a file's text for a chat (the page's attachments) or a script.
        route("/v1/documents/text", documents.document_text, post),
        *people_routes(route),
        route("/admin", admin.page),  # the operator's view, its JSON and the usage table (guard.py: this machine or an admin key)
        route("/admin/status", admin.status),
        route("/admin/usage.csv", admin.usage_csv),
        route("/", operator.index),
        # Under /static so that no catch-all shadows the API's 405s and 404s.
        Mount("/static", StaticFiles(directory=app.web_dir), name="web"),
    ]


def create_app(app: App) -> Starlette:
    """The app behind its front door (guard.Guard): every route sees a checked caller."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with running(app):  # lifecycle.py: the services started in order, stopped in reverse
            yield

    return Starlette(
        routes=routes(app),
        lifespan=lifespan,
        middleware=[Middleware(Guard, policy=app.guard, on_refuse=lambda reason: refused(app, reason),
                               on_limited=lambda caller, err: refused(app, None, caller, err))],
        exception_handlers={ApplianceError: _appliance_error, HTTPException: _http_error,
                            ClientDisconnect: _client_left, Exception: _unexpected},
    )
