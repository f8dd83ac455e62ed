"""llama-server's routes: fill-in-the-middle, tokens, native /completion, /props and /slots;
its errors in OpenAI's shape, as llama-server writes them."""

from __future__ import annotations

from appliance.http.api.llama import completion, infill, tokens
from appliance.http.routing import POST, Api, Endpoint
from appliance.http.wire import openai_error

API = Api("llama", openai_error)


def routes() -> list[Endpoint]:
    return [
        API.route("/infill", infill.infill, POST),
        API.route("/tokenize", tokens.tokenize, POST),
        API.route("/detokenize", tokens.detokenize, POST),
        API.route("/completion", completion.completion, POST),
        API.route("/completions", completion.completion, POST),
        API.route("/props", completion.props),
        API.route("/slots", completion.slots),
    ]
