"""Tool calls in the model's answer: Qwen2.5 writes each as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; these become OpenAI
`tool_calls`, whole answers and streams alike. A block that is not valid JSON naming a
function with an object of arguments (strict JSON: no NaN or Infinity) stays text: a client
gets the model's words, never a 500. CallStream is the one streamed parser every API uses:
it also takes an answer that is nothing but one call's JSON (its tags left out) as that call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def call_key(name: str, args: dict[str, Any]) -> tuple[str, str]:
    """What makes two calls the same call: the name and the arguments, key order and spacing aside."""
    return name, json.dumps(args, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def answered(messages: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The calls (call_key) whose results end a chat: the last assistant turn's tool calls,
    when only tool messages follow it. Its arguments may be JSON text or an object."""
    i = len(messages)
    while i > 0 and messages[i - 1].get("role") == "tool":
        i -= 1
    if i == len(messages) or i == 0 or messages[i - 1].get("role") != "assistant":
        return ()
    out = []
    for c in messages[i - 1].get("tool_calls") or ():
        f = c.get("function") if isinstance(c, dict) else None
        args = f.get("arguments", {}) if isinstance(f, dict) else None
        if isinstance(args, str):
            args = _json(args or "{}")
        if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(args, dict):
            out.append(call_key(f["name"], args))
    return tuple(out)


# Nesting of a call's arguments; deeper is text. They are parsed again downstream (Ollama's
# route, the client), and JSON nested near the recursion limit can parse here, fail there.
MAX_DEPTH = 64


def _call(block: str, names: frozenset[str]) -> ToolCall | None:
    """The call a block names, or None: it is then the model's text. Anything the model
    writes lands here, so every way JSON can be odd is text, never an exception."""
    obj = _json(block)
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or name not in names:  # a list or an object is no name
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode
        args = _json(args)
    if not isinstance(args, dict) or _depth(args) > MAX_DEPTH:
        return None
    try:
        # Strict: NaN, Infinity (or 1e400, read as inf) are not JSON, so a client could not
        # parse them back; such a block stays text.
        text = json.dumps(args, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None
    return ToolCall("call_" + secrets.token_hex(12), name, text)


def _json(text: str) -> Any:
    """The JSON value of `text`; None when it is not JSON or is nested past the recursion
    limit (json.loads raises RecursionError, not ValueError, for that)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (a scalar is 0), without recursing."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is None:
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        todo.extend((x, d + 1) for x in items)
    return deepest


class ToolCallParser:
    """Feed answer text as it streams; get back text to show and tool calls, each whole.
    Text that could be the start of `<tool_call>` is held back until it is decided."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._buf = ""
        self._in_call = False
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        shown: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0:
                    return "".join(shown), calls
                block, self._buf = self._buf[:end], self._buf[end + len(CLOSE):]
                self._in_call = False
                call = _call(block, self.names)
                if call is None:
                    shown.append(OPEN + block + CLOSE)  # not a call after all: the model's text
                else:
                    calls.append(call)
                    self.calls.append(call)
                    self._buf = self._buf.lstrip("\n")
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                shown.append(self._buf[:start])
                self._buf = self._buf[start + len(OPEN):]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buf, OPEN)
            shown.append(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return "".join(shown), calls

    def flush(self) -> str:
        """At the end: whatever is held back is text (an unclosed block included)."""
        rest = (OPEN + self._buf) if self._in_call else self._buf
        self._buf, self._in_call = "", False
        return rest


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_answer(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """A whole answer -> (its text without the tool-call blocks, the calls)."""
    p = ToolCallParser(names)
    shown, calls = p.feed(text)
    return (shown + p.flush()).strip() if calls else shown + p.flush(), calls


def answer_calls(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """A whole answer -> (its text, its tool calls). Besides Qwen's tagged blocks, an answer
    that is nothing but one call's JSON is that call: the 0.5B model often leaves the tags
    out (measured: "What is the weather like in Paris?" with a get_weather tool, greedy)."""
    if not names:
        return text, []
    shown, calls = split_answer(text, names)
    body = _unfenced(text.strip())
    if not calls and body.startswith("{"):
        bare, calls = split_answer(f"{OPEN}{body}{CLOSE}", names)
        if calls and not bare.strip():
            return "", calls
        return text, []
    return shown, calls


_FENCE = re.compile(r"```(?:json)?[ \t]*\n?\s*")


def _unfenced(text: str) -> str:
    """A whole answer without the Markdown fence the 0.5B model often puts around a call
    (```json ... ```: 5 of 12 first turns of bench/structured/tool-round-trips.py)."""
    m = _FENCE.match(text)
    if m is None or not text.endswith("```") or len(text) < m.end() + 3:
        return text
    return text[m.end():-3].strip()


def after_fence(s: str) -> str:
    """An answer's start without the opening ```json fence, if it has one."""
    m = _FENCE.match(s)
    return s[m.end():] if m is not None else s


def may_be_bare(s: str) -> bool:
    """Whether an answer's start (its leading blanks stripped) may still become a bare call:
    "{", or a ```json fence still being written or followed by "{"."""
    if s.startswith("{") or "```json".startswith(s):
        return True
    m = _FENCE.match(s)
    return m is not None and (m.end() == len(s) or s[m.end()] == "{")


class CallStream(Generic[T]):
    """An answer as it streams, with tool calls taken out (ToolCallParser). With tools, an
    answer that starts with "{" is held until it ends: it may be a call without its tags.
    Each piece of text comes with a payload (its tokens' logprobs), released with its text."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.parser = ToolCallParser(names) if names else None
        self.held: list[tuple[str, T]] | None = [] if names else None  # undecided: could be a bare call

    def feed(self, text: str, payload: T) -> tuple[str, list[ToolCall], list[T]]:
        """(text to show, whole calls, the payloads released with the text)."""
        if self.parser is None:
            return text, [], [payload]
        shown, calls = self.parser.feed(text)
        if self.held is None:
            return shown, calls, [payload]
        self.held.append((shown, payload))
        so_far = "".join(t for t, _ in self.held).lstrip()
        if calls or (so_far and not may_be_bare(so_far)):
            held, self.held = self.held, None  # decided: not a bare call
            return "".join(t for t, _ in held), calls, [p for _, p in held]
        return "", [], []

    def finish(self) -> tuple[str, list[ToolCall], list[T]]:
        """At the end: the held-back rest, the calls found in it, the payloads still held."""
        rest = self.parser.flush() if self.parser else ""
        if self.held is None:
            return rest, [], []
        text, calls = answer_calls("".join(t for t, _ in self.held) + rest, self.names)
        return text, calls, [p for _, p in self.held]
