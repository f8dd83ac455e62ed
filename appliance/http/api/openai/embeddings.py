"""OpenAI's POST /v1/embeddings on the bundled embedding model (all-MiniLM-L6-v2, 384
dimensions, unit length; http/embedding.py). The request's model name is taken as it is (a
client names whatever it was set up with) and the answer names the model that made the vectors.
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import BadRequest
from appliance.http import embedding
from appliance.http.embedding import EmbedRequest
from appliance.http.intake import intake
from appliance.http.state import App


def parse_openai(data: dict[str, Any], dim: int) -> EmbedRequest:
    fmt = data.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be \"float\" or \"base64\"", param="encoding_format")
    embedding.dimensions(data, dim)
    return EmbedRequest(embedding.texts(data.get("input"), "input"), base64=fmt == "base64")


async def openai(app: App, request: Request) -> Response:
    """OpenAI's POST /v1/embeddings."""
    dim = embedding.service(app).dim
    async with intake(app, request, lambda data: parse_openai(data, dim)) as (_, req):
        vecs, tokens = await embedding.embed(app, req)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if req.base64 else v.tolist()}
            for i, v in enumerate(vecs)]
    return JSONResponse({"object": "list", "data": data, "model": embedding.service(app).model_id,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
