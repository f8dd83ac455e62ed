"""OpenAI chat messages and tools, validated into what the chat template takes (shared by
OpenAI's chat and Ollama's /api/chat). Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from appliance.errors import BadRequest, PayloadTooLarge
from appliance.http.validate import boolean, json_chars, json_text, text
from appliance.structured.grammar import tool_call_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_PARTS = 64  # content parts in one message
# A call's arguments arrive as a JSON string, outside the body's own nesting bound, and are
# written back into the prompt by json.dumps and the template's tojson, from deeper stacks:
# far below Python's ~1000 frames, so that no later step meets a RecursionError.
MAX_ARGUMENTS_DEPTH = 100


def _too_many_chars(max_chars: int, param: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"the messages and tools hold more than {max_chars} characters of text",
                           param=param, code="too_many_characters")


def _calls_chars(calls: list[dict[str, Any]]) -> int:
    return sum(json_chars(c["function"], "messages") for c in calls)


def message_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of parsed messages that reach the template: content and tool calls."""
    return sum(len(m["content"]) + _calls_chars(m.get("tool_calls", [])) for m in messages)


def text_parts(parts: list[Any], param: str, kinds: tuple[str, ...], expected: str) -> list[str]:
    """The texts of a message's content parts, each {"type": one of kinds, "text": a string}
    (chat's, the Responses API's and Anthropic's text blocks alike); any other part (an image,
    a file) is a 400 naming it and saying what was `expected`."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
            raise BadRequest(f"'{param}[{j}]' must be {expected}", param=param)
        texts.append(part["text"])
    return texts


def _content(msg: dict[str, Any], i: int) -> str:
    param = f"messages[{i}].content"
    c = msg.get("content")
    if c is None:
        if msg.get("role") == "assistant":
            return ""  # an assistant turn that only called tools
        raise BadRequest(f"'{param}' is required", param=param)
    if isinstance(c, str):
        return text(c, param)
    if isinstance(c, list):  # content parts: only text is supported
        if len(c) > MAX_PARTS:
            raise BadRequest(f"'{param}' may have at most {MAX_PARTS} parts", param=param)
        texts = text_parts(c, param, ("text",), 'a text part ({"type": "text", "text": ...}); this model reads text only')
        return text("".join(texts), param)
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
        calls.append({"type": "function", "function": {"name": text(f["name"], param),
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
    parallel = boolean(data, "parallel_tool_calls", True)
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


