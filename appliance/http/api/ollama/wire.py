"""Ollama's framing, shared by its generating and its model routes: errors as
{"error": "..."} (not OpenAI's), NDJSON lines, RFC 3339 timestamps, the model's entry.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from starlette.responses import JSONResponse

from appliance.errors import ApplianceError, BadRequest
from appliance.http.state import App
from appliance.http.wire import SEPARATORS

NDJSON = "application/x-ndjson"


def ollama_error(err: ApplianceError) -> JSONResponse:
    """Ollama's error shape, with our status and Retry-After."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse({"error": err.message}, status_code=err.status, headers=headers)


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line; line separators inside strings escaped (some clients split on them)."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(SEPARATORS) + "\n").encode()


def error_line(err: ApplianceError) -> bytes:
    """The line that ends a stream which failed after its 200 (NDJSON has no other way)."""
    return line({"error": err.message})


def stamp(t: float | None = None) -> str:
    """Ollama's created_at: RFC 3339 in UTC with nanoseconds."""
    ns = time.time_ns() if t is None else int(t * 1e9)
    secs, frac = divmod(ns, 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


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


def model_name(data: dict[str, Any]) -> str:
    """The request's `model` (or its older spelling `name`): required, any name will do."""
    model = data.get("model", data.get("name"))
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required", param="model")
    return model
