"""Ollama's routes that generate nothing: /api/tags, /api/ps, /api/show, /api/version."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.engine import EngineState
from appliance.http.api.ollama.wire import details, model_entry, model_name, stamp
from appliance.http.intake import intake
from appliance.http.state import App

# The Ollama release whose /api shapes these routes follow; some tools check it.
VERSION = "0.12.11"
FAR_FUTURE = "9999-12-31T23:59:59Z"  # expires_at of a model that is never unloaded


async def tags(app: App, request: Request) -> Response:
    return JSONResponse({"models": [model_entry(app)]})


async def ps(app: App, request: Request) -> Response:
    if app.engine.state is not EngineState.READY:
        return JSONResponse({"models": []})
    entry = {**model_entry(app), "expires_at": FAR_FUTURE, "size_vram": 0, "context_length": app.bounds.ctx_limit}
    del entry["modified_at"]
    return JSONResponse({"models": [entry]})


def _named(data: dict[str, Any]) -> str:
    return model_name(data)  # any name: this server has one model


async def show(app: App, request: Request) -> Response:
    async with intake(app, request, _named):
        pass
    ctx = app.bounds.ctx_limit
    # Tool calls go through the model's chat template (Qwen2.5's has a tools section).
    capabilities = ["completion", "tools"] + (["insert"] if app.engine.fim_tokens else [])
    return JSONResponse({
        "license": "", "modelfile": f"FROM {app.model_id}\nPARAMETER num_ctx {ctx}\n",
        "parameters": f"num_ctx                        {ctx}", "template": "",
        "details": details(), "model_info": {"general.context_length": ctx},
        "capabilities": capabilities, "modified_at": stamp(app.created),
    })


async def version(app: App, request: Request) -> Response:
    return JSONResponse({"version": VERSION})
