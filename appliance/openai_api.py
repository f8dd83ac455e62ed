"""OpenAI chat-completions format: request validation and response/chunk building.

Pure functions, no I/O. Unknown fields are ignored (OpenAI clients send extras); a known
field with a wrong type or value is a BadRequest naming it.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from .errors import BadRequest, PayloadTooLarge
from .sampling import SamplingParams

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 4
MAX_STOP_CHARS = 256  # a stop string is a marker, not a document; keeps the holdback scan cheap
MAX_BODY_BYTES = 4 * 2**20  # far beyond any context this model holds (~16 KiB of text per 4k tokens)
MAX_PARTS = 64  # content parts in one message
# Long enough that ids cannot be guessed, and only characters safe in a header and a log.
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
SESSION_RULE = "the session id must be 16-128 characters of A-Z, a-z, 0-9, '_' and '-'"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: list[dict[str, str]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str | None
    session_id: str | None


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
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"'{key}' must be a number", param=key)
    if v < lo or v > hi or (lo_open and v == lo):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise BadRequest(f"'{key}' must be {bound} and <= {hi:g}, got {v}", param=key)
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
            raise PayloadTooLarge(f"the messages hold more than {max_chars} characters of text",
                                  param="messages", code="too_many_characters")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_chat_request(data: dict[str, Any], limits: ServerLimits, session_header: str | None = None) -> ChatRequest:
    messages = parse_messages(data.get("messages"), limits.max_messages, limits.max_chars)
    model = parse_model(data)

    n = _integer(data, "n")
    if n is not None and n != 1:
        raise BadRequest("only 'n': 1 is supported", param="n")
    if _bool(data, "logprobs"):
        raise BadRequest("'logprobs' is not supported", param="logprobs")

    params = parse_sampling(data, limits)
    stream, include_usage = parse_stream(data)

    session = session_header if session_header else data.get("session_id")
    # It is echoed in a response header and named in logs by digest: a safe alphabet only.
    if session is not None and not valid_session_id(session):
        raise BadRequest(SESSION_RULE, param="session_id")
    return ChatRequest(messages, params, stream, include_usage, model, session)


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
    if top_k is not None and top_k < 0:
        raise BadRequest("'top_k' must be >= 0", param="top_k")
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
