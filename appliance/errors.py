"""Errors that carry their HTTP status and OpenAI error type, so one function renders them."""

from __future__ import annotations

from typing import Any


class ApplianceError(Exception):
    status = 500
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after  # seconds, sent as Retry-After

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(ApplianceError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str, *, param: str | None = "messages") -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class GrammarDeadEnd(BadRequest):
    """The answer's grammar allows no token here: a schema that can never be completed.
    Accepting one anyway would throw inside llama.cpp and abort the whole process."""

    def __init__(self) -> None:
        super().__init__("the required format allows no further token: can the schema ever be completed?",
                         code="grammar_dead_end")


class PayloadTooLarge(ApplianceError):
    status = 413
    type = "invalid_request_error"


class NotFound(ApplianceError):
    status = 404
    type = "invalid_request_error"


class QueueFull(ApplianceError):
    """The bounded queue is full: tell the client to come back soon (429)."""

    status = 429
    type = "rate_limit_error"


class Conflict(ApplianceError):
    """Two changes at once that cannot both be (409)."""

    status = 409
    type = "invalid_request_error"


class Unavailable(ApplianceError):
    """Loading, draining, or no slot within the queue timeout (503)."""

    status = 503
    type = "server_unavailable"


class EngineFailure(ApplianceError):
    status = 500
    type = "server_error"


class KVCacheFull(Exception):
    """llama_decode found no room in the KV cache (internal: the engine evicts and retries)."""


class Unauthorized(ApplianceError):
    """No API key, or one we do not know (401)."""

    status = 401
    type = "authentication_error"


class Forbidden(ApplianceError):
    """A cross-site request, or an operator-only route (403)."""

    status = 403
    type = "permission_error"


class MisdirectedRequest(ApplianceError):
    """A Host this server does not answer for: the DNS rebinding guard (421)."""

    status = 421
    type = "invalid_request_error"


class UnsupportedMediaType(ApplianceError):
    """A browser POST that is not JSON: the cross-site "simple request" guard (415)."""

    status = 415
    type = "invalid_request_error"


class UnprocessableEntity(ApplianceError):
    """Well-formed request, content we cannot use: an encrypted or broken document, no text (422)."""

    status = 422
    type = "invalid_request_error"
