"""An Anthropic Messages request, checked and turned into the chat request every chat
front-end parses (openai/chat.parse_chat_request), so it takes the one path: the same
template, tools and grammar, sampling checks, limits and KV reuse.

Mapped: `system` (a string or text blocks), messages whose content is a string or blocks
(`text`; `tool_use` in assistant turns, as tool calls; `tool_result` in user turns, as tool
messages, a string or text blocks, `is_error` said in the text), `tools` (name, description,
input_schema) and `tool_choice` (auto, any, tool, none), `stop_sequences`, `temperature`,
`top_p`, `top_k`, `max_tokens` (required, as Anthropic requires it), `stream`. Accepted and
ignored: `metadata`, `cache_control` on any block (the appliance caches every prompt by
itself), `disable_parallel_tool_use`, `service_tier` (read for the lane, http/lanes.py).
Refused with a 400: images, documents, thinking and other block types, server tools.
"""

from __future__ import annotations

import json
from typing import Any

from appliance.errors import BadRequest
from appliance.http.messages import text_parts

ROLES = ("user", "assistant")


def to_chat(data: dict[str, Any], *, need_max_tokens: bool = True) -> dict[str, Any]:
    """The chat request (OpenAI's shape) this Messages request asks for."""
    max_tokens = data.get("max_tokens")
    if max_tokens is None and need_max_tokens:
        raise BadRequest("'max_tokens' is required", param="max_tokens")
    messages = _system(data.get("system")) + _messages(data.get("messages"))
    chat: dict[str, Any] = {"messages": messages}
    for name in ("temperature", "top_p", "top_k", "stream", "service_tier"):
        if name in data:
            chat[name] = data[name]
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    stops = data.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest("'stop_sequences' must be a list of strings", param="stop_sequences")
        chat["stop"] = stops
    if data.get("metadata") is not None and not isinstance(data["metadata"], dict):
        raise BadRequest("'metadata' must be an object", param="metadata")
    if "tools" in data:
        chat["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"])
        if isinstance(data["tool_choice"], dict) and data["tool_choice"].get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False
    return chat


def _text_blocks(blocks: Any, where: str) -> str:
    """A string, or a list of text blocks joined (their cache_control ignored)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise BadRequest(f"'{where}' must be a string or a list of text blocks", param=where)
    return "\n\n".join(text_parts(blocks, where, ("text",), 'a text block {"type": "text", "text": ...}'))


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = _text_blocks(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"'messages[{i}].role' must be \"user\" or \"assistant\"", param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif isinstance(content, list):
            out += _blocks(m["role"], content, i)
        else:
            raise BadRequest(f"'messages[{i}].content' must be a string or a list of blocks", param=f"messages[{i}].content")
    return out


def _blocks(role: str, blocks: list[Any], i: int) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: a user turn's tool results become tool messages
    (before its text, as they answer the calls just made); an assistant turn's tool_use
    blocks become its tool calls."""
    where = f"messages[{i}].content"
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_call(b, f"{where}[{j}]"))
        elif kind == "tool_result" and role == "user":
            results.append(_result(b, f"{where}[{j}]"))
        else:
            allowed = "text and tool_use" if role == "assistant" else "text and tool_result"
            raise BadRequest(f"'{where}[{j}]': a {role} turn may hold {allowed} blocks here; "
                             f"{str(kind)[:32]!r} is not supported", param=where)
    text = "\n\n".join(texts)
    if role == "assistant":
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _call(b: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
        raise BadRequest(f"'{where}' must be a tool_use block with a string id and name and an object input", param=where)
    return {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}


def _result(b: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(b.get("tool_use_id"), str):
        raise BadRequest(f"'{where}.tool_use_id' must be a string", param=where)
    content = b.get("content", "")
    text = _text_blocks(content, where + ".content")
    if b.get("is_error") is True:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": b["tool_use_id"], "content": text}


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list", param="tools")
    out = []
    for j, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "input_schema" not in t:
            raise BadRequest(f"'tools[{j}]' must be a tool with a name and an input_schema (server tools are not "
                             "supported)", param="tools")
        f = {"name": t.get("name"), "parameters": t["input_schema"]}
        if "description" in t:
            f["description"] = t["description"]
        out.append({"type": "function", "function": f})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", "
                     "\"name\": ...}", param="tool_choice")
