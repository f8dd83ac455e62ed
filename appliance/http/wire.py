"""What the server writes on the wire besides the APIs' own bodies: SSE data events and
comments, the event that ends a failed stream, OpenAI's error response and usage object.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from appliance.errors import ApplianceError

SSE = "text/event-stream"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Line separators that some clients split lines at (Python's str.splitlines, httpx's
# iter_lines): escaped, so an answer containing one never cuts its SSE event in two.
SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(obj: dict[str, Any] | str) -> bytes:
    """One SSE data event: a JSON object, or a ready string such as "[DONE]"."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data.translate(SEPARATORS)}\n\n".encode()


def sse_error(err: ApplianceError) -> bytes:
    """The event that ends a stream which failed after its 200: OpenAI's error body."""
    return sse(err.body())


def comment(text: str) -> bytes:
    """An SSE comment: ignored by OpenAI clients, shown by the chat page."""
    return f": {text}\n\n".encode()


def prompt_note(done: int, total: int) -> bytes:
    """A long prompt being read: `: prompt N/M`, N of its M tokens in the KV cache. The
    page's js/stream.js reads this format."""
    return comment(f"prompt {done}/{total}")


def openai_error(err: ApplianceError) -> JSONResponse:
    """OpenAI's error response, with our status and Retry-After."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# Anthropic's error types by HTTP status (its API's own table); 503 (loading, draining, no
# slot in time) is Anthropic's overloaded_error, kept at our status with Retry-After.
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error"}


def anthropic_body(err: ApplianceError) -> dict[str, Any]:
    """Anthropic's error body: {"type": "error", "error": {"type", "message"}}."""
    kind = ANTHROPIC_ERRORS.get(err.status, "invalid_request_error" if 400 <= err.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def anthropic_error(err: ApplianceError) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse(anthropic_body(err), status_code=err.status, headers=headers)


def event(name: str, obj: dict[str, Any]) -> bytes:
    """One named SSE event, as Anthropic's streams carry them (`event:` then `data:`)."""
    return b"event: " + name.encode() + b"\n" + sse(obj)
