"""Ollama's POST /api/embed and its older /api/embeddings on the bundled embedding model
(http/embedding.py, shared with OpenAI's /v1/embeddings).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest
from appliance.http import embedding
from appliance.http.embedding import EmbedRequest
from appliance.http.intake import intake
from appliance.http.state import App
from appliance.http.validate import boolean


def parse_ollama(data: dict[str, Any], dim: int, key: str = "input") -> EmbedRequest:
    embedding.dimensions(data, dim)
    return EmbedRequest(embedding.texts(data.get(key), key), truncate=boolean(data, "truncate", True))


async def embed(app: App, request: Request) -> Response:
    """Ollama's POST /api/embed: {"model", "input": text or texts} -> {"embeddings": [...]}."""
    dim = embedding.service(app).dim
    start = time.perf_counter_ns()
    async with intake(app, request, lambda data: parse_ollama(data, dim)) as (_, req):
        vecs, tokens = await embedding.embed(app, req)
    return JSONResponse({"model": embedding.service(app).model_id, "embeddings": vecs.tolist(),
                         "total_duration": time.perf_counter_ns() - start, "load_duration": 0,
                         "prompt_eval_count": tokens})


async def embeddings(app: App, request: Request) -> Response:
    """Ollama's older POST /api/embeddings: {"model", "prompt"} -> {"embedding": [...]}."""
    dim = embedding.service(app).dim
    async with intake(app, request, lambda data: parse_ollama(data, dim, "prompt")) as (_, req):
        if len(req.texts) != 1:
            raise BadRequest("'prompt' must be one string", param="prompt")
        vecs, _ = await embedding.embed(app, req)
    return JSONResponse({"embedding": vecs[0].tolist()})
