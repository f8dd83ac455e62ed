"""The Responses API's request (POST /v1/responses) in chat's terms: input text or items as
chat messages (function calls and their outputs included), instructions as a system
message, flat function tools, text.format as a grammar. Pure functions, no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from appliance.errors import BadRequest
from appliance.http.api.openai.formats import parse_response_format
from appliance.http.messages import message_chars, parse_messages, parse_tools, text_parts
from appliance.http.telemetry import Telemetry, parse_telemetry
from appliance.http.validate import RequestBounds, boolean, parse_model, sampling_as
from appliance.sampling import SamplingParams

PART_TYPES = ("input_text", "output_text", "text")
ECHOED = ("instructions", "tools", "tool_choice", "text", "metadata", "parallel_tool_calls")  # the response repeats them
MAX_ITEMS = 2048  # input items: at most as many as messages


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    raw: list[dict[str, Any]]  # the conversation as chat messages, unparsed, without instructions (they do not carry over)
    messages: list[dict[str, Any]]  # parsed for the template, instructions first
    params: SamplingParams
    stream: bool
    store: bool
    model: str | None
    previous: str | None  # previous_response_id
    tools: list[dict[str, Any]] | None = None
    tool_names: frozenset[str] = frozenset()
    echo: dict[str, Any] = dataclasses.field(default_factory=dict)  # request fields the response repeats
    telemetry: Telemetry = Telemetry()  # llama-server's timings_per_token, return_progress


# -- input items -> chat messages ------------------------------------------------------------
def _content(raw: Any, param: str) -> str | list[dict[str, Any]]:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise BadRequest(f"'{param}' must be a string or a list of text parts", param=param)
    texts = text_parts(raw, param, PART_TYPES, 'a text part ({"type": "input_text", "text": ...}); this model reads text only')
    return [{"type": "text", "text": t} for t in texts]


def _call(item: dict[str, Any], param: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str) \
            or not isinstance(item.get("arguments", "{}"), str):
        raise BadRequest(f"'{param}' must have a 'call_id', a 'name' and 'arguments' (a JSON string)", param=param)
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}


def input_messages(raw: Any) -> list[dict[str, Any]]:
    """`input` as chat messages (validated by parse_messages afterwards): a string is one user
    turn; function_call items join the assistant turn before them, and function_call_output
    items become tool messages."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
        raise BadRequest(f"'input' must be a string or a list of at most {MAX_ITEMS} items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        param = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if not isinstance(item, dict) or kind not in ("message", "function_call", "function_call_output"):
            raise BadRequest(f"'{param}' must be a message, function_call or function_call_output item", param=param)
        if kind == "message":
            out.append({"role": item.get("role"), "content": _content(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            if not (out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None):
                out.append({"role": "assistant", "content": None, "tool_calls": []})
            out[-1]["tool_calls"].append(_call(item, param))
        else:
            output = item.get("output")
            if not isinstance(output, str):
                raise BadRequest(f"'{param}.output' must be a string", param=param)
            out.append({"role": "tool", "content": output})
    return out


# -- tools and text.format -------------------------------------------------------------------
def chat_tools(data: dict[str, Any]) -> dict[str, Any]:
    """The Responses API's flat function tools and tool_choice in chat's nested shape."""
    raw, choice = data.get("tools"), data.get("tool_choice")
    out: dict[str, Any] = {"parallel_tool_calls": data.get("parallel_tool_calls", True)}
    if raw is not None:
        if not isinstance(raw, list):
            raise BadRequest("'tools' must be a list of function tools", param="tools")
        for j, tool in enumerate(raw):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise BadRequest(f"'tools[{j}]' must be a function tool ({{\"type\": \"function\", \"name\": ...}}); "
                                 "built-in tools are not available here", param="tools")
        out["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                          if t.get(k) is not None}} for t in raw]
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    return out


def text_format(data: dict[str, Any]) -> str | None:
    """text.format -> the grammar the answer must follow (chat's response_format path)."""
    text = data.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("'text' must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("'text.format' must be an object with a 'type'", param="text.format")
    if fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema", {})}}
    try:
        return parse_response_format({"response_format": fmt})
    except BadRequest as e:
        raise BadRequest(e.message.replace("'response_format", "'text.format"), param="text.format") from None


# -- the request -----------------------------------------------------------------------------
def parse_responses_request(data: dict[str, Any], bounds: RequestBounds,
                            prior: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", param="instructions")
    if data.get("input") is None:
        raise BadRequest("'input' is required", param="input")
    raw = [*(prior or []), *input_messages(data["input"])]
    system = [{"role": "system", "content": instructions}] if instructions else []
    messages = parse_messages([*system, *raw], bounds.max_messages, bounds.max_chars)
    tools, tool_names, forced = parse_tools(chat_tools(data), bounds.max_chars, message_chars(messages))
    sampling = {k: data[k] for k in ("max_output_tokens", "temperature", "top_p") if data.get(k) is not None}
    params = dataclasses.replace(sampling_as(sampling, bounds, {"max_output_tokens": "max_tokens"}),
                                 grammar=forced or text_format(data))
    echo: dict[str, Any] = {k: data[k] for k in ECHOED if k in data}
    return ResponsesRequest(raw, messages, params, boolean(data, "stream"), boolean(data, "store", True),
                            parse_model(data), parse_previous(data), tools, tool_names, echo, parse_telemetry(data))


def parse_previous(data: dict[str, Any]) -> str | None:
    prev = data.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or len(prev) > 128):
        raise BadRequest("'previous_response_id' must be a response id", param="previous_response_id")
    return prev
