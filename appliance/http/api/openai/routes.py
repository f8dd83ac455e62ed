"""OpenAI's routes and what each declares (routing.Endpoint): errors in OpenAI's shape, a key
(or a signed-in person) when keys or people mode are on."""

from __future__ import annotations

from functools import partial

from appliance.http.api.openai import chat, completions, embeddings, responses
from appliance.http.api.openai.response_store import ResponseStore
from appliance.http.routing import POST, Api, Endpoint, Handler
from appliance.http.wire import openai_error

API = Api("openai", openai_error)


def routes() -> list[Endpoint]:
    store = ResponseStore()  # previous_response_id -> the conversation, per caller
    # Each also without /v1 (the same handler) for clients configured for llama-server;
    # /completions without /v1 is llama-server's native format, as it routes it (api/llama).
    both: list[tuple[str, Handler]] = [("/chat/completions", chat.chat), ("/chat/completions/input_tokens", chat.input_tokens),
            ("/responses", partial(responses.create, store)),
            ("/responses/input_tokens", partial(responses.input_tokens, store))]
    return [
        *(API.route(v1 + path, handler, POST) for path, handler in both for v1 in ("/v1", "")),
        API.route("/v1/completions", completions.completions, POST),
        # On the bundled embedding model (404 embeddings_off without one).
        API.route("/v1/embeddings", embeddings.openai, POST),
        API.route("/embeddings", embeddings.openai, POST),
    ]
