"""The bundled embedding model as the HTTP APIs use it (OpenAI's api/openai/embeddings.py,
Ollama's api/ollama/embed.py): their texts bounded before any work, counted and embedded
off the event loop, and the service's refusals as HTTP errors.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.errors import BadRequest, NotFound, Unavailable
from appliance.http.state import App, Embeddings
from appliance.http.validate import text
from appliance.library.errors import EmbedBusy

MAX_INPUTS = 128  # texts a request: ~5 s of one core at 256 tokens each, bounded before it starts
MAX_INPUT_CHARS = 32_000  # a text beyond 256 tokens is cut anyway; this bounds the tokenizing


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    texts: list[str]
    base64: bool = False
    truncate: bool = True


def texts(raw: Any, param: str) -> list[str]:
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


def dimensions(data: dict[str, Any], dim: int) -> None:
    d = data.get("dimensions")
    if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d != dim):
        raise BadRequest(f"'dimensions': this model's vectors have {dim} dimensions, and cannot be shortened",
                         param="dimensions")


def service(app: App) -> Embeddings:
    if app.embedder is None:
        raise NotFound("embeddings are off on this box (no embedding model)", code="embeddings_off")
    return app.embedder


async def embed(app: App, req: EmbedRequest) -> tuple[np.ndarray, int]:
    """The vectors, and the tokens they took (each text's, cut at the model's limit)."""
    embedder = service(app)
    # Off the event loop: 128 texts of 32,000 characters are ~1 M word pieces to count.
    counts = await asyncio.to_thread(lambda: [embedder.count_tokens(t) for t in req.texts])
    if not req.truncate and max(counts) > embedder.max_tokens:
        raise BadRequest(f"an input has {max(counts)} tokens, more than the model's {embedder.max_tokens} "
                         "(send truncate: true to cut it)", param="input")
    try:
        vecs = await embedder.embed(req.texts)
    except EmbedBusy:
        raise Unavailable("the embedding model has too much waiting: retry shortly", code="embeddings_busy",
                          retry_after=2) from None
    except ValueError as e:  # what the service refuses of a text (a lone surrogate, its size)
        raise BadRequest(str(e), param="input") from None
    return vecs, sum(min(c, embedder.max_tokens) for c in counts)
