"""Ollama's routes, their errors (the guard's refusals too) in Ollama's shape, {"error": "..."}."""

from __future__ import annotations

from appliance.http.api.ollama import embed, generate, info
from appliance.http.api.ollama.wire import ollama_error
from appliance.http.routing import POST, Api, Endpoint

API = Api("ollama", ollama_error)


def routes() -> list[Endpoint]:
    return [
        API.route("/api/chat", generate.chat, POST),
        API.route("/api/generate", generate.generate, POST),
        API.route("/api/tags", info.tags),
        API.route("/api/show", info.show, POST),
        API.route("/api/ps", info.ps),
        API.route("/api/version", info.version),
        # On the bundled embedding model (404 without one).
        API.route("/api/embed", embed.embed, POST),
        API.route("/api/embeddings", embed.embeddings, POST),
    ]
