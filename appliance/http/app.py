"""The Starlette app: the routes of every front-end, the lifespan that starts the engine,
and the exception handlers that turn errors into OpenAI's error bodies.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from appliance.errors import ApplianceError, EngineFailure, NotFound
from appliance.http.api.anthropic import routes as anthropic
from appliance.http.api.appliance import routes as appliance
from appliance.http.api.llama import routes as llama
from appliance.http.api.ollama import routes as ollama
from appliance.http.api.openai import routes as openai
from appliance.http.api.people import routes as people
from appliance.http.guard import Guard, caller_of
from appliance.http.lifecycle import running
from appliance.http.outcome import refused
from appliance.http.routing import DeclaredRoute, ErrorBody, Handler
from appliance.http.state import App
from appliance.http.wire import openai_error

log = logging.getLogger(__name__)


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


def routes(app: App) -> list[BaseRoute]:
    """Every API folder's routes (each declares its API, access and body: routing.py), bound
    to the App, and the page's static files."""
    endpoints = [*appliance.routes(), *openai.routes(), *llama.routes(), *anthropic.routes(), *ollama.routes(),
                 *people.routes()]
    bound: list[BaseRoute] = [
        DeclaredRoute(e.path, partial(_answer, app, e.handler, e.rule.api.error), methods=e.methods, rule=e.rule)
        for e in endpoints]
    return [*bound, appliance.static(app.web_dir)]


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
