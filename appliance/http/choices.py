"""One choice of a chat answer as OpenAI shapes it: text deltas, tool calls found in the
text (tools.CallStream, with its untagged-call rescue), token logprobs, and how it finished. Used for streamed chunks and for the
whole message alike; pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.engine.events import Delta, Done, TokenLogprob
from appliance.structured.tools import CallStream, ToolCall


def _entry(token: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(token)}


def logprobs_content(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content`: each token with its log-probability and alternatives."""
    return [{**_entry(e.token, e.logprob), "top_logprobs": [_entry(t, lp) for t, lp in e.top]} for e in entries]


@dataclass(slots=True)
class Choice:
    index: int
    tool_names: frozenset[str] = frozenset()
    want_logprobs: bool = False
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    _calls: CallStream[list[TokenLogprob]] = field(init=False)

    def __post_init__(self) -> None:
        self._calls = CallStream(self.tool_names)

    def delta(self, ev: Delta) -> list[dict[str, Any]]:
        """The chunk `choices` entries for one engine delta (none while text is held back)."""
        shown, calls, lps = self._calls.feed(ev.text, ev.logprobs)
        return self._entries(shown, calls, [e for part in lps for e in part])

    def finish(self, done: Done) -> tuple[list[dict[str, Any]], str]:
        """Entries for the held-back rest (a call without its tags included), and the finish reason."""
        rest, calls, lps = self._calls.finish()
        out = self._entries(rest, calls, [e for part in lps for e in part])
        return out, self.reason(done)

    def reason(self, done: Done) -> str:
        if self.calls and done.finish_reason == "stop":
            return "tool_calls"
        return "stop" if done.finish_reason == "cancelled" else done.finish_reason

    def _entries(self, shown: str, calls: list[ToolCall], lps: list[TokenLogprob]) -> list[dict[str, Any]]:
        out = []
        self.logprobs += lps
        if shown or (lps and self.want_logprobs):
            self.text.append(shown)
            out.append(self.entry({"content": shown}, lps))
        for call in calls:
            out.append(self.entry({"tool_calls": [call.openai(len(self.calls))]}, []))
            self.calls.append(call)
        return out

    def entry(self, delta: dict[str, Any], lps: list[TokenLogprob] | None = None) -> dict[str, Any]:
        """One `choices` entry of a chunk."""
        lp = {"content": logprobs_content(lps)} if self.want_logprobs and lps else None
        return {"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": None}

    def message(self, done: Done) -> dict[str, Any]:
        """The whole choice for a non-streamed answer."""
        self.finish(done)
        text = "".join(self.text)
        msg: dict[str, Any] = {"role": "assistant", "content": text.strip() if self.calls else text}
        if self.calls:
            msg["content"] = msg["content"] or None
            msg["tool_calls"] = [c.openai() for c in self.calls]
        lp = {"content": logprobs_content(self.logprobs)} if self.want_logprobs else None
        return {"index": self.index, "message": msg, "logprobs": lp, "finish_reason": self.reason(done)}
