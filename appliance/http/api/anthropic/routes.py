"""Anthropic's Messages API routes, their errors (the guard's refusals too) in Anthropic's shape."""

from __future__ import annotations

from appliance.http.api.anthropic import messages
from appliance.http.routing import POST, Api, Endpoint
from appliance.http.wire import anthropic_error

API = Api("anthropic", anthropic_error)


def routes() -> list[Endpoint]:
    return [
        API.route("/v1/messages", messages.create, POST),
        API.route("/v1/messages/count_tokens", messages.count_tokens, POST),
    ]
