"""The Responses API's answer: output items (an assistant message of output_text, function
calls) built as the text streams, written as the SDK's typed events (response.created ...
response.completed, each with its sequence_number) or as one response object.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from starlette.responses import JSONResponse, Response

from appliance.engine.events import Delta, Done, Progress
from appliance.errors import ApplianceError
from appliance.http import wire
from appliance.http.api.openai.response_store import ResponseStore
from appliance.http.api.openai.responses_input import ResponsesRequest
from appliance.http.grounded import Check
from appliance.http.pipeline import Answer, Timing
from appliance.http.state import App
from appliance.http.telemetry import Meter, timings
from appliance.structured.tools import CallStream, ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_usage(done: Done | None) -> dict[str, Any] | None:
    if done is None:
        return None
    return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": done.cached_tokens},
            "output_tokens": done.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def call_item(call: ToolCall) -> dict[str, Any]:
    return {"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": call.id,
            "name": call.name, "arguments": call.arguments}


class ResponseShape:
    """One response: its output items as they close, its events numbered in order."""

    media_type = wire.SSE
    notes = True  # SSE comments: the SDK's decoder skips them

    def __init__(self, app: App, req: ResponsesRequest, store: ResponseStore | None, client: str, session: str,
                 check: Check | None = None) -> None:
        self.model, self.req, self.store, self.client, self.session = app.model_id, req, store, client, session
        # Ours, with "library": true: the sources on the response object, so in every event
        # that carries it; once it is done, checked (grounded.py), with the grounding.
        self.check = check
        self.cited = {"sources": check.sources} if check is not None else {}
        self.id, self.created = new_id("resp"), int(time.time())
        self.calls: CallStream[None] = CallStream(req.tool_names)
        self.output: list[dict[str, Any]] = []
        self.text: dict[str, Any] | None = None  # the open message item, while text streams into it
        self.seq = 0
        self.meter = Meter(req.telemetry)

    # -- the response object and its events ---------------------------------------------------
    def body(self, status: str, done: Done | None = None) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        p, echo = self.req.params, self.req.echo
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": list(self.output), "error": None, "incomplete_details": incomplete,
                "instructions": echo.get("instructions"), "max_output_tokens": p.max_tokens,
                "parallel_tool_calls": echo.get("parallel_tool_calls", True), "previous_response_id": self.req.previous,
                "temperature": p.temperature, "top_p": p.top_p, "tool_choice": echo.get("tool_choice", "auto"),
                "tools": echo.get("tools", []), "text": echo.get("text", {"format": {"type": "text"}}),
                "store": self.store is not None, "metadata": echo.get("metadata", {}), "usage": response_usage(done),
                **(self.check.wire(0) if self.check is not None and done is not None else self.cited)}

    def event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\n".encode() + wire.sse(obj)

    # -- output items -------------------------------------------------------------------------
    def _open_text(self) -> list[bytes]:
        if self.text is not None:
            return []
        self.text = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                     "content": []}
        where = {"output_index": len(self.output), "item_id": self.text["id"]}
        return [self.event("response.output_item.added", output_index=len(self.output), item=dict(self.text)),
                self.event("response.content_part.added", **where, content_index=0, part=self._part(""))]

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        item, self.text = self.text, None
        text = "".join(item.pop("parts", []))
        item.update(status="completed", content=[self._part(text)])
        where = {"output_index": len(self.output), "item_id": item["id"]}
        self.output.append(item)
        return [self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                self.event("response.content_part.done", **where, content_index=0, part=self._part(text)),
                self.event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _call(self, call: ToolCall) -> list[bytes]:
        out = self._close_text()
        item = call_item(call)
        where = {"output_index": len(self.output), "item_id": item["id"]}
        self.output.append(item)
        return [*out, self.event("response.output_item.added", output_index=where["output_index"],
                                 item={**item, "arguments": "", "status": "in_progress"}),
                self.event("response.function_call_arguments.delta", **where, delta=call.arguments),
                self.event("response.function_call_arguments.done", **where, arguments=call.arguments),
                self.event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _feed(self, shown: str, calls: list[ToolCall], timed: dict[str, Any] | None = None) -> list[bytes]:
        out = []
        if shown:
            out += self._open_text()
            assert self.text is not None
            self.text.setdefault("parts", []).append(shown)
            out.append(self.event("response.output_text.delta", output_index=len(self.output),
                                  item_id=self.text["id"], content_index=0, delta=shown, logprobs=[], **(timed or {})))
        for call in calls:
            out += self._call(call)
        return out

    def _finish(self, done: Done) -> tuple[list[bytes], str]:
        rest, calls, _ = self.calls.finish()
        out = [*self._feed(rest, calls), *self._close_text()]
        status = "incomplete" if done.finish_reason == "length" else "completed"
        self._remember()
        return out, status

    def _remember(self) -> None:
        """The conversation with this answer in it, for a later previous_response_id."""
        if self.store is None:
            return
        text = "".join(c["text"] for item in self.output if item["type"] == "message" for c in item["content"])
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.output if i["type"] == "function_call"]
        answer: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            answer["tool_calls"] = calls
        self.store.put(self.client, self.id, self.session, json.loads(json.dumps([*self.req.raw, answer])))

    # -- the Shape ----------------------------------------------------------------------------
    def headers(self, stream: bool) -> dict[str, str]:
        return wire.SSE_HEADERS if stream else {}

    def start(self) -> list[bytes]:
        return [self.event("response.created", response=self.body("in_progress")),
                self.event("response.in_progress", response=self.body("in_progress"))]

    def progress(self, i: int, ev: Progress) -> list[bytes]:
        # llama-server's form: a response.in_progress event carrying the prompt_progress.
        asked = self.meter.progress(i, ev)
        return [self.event("response.in_progress", response=self.body("in_progress"), **asked)] if asked else []

    def delta(self, i: int, ev: Delta) -> list[bytes]:
        shown, calls, _ = self.calls.feed(ev.text, None)
        return self._feed(shown, calls, self.meter.delta(i, ev))

    async def end(self, i: int, done: Done, timing: Timing) -> list[bytes]:
        out, status = self._finish(done)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        # llama-server's timings end the stream, as they end chat's and completions'.
        return [*out, self.event(kind, response=self.body(status, done), timings=timings(done, timing))]

    def close(self, ends: list[Done]) -> list[bytes]:
        return []

    def error(self, err: ApplianceError) -> bytes:
        # The 200 is sent: one error event, then the stream closes (the project's convention).
        e = err.body()["error"]
        return self.event("error", code=e.get("code") or e.get("type"), message=e["message"], param=e.get("param"))

    def failed(self, err: ApplianceError) -> Response:
        return wire.openai_error(err)

    async def whole(self, answer: Answer, timing: Timing) -> Response:
        [(deltas, done)] = answer
        for d in deltas:
            self.delta(0, d)
        _, status = self._finish(done)
        return JSONResponse(self.body(status, done))
