"""OpenAI chat-completions format: request validation and response/chunk building.

Pure functions, no I/O. Unknown fields are ignored (OpenAI clients send extras); a known
field with a wrong type or value is a BadRequest naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from appliance.errors import BadRequest, PayloadTooLarge
from appliance.sampling import SamplingParams
from appliance.structured.grammar import JSON_OBJECT, schema_grammar, tool_call_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 8  # choices per request: each is a sequence in the batch
MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_STOP = 4
MAX_STOP_CHARS = 256  # a stop string is a marker, not a document; keeps the holdback scan cheap
MAX_BODY_BYTES = 4 * 2**20  # far beyond any context this model holds (~16 KiB of text per 4k tokens)
MAX_PARTS = 64  # content parts in one message
# A call's arguments arrive as a JSON string, outside the body's own nesting bound, and are
# written back into the prompt by json.dumps and the template's tojson, from deeper stacks:
# far below Python's ~1000 frames, so that no later step meets a RecursionError.
MAX_ARGUMENTS_DEPTH = 100
# llama.cpp takes top_k as a C int (ctypes would wrap a larger one, 2**32 + 1 becoming 1),
# while the speculative path reads it whole: the C int range keeps the two the same. Any
# value past the vocabulary (~152k) already means every token, so nothing is lost.
MAX_TOP_K = 2**31 - 1
# Long enough that ids cannot be guessed, and only characters safe in a header and a log.
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
SESSION_RULE = "the session id must be 16-128 characters of A-Z, a-z, 0-9, '_' and '-'"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str | None
    session_id: str | None
    n: int = 1
    tools: list[dict[str, Any]] | None = None  # rendered by the chat template
    tool_names: frozenset[str] = frozenset()  # non-empty: the answer is parsed for tool calls


@dataclass(frozen=True, slots=True)
class ServerLimits:
    default_max_tokens: int
    max_tokens_limit: int  # larger requests are capped to this
    ctx_limit: int  # a max_tokens beyond the context itself is an error, not a cap
    max_messages: int = 2048  # messages in one request
    max_chars: int = 1_000_000  # characters of message text in one request


def precheck(raw: bytes, max_messages: int) -> None:
    """Refuse a body with far too many messages before parsing it. Parsing holds the GIL (a
    4 MiB body of empty messages takes ~70 ms), which would stall the engine thread's steps.
    Every message has a "role" key, and that exact byte string can only be a JSON string
    equal to "role" (a quote inside a string is escaped), so its count is at least the number
    of messages; twice the cap leaves room for "role" elsewhere in a body. A body that spells
    the key with escapes is still refused, after one parse."""
    if raw.count(b'"role"') > 2 * max_messages:
        raise BadRequest(f"a request may carry at most {max_messages} messages", param="messages",
                         code="too_many_messages")


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _number(data: dict[str, Any], key: str, lo: float, hi: float, default: float,
            lo_open: bool = False) -> float:
    v = data.get(key)
    if v is None:
        return default
    # An int is compared as it is: JSON integers are unbounded, and a float of 1e400 overflows.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise BadRequest(f"'{key}' must be a number", param=key)
    if v < lo or v > hi or (lo_open and v == lo):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        shown = str(v) if isinstance(v, float) or abs(v) < 10**32 else "an integer of more than 32 digits"
        raise BadRequest(f"'{key}' must be {bound} and <= {hi:g}, got {shown}", param=key)
    return float(v)


def _integer(data: dict[str, Any], key: str) -> int | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{key}' must be an integer", param=key)
    return v


def _bool(data: dict[str, Any], key: str, default: bool = False) -> bool:
    v = data.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be true or false", param=key)
    return v


def _text(value: str, param: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer can encode: a 400 here."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"'{param}' is not valid Unicode text (it holds a lone surrogate)", param=param) from None
    return value


def json_text(value: Any, param: str) -> Any:
    """A schema, tool definition or call's arguments reach a grammar or the prompt as JSON
    text: a lone surrogate anywhere in it is a 400, as in message text (found by hypothesis)."""
    json_chars(value, param)
    return value


def json_chars(value: Any, param: str) -> int:
    """json_text's check, and how many characters of prompt the value becomes."""
    return len(_text(json.dumps(value, ensure_ascii=False), param))


def _too_many_chars(max_chars: int, param: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"the messages and tools hold more than {max_chars} characters of text",
                           param=param, code="too_many_characters")


def _calls_chars(calls: list[dict[str, Any]]) -> int:
    return sum(json_chars(c["function"], "messages") for c in calls)


def message_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of parsed messages that reach the template: content and tool calls."""
    return sum(len(m["content"]) + _calls_chars(m.get("tool_calls", [])) for m in messages)


def _content(msg: dict[str, Any], i: int) -> str:
    param = f"messages[{i}].content"
    c = msg.get("content")
    if c is None:
        if msg.get("role") == "assistant":
            return ""  # an assistant turn that only called tools
        raise BadRequest(f"'{param}' is required", param=param)
    if isinstance(c, str):
        return _text(c, param)
    if isinstance(c, list):  # content parts: only text is supported
        if len(c) > MAX_PARTS:
            raise BadRequest(f"'{param}' may have at most {MAX_PARTS} parts", param=param)
        texts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"'{param}[{j}]' must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
                                 "this model reads text only", param=param)
            texts.append(part["text"])
        return _text("".join(texts), param)
    raise BadRequest(f"'{param}' must be a string or a list of text parts", param=param)


def parse_messages(raw: Any, max_messages: int = 2048, max_chars: int = 1_000_000) -> list[dict[str, str]]:
    """Validate messages; the caps are checked before any content is looked at in bulk."""
    if raw is None:
        raise BadRequest("'messages' is required", param="messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    if len(raw) > max_messages:
        raise BadRequest(f"a request may carry at most {max_messages} messages, got {len(raw)}",
                         param="messages", code="too_many_messages")
    out = []
    chars = 0
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise BadRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        role = msg.get("role")
        if role not in ROLES:
            shown = repr(role[:20]) if isinstance(role, str) else type(role).__name__
            raise BadRequest(f"'messages[{i}].role' must be one of {', '.join(ROLES)}, got {shown}",
                             param=f"messages[{i}].role")
        content = _content(msg, i)
        chars += len(content)
        if chars > max_chars:
            raise _too_many_chars(max_chars, "messages")
        m: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        if role == "assistant" and msg.get("tool_calls"):
            m["tool_calls"] = _tool_calls(msg["tool_calls"], i)
            chars += _calls_chars(m["tool_calls"])  # templated and tokenized as content is
            if chars > max_chars:
                raise _too_many_chars(max_chars, "messages")
        out.append(m)
    return out


def _tool_calls(raw: Any, i: int) -> list[dict[str, Any]]:
    """An assistant turn's tool calls, as the chat template wants them (arguments as an object)."""
    param = f"messages[{i}].tool_calls"
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise BadRequest(f"'{param}' must be a list of at most {MAX_TOOLS} calls", param=param)
    calls = []
    for j, call in enumerate(raw):
        f = call.get("function") if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments", "{}"), str):
            raise BadRequest(f"'{param}[{j}]' must be {{\"type\": \"function\", \"function\": "
                             "{\"name\": ..., \"arguments\": \"<JSON>\"}}", param=param)
        try:
            args = json.loads(f.get("arguments") or "{}")
        except ValueError:
            raise BadRequest(f"'{param}[{j}].function.arguments' is not valid JSON", param=param) from None
        except RecursionError:  # a string inside the body: the body's own nesting bound never saw it
            raise BadRequest(f"'{param}[{j}].function.arguments' is nested too deeply", param=param) from None
        if not isinstance(args, dict):
            raise BadRequest(f"'{param}[{j}].function.arguments' must be a JSON object", param=param)
        if _nesting(args) > MAX_ARGUMENTS_DEPTH:
            raise BadRequest(f"'{param}[{j}].function.arguments' is nested more than {MAX_ARGUMENTS_DEPTH} levels deep",
                             param=param)
        calls.append({"type": "function", "function": {"name": _text(f["name"], param),
                                                        "arguments": json_text(args, param)}})
    return calls


def _nesting(value: Any) -> int:
    """How many levels of objects and arrays deep a JSON value goes (without recursing)."""
    depth, level = 0, [value]
    while containers := [v for v in level if isinstance(v, (dict, list))]:
        depth += 1
        level = [x for v in containers for x in (v.values() if isinstance(v, dict) else v)]
    return depth


def parse_tools(data: dict[str, Any], max_chars: int | None = None,
                used: int = 0) -> tuple[list[dict[str, Any]] | None, frozenset[str], str | None]:
    """tools + tool_choice -> (tools for the template, names to parse calls of, a grammar
    forcing calls or None). tool_choice "none" renders no tools at all. The definitions count
    toward max_chars with the `used` characters of messages: the template renders them too."""
    raw, choice = data.get("tools"), data.get("tool_choice")
    if raw is None:
        if choice is not None and choice != "none":
            raise BadRequest("'tool_choice' needs 'tools'", param="tool_choice")
        return None, frozenset(), None
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise BadRequest(f"'tools' must be a list of at most {MAX_TOOLS} tools", param="tools")
    functions = []
    chars = used
    for j, tool in enumerate(raw):
        f = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not _TOOL_NAME.fullmatch(f["name"]):
            raise BadRequest(f"'tools[{j}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} "
                             "with a name of 1-64 characters of A-Z a-z 0-9 _ -", param="tools")
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise BadRequest(f"'tools[{j}].function.parameters' must be a JSON schema object", param="tools")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise BadRequest(f"'tools[{j}].function.description' must be a string", param="tools")
        chars += json_chars(f, f"tools[{j}]")
        if max_chars is not None and chars > max_chars:  # before any grammar is built from them
            raise _too_many_chars(max_chars, "tools")
        functions.append(f)
    if not functions and choice not in (None, "none", "auto"):  # nothing to call: never a silent "no tools"
        raise BadRequest("'tool_choice' needs at least one tool in 'tools'", param="tool_choice")
    if not functions or choice == "none":
        return None, frozenset(), None
    names = frozenset(f["name"] for f in functions)
    parallel = _bool(data, "parallel_tool_calls", True)
    template_tools = [{"type": "function", "function": f} for f in functions]
    if choice is None or choice == "auto":
        return template_tools, names, None
    if choice == "required":
        return template_tools, names, tool_call_grammar(functions, parallel)
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(choice.get("function"), dict) else None
    if not isinstance(named, str):
        raise BadRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
    if named not in names:
        raise BadRequest(f"'tool_choice' names the function {named[:64]!r}, which is not in 'tools'", param="tool_choice")
    return template_tools, names, tool_call_grammar([f for f in functions if f["name"] == named], False)


def parse_response_format(data: dict[str, Any]) -> str | None:
    """response_format -> the grammar the answer must follow, or None for free text."""
    rf = data.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise BadRequest("'response_format' must be an object with a 'type'", param="response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), (dict, bool)):
            raise BadRequest("'response_format.json_schema' must be an object with a 'schema'",
                             param="response_format.json_schema")
        return schema_grammar(json_text(js.get("schema", {}), "response_format.json_schema.schema"))
    raise BadRequest(f"'response_format.type' must be text, json_object or json_schema, got {kind[:32]!r}",
                     param="response_format.type")


def parse_choices(data: dict[str, Any]) -> tuple[int, int | None]:
    """n, and logprobs -> how many alternatives to report per token (None: no logprobs)."""
    n = _integer(data, "n")
    if n is not None and not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be between 1 and {MAX_N}", param="n")
    top = _integer(data, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if _bool(data, "logprobs"):
        return n or 1, top or 0
    if top is not None:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return n or 1, None


def parse_chat_request(data: dict[str, Any], limits: ServerLimits, session_header: str | None = None) -> ChatRequest:
    messages = parse_messages(data.get("messages"), limits.max_messages, limits.max_chars)
    model = parse_model(data)

    n, logprobs = parse_choices(data)
    tools, tool_names, forced = parse_tools(data, limits.max_chars, message_chars(messages))
    grammar = forced or parse_response_format(data)
    params = dataclasses.replace(parse_sampling(data, limits), grammar=grammar, logprobs=logprobs)
    stream, include_usage = parse_stream(data)

    session = session_header if session_header else data.get("session_id")
    # It is echoed in a response header and named in logs by digest: a safe alphabet only.
    if session is not None and not valid_session_id(session):
        raise BadRequest(SESSION_RULE, param="session_id")
    return ChatRequest(messages, params, stream, include_usage, model, session, n, tools, tool_names)


def parse_model(data: dict[str, Any]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    return model


def parse_max_tokens(data: dict[str, Any], limits: ServerLimits) -> int:
    max_tokens = _integer(data, "max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, key = _integer(data, "max_tokens"), "max_tokens"
    if max_tokens is None:
        max_tokens = limits.default_max_tokens
    elif max_tokens <= 0:
        raise BadRequest(f"'{key}' must be >= 1, got {max_tokens}", param=key)
    elif max_tokens > limits.ctx_limit:
        raise BadRequest(f"'{key}' is {max_tokens}, but a conversation here holds at most "
                         f"{limits.ctx_limit} tokens", param=key)
    return min(max_tokens, limits.max_tokens_limit)


def parse_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise BadRequest(f"'stop' must be a string or a list of at most {MAX_STOP} strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"each stop string may have at most {MAX_STOP_CHARS} characters", param="stop")
    for s in stops:
        _text(s, "stop")
    return stops


def parse_sampling(data: dict[str, Any], limits: ServerLimits) -> SamplingParams:
    """The sampling fields chat and text completions share, by their OpenAI names (plus
    llama.cpp's top_k, min_p, repeat_penalty and repeat_last_n, -1 = the whole context)."""
    seed = _integer(data, "seed")
    top_k = _integer(data, "top_k")
    if top_k is not None and not 0 <= top_k <= MAX_TOP_K:
        raise BadRequest(f"'top_k' must be between 0 and {MAX_TOP_K}", param="top_k")
    last_n = _integer(data, "repeat_last_n")
    if last_n == -1:
        last_n = limits.ctx_limit
    elif last_n is not None and not 0 <= last_n <= limits.ctx_limit:
        raise BadRequest(f"'repeat_last_n' must be -1 or between 0 and {limits.ctx_limit}", param="repeat_last_n")
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=parse_max_tokens(data, limits),
        temperature=_number(data, "temperature", 0.0, 2.0, defaults.temperature),
        top_p=_number(data, "top_p", 0.0, 1.0, defaults.top_p, lo_open=True),
        top_k=defaults.top_k if top_k is None else top_k,
        min_p=_number(data, "min_p", 0.0, 1.0, defaults.min_p),
        repeat_penalty=_number(data, "repeat_penalty", 0.0, 10.0, defaults.repeat_penalty, lo_open=True),
        presence_penalty=_number(data, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(data, "frequency_penalty", -2.0, 2.0, 0.0),
        penalty_last_n=defaults.penalty_last_n if last_n is None else last_n,
        seed=seed,
        stop=parse_stop(data.get("stop")),
    )


def parse_stream(data: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _bool(data, "stream")
    opts = data.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        include_usage = _bool(opts, "include_usage")
    return stream, include_usage


def valid_session_id(session: Any) -> bool:
    return isinstance(session, str) and _SESSION_RE.fullmatch(session) is not None


# -- responses -------------------------------------------------------------------------
def new_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def new_session_id() -> str:
    return secrets.token_hex(16)  # 128 random bits


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chunk(cid: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
          **extra: Any) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        **extra,
    }


def chunks(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A chunk carrying ready `choices` entries (choices.py), for n >= 1 and tool calls."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}


def completion_of(cid: str, created: int, model: str, choices: list[dict[str, Any]], use: dict[str, Any],
                  **extra: Any) -> dict[str, Any]:
    """A whole chat completion from ready `choices` entries (choices.py)."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": use, **extra}


def usage_chunk(cid: str, created: int, model: str, use: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": use}


def completion(cid: str, created: int, model: str, text: str, finish_reason: str,
               use: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": use,
        **extra,
    }


def models_list(model_id: str, created: int | None = None) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": model_id, "object": "model", "created": created or int(time.time()), "owned_by": "appliance"}]}


# Line separators that some clients split lines at (Python's str.splitlines, httpx's
# iter_lines): escaped, so an answer containing one never cuts its SSE event in two.
_SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data.translate(_SEPARATORS)}\n\n".encode()
