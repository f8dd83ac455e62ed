"""An answer as Anthropic's Messages API writes it: one message object, or the stream of
named events (message_start, ping, content_block_start / _delta / _stop for each text or
tool_use block, message_delta with the stop reason and usage, message_stop; one `error`
event if something fails after the 200). Text and tool calls are told apart by the same
parser as OpenAI's chat (choices.Choice)."""

from __future__ import annotations

import json
import secrets
from typing import Any

from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, Progress
from appliance.errors import ApplianceError
from appliance.http.choices import Choice
from appliance.http.grounded import Check
from appliance.http.pipeline import Answer, Timing
from appliance.http.wire import SSE, SSE_HEADERS, anthropic_body, anthropic_error, event
from appliance.structured.tools import ToolCall


def tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": args if isinstance(args, dict) else {}}


def stop_reason(choice: Choice, done: Done) -> str:
    if choice.calls and done.finish_reason == "stop":
        return "tool_use"
    return "max_tokens" if done.finish_reason == "length" else "end_turn"


def usage(done: Done | None, prompt_tokens: int, output_tokens: int = 0) -> dict[str, Any]:
    """Anthropic counts input apart from what was read from the cache."""
    total, cached = (done.prompt_tokens, done.cached_tokens) if done else (prompt_tokens, 0)
    return {"input_tokens": total - cached, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


class MessageShape:
    media_type = SSE
    notes = True  # SSE comments: Anthropic's SDK skips them as SSE says

    def __init__(self, model: str, tool_names: frozenset[str], prompt_tokens: int, session: str,
                 check: Check | None = None) -> None:
        self.model, self.prompt_tokens = model, prompt_tokens
        # Ours, with "library": true: the sources on the message object (message_start's), and
        # checked (grounded.py) on message_delta and a whole answer's message.
        self.check = check
        self.cited = {"sources": check.sources} if check is not None else {}
        self.id = "msg_" + secrets.token_hex(12)
        self.choice = Choice(0, tool_names)
        self._headers = {"X-Session-Id": session}
        self.blocks = 0  # content blocks started so far
        self.open_text = False  # a text block is open

    def headers(self, stream: bool) -> dict[str, str]:
        return {**self._headers, **SSE_HEADERS} if stream else self._headers

    def _message(self, content: list[dict[str, Any]], reason: str | None, use: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": None, "usage": use, **self.cited}

    def start(self) -> list[bytes]:
        return [event("message_start", {"type": "message_start",
                                        "message": self._message([], None, usage(None, self.prompt_tokens))}),
                event("ping", {"type": "ping"})]

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        return []

    def _entries(self, entries: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for e in entries:
            delta = e["delta"]
            if delta.get("content"):
                if not self.open_text:
                    out.append(event("content_block_start", {"type": "content_block_start", "index": self.blocks,
                                                             "content_block": {"type": "text", "text": ""}}))
                    self.open_text = True
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.blocks,
                                                         "delta": {"type": "text_delta", "text": delta["content"]}}))
            for call in delta.get("tool_calls", []):
                out += self._close_text()
                block = tool_use(ToolCall(call["id"], call["function"]["name"], call["function"]["arguments"]))
                out.append(event("content_block_start", {"type": "content_block_start", "index": self.blocks,
                                                         "content_block": {**block, "input": {}}}))
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.blocks, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
                out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.blocks}))
                self.blocks += 1
        return out

    def _close_text(self) -> list[bytes]:
        if not self.open_text:
            return []
        self.open_text = False
        self.blocks += 1
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        return self._entries(self.choice.delta(ev))

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        entries, _ = self.choice.finish(done)
        out = self._entries(entries) + self._close_text()
        use = usage(done, self.prompt_tokens, done.completion_tokens)
        return [*out, event("message_delta", {"type": "message_delta", "usage": use, "delta": {
            "stop_reason": stop_reason(self.choice, done), "stop_sequence": None}, **self._checked()})]

    def _checked(self) -> dict[str, Any]:
        return self.check.wire(0) if self.check is not None else {}

    def close(self, ends: list[Done]) -> list[bytes]:
        return [event("message_stop", {"type": "message_stop"})]

    def error(self, err: ApplianceError) -> bytes:
        return event("error", anthropic_body(err))

    def failed(self, err: ApplianceError) -> Response:
        return anthropic_error(err)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        ((deltas, done),) = answer
        for d in deltas:
            self.choice.delta(d)
        self.choice.finish(done)
        text = "".join(self.choice.text)
        content: list[dict[str, Any]] = [{"type": "text", "text": text.strip() if self.choice.calls else text}]
        if self.choice.calls:
            content = [c for c in content if c["text"]] + [tool_use(c) for c in self.choice.calls]
        use = usage(done, self.prompt_tokens, done.completion_tokens)
        body = {**self._message(content, stop_reason(self.choice, done), use), **self._checked()}
        return JSONResponse(body, headers=self._headers)
