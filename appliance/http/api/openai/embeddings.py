"""Embeddings on the bundled embedding model (all-MiniLM-L6-v2, 384 dimensions, unit length):
OpenAI's POST /v1/embeddings, and Ollama's POST /api/embed and its older /api/embeddings.
The request's model name is taken as it is (a client names whatever it was set up with)
and the answer names the model that made the vectors.
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest, NotFound, Unavailable
from appliance.http.intake import intake
from appliance.http.state import App, Embeddings
from appliance.http.validate import boolean, text
from appliance.library.errors import EmbedBusy

MAX_INPUTS = 128  # texts a request: ~5 s of one core at 256 tokens each, bounded before it starts
MAX_INPUT_CHARS = 32_000  # a text beyond 256 tokens is cut anyway; this bounds the tokenizing


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    texts: list[str]
    base64: bool = False
    truncate: bool = True


def _texts(raw: Any, param: str) -> list[str]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise BadRequest(f"'{param}' must be a string or a non-empty array of strings", param=param)
    if len(items) > MAX_INPUTS:
        raise BadRequest(f"'{param}' may hold at most {MAX_INPUTS} texts, got {len(items)}", param=param)
    for i, item in enumerate(items):
        if isinstance(item, (int, list)):
            raise BadRequest(f"'{param}[{i}]': token arrays are not taken here (they would be another model's "
                             "tokens): send the text", param=param)
        if not isinstance(item, str):
            raise BadRequest(f"'{param}[{i}]' must be a string", param=param)
        if len(item) > MAX_INPUT_CHARS:
            raise BadRequest(f"'{param}[{i}]' has {len(item):,} characters, at most {MAX_INPUT_CHARS:,} are taken",
                             param=param)
    return [text(item, param) for item in items]


def _dimensions(data: dict[str, Any], dim: int) -> None:
    d = data.get("dimensions")
    if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d != dim):
        raise BadRequest(f"'dimensions': this model's vectors have {dim} dimensions, and cannot be shortened",
                         param="dimensions")


def parse_openai(data: dict[str, Any], dim: int) -> EmbedRequest:
    fmt = data.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be \"float\" or \"base64\"", param="encoding_format")
    _dimensions(data, dim)
    return EmbedRequest(_texts(data.get("input"), "input"), base64=fmt == "base64")


def parse_ollama(data: dict[str, Any], dim: int, key: str = "input") -> EmbedRequest:
    _dimensions(data, dim)
    return EmbedRequest(_texts(data.get(key), key), truncate=boolean(data, "truncate", True))


def _service(app: App) -> Embeddings:
    if app.embedder is None:
        raise NotFound("embeddings are off on this box (no embedding model)", code="embeddings_off")
    return app.embedder


async def _embed(app: App, req: EmbedRequest) -> tuple[np.ndarray, int]:
    service = _service(app)
    # Off the event loop: 128 texts of 32,000 characters are ~1 M word pieces to count.
    counts = await asyncio.to_thread(lambda: [service.count_tokens(t) for t in req.texts])
    if not req.truncate and max(counts) > service.max_tokens:
        raise BadRequest(f"an input has {max(counts)} tokens, more than the model's {service.max_tokens} "
                         "(send truncate: true to cut it)", param="input")
    try:
        vecs = await service.embed(req.texts)
    except EmbedBusy:
        raise Unavailable("the embedding model has too much waiting: retry shortly", code="embeddings_busy",
                          retry_after=2) from None
    except ValueError as e:  # what the service refuses of a text (a lone surrogate, its size)
        raise BadRequest(str(e), param="input") from None
    return vecs, sum(min(c, service.max_tokens) for c in counts)


async def openai(app: App, request: Request) -> Response:
    """OpenAI's POST /v1/embeddings."""
    dim = _service(app).dim
    async with intake(app, request, lambda data: parse_openai(data, dim)) as (_, req):
        vecs, tokens = await _embed(app, req)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if req.base64 else v.tolist()}
            for i, v in enumerate(vecs)]
    return JSONResponse({"object": "list", "data": data, "model": _service(app).model_id,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def ollama_embed(app: App, request: Request) -> Response:
    """Ollama's POST /api/embed: {"model", "input": text or texts} -> {"embeddings": [...]}."""
    dim = _service(app).dim
    start = time.perf_counter_ns()
    async with intake(app, request, lambda data: parse_ollama(data, dim)) as (_, req):
        vecs, tokens = await _embed(app, req)
    return JSONResponse({"model": _service(app).model_id, "embeddings": vecs.tolist(),
                         "total_duration": time.perf_counter_ns() - start, "load_duration": 0,
                         "prompt_eval_count": tokens})


async def ollama_embeddings(app: App, request: Request) -> Response:
    """Ollama's older POST /api/embeddings: {"model", "prompt"} -> {"embedding": [...]}."""
    dim = _service(app).dim
    async with intake(app, request, lambda data: parse_ollama(data, dim, "prompt")) as (_, req):
        if len(req.texts) != 1:
            raise BadRequest("'prompt' must be one string", param="prompt")
        vecs, _ = await _embed(app, req)
    return JSONResponse({"embedding": vecs[0].tolist()})
