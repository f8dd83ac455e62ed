"""llama-server's /tokenize and /detokenize: text to token ids (with their pieces) and back,
bounded in count and rendered off the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.engine.engine import Engine
from appliance.errors import BadRequest, PayloadTooLarge
from appliance.http.intake import intake
from appliance.http.state import App
from appliance.http.validate import RequestBounds, boolean, check_chars, check_tokens, is_tokens, text

# Tokens one /tokenize or /detokenize request may carry. Their work is per token and holds
# the GIL (a piece each, then the JSON of the list: 1.6M tokens with pieces froze every
# stream for 5 s), so the count is bounded. 100k is ~25 of the default 4,096-token contexts,
# enough to count a long document before cutting it into prompts, and ~0.3 s of work in a
# worker; a context configured larger than that still fits whole.
MAX_TOKENS = 100_000


def check_token_count(n: int, bounds: RequestBounds, param: str) -> None:
    cap = max(MAX_TOKENS, bounds.ctx_limit)
    if n > cap:
        raise PayloadTooLarge(f"'{param}' holds {n} tokens; one request may carry at most {cap} (send it in parts)",
                              param=param, code="too_many_tokens")


def _tokenized(engine: Engine, tokens: list[int], pieces: bool) -> Response:
    """/tokenize's answer, rendered here (in a worker: a long list takes a while)."""
    if not pieces:
        return JSONResponse({"tokens": tokens})
    return JSONResponse({"tokens": [{"id": t, "piece": engine.detokenize([t])} for t in tokens]})


def _detokenized(engine: Engine, tokens: Any) -> Response:
    """/detokenize's answer: each id checked, then the text (in a worker, as _tokenized)."""
    if not is_tokens(tokens):
        raise BadRequest("'tokens' must be an array of token ids", param="tokens")
    check_tokens(tokens, engine.n_vocab, "tokens")
    return JSONResponse({"content": engine.detokenize(tokens)})


def _body(data: dict[str, Any]) -> dict[str, Any]:
    return data


async def tokenize(app: App, request: Request) -> Response:
    """llama-server's /tokenize: {"content", "parse_special" (default true), "with_pieces"}."""
    async with intake(app, request, _body) as (_, data):
        content = data.get("content", "")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string", param="content")
        check_chars(app.bounds, text(content, "content"))
        special = boolean(data, "parse_special", True)
        pieces = boolean(data, "with_pieces")
        boolean(data, "add_special")  # no BOS is ever added here: checked, then moot
        tokens = await app.engine.tokenize(content, special) if content else []
        check_token_count(len(tokens), app.bounds, "content")
        # Under the gate, so that a client cannot start more of these at once than of anything
        # else, and off the event loop, which every stream needs.
        return await asyncio.to_thread(_tokenized, app.engine, tokens, pieces)


async def detokenize(app: App, request: Request) -> Response:
    """llama-server's /detokenize: {"tokens": [ids]} -> {"content": text}."""
    async with intake(app, request, _body) as (_, data):
        tokens = data.get("tokens", [])
        if isinstance(tokens, list):
            check_token_count(len(tokens), app.bounds, "tokens")  # before any per-id work
        return await asyncio.to_thread(_detokenized, app.engine, tokens)
