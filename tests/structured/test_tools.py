"""tools.py: whatever the model writes inside (or instead of) a <tool_call> block, parsing
never raises. A block that is not valid JSON naming one of the tools with an object of
arguments stays the model's text, on every route: OpenAI's chat, whole and streamed, and
Ollama's /api/chat, where an answer that is only JSON may be a call without its tags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.fakes import FakeModel, FakeSampler
from helpers.inprocess import CHAT, USER, dicts, events_of, serving

from appliance.bench import sse
from appliance.sampling import SamplingParams
from appliance.structured.tools import CLOSE, MAX_DEPTH, OPEN, ToolCallParser, split_answer

NAMES = frozenset({"get_weather"})
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
DEEP = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError, not ValueError


def nested(depth: int) -> str:
    """An arguments object whose arrays nest `depth` levels in all."""
    return '{"t": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


NOT_CALLS = {
    "name a list": '{"name": ["get_weather"], "arguments": {}}',
    "name an object": '{"name": {"first": "Ada", "last": "Lovelace"}, "arguments": {}}',
    "name a number": '{"name": 5, "arguments": {}}',
    "arguments a list": '{"name": "get_weather", "arguments": [1, 2]}',
    "arguments a number": '{"name": "get_weather", "arguments": 5}',
    "arguments a string holding a list": '{"name": "get_weather", "arguments": "[1]"}',
    "arguments NaN": '{"name": "get_weather", "arguments": {"t": NaN}}',
    "arguments -Infinity": '{"name": "get_weather", "arguments": {"t": [-Infinity]}}',
    "arguments past the float range": '{"name": "get_weather", "arguments": {"t": 1e400}}',
    "arguments double-encoded with NaN": '{"name": "get_weather", "arguments": "{\\"t\\": NaN}"}',
    "an integer of 5,000 digits": '{"name": "get_weather", "arguments": {"t": ' + "9" * 5000 + "}}",
    "nested past the recursion limit": '{"name": "get_weather", "arguments": {"t": ' + DEEP + "}}",
    "double-encoded, nested past the limit": '{"name": "get_weather", "arguments": "{\\"t\\": ' + DEEP + '}"}',
    "nested deeper than MAX_DEPTH": '{"name": "get_weather", "arguments": ' + nested(MAX_DEPTH + 1) + "}",
    "a whole block nested past the limit": DEEP,
}


def refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def strict(text: str) -> Any:
    """json.loads as a strict client parses: NaN and Infinity are refused."""
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("block", NOT_CALLS.values(), ids=NOT_CALLS.keys())
def test_a_block_that_is_no_call_stays_text_whole_and_streamed(block: str) -> None:
    answer = f"Here: {OPEN}\n{block}\n{CLOSE} done"
    assert split_answer(answer, NAMES) == (answer, [])
    p = ToolCallParser(NAMES)
    shown = [p.feed(c) for c in answer]  # one character at a time, as a stream may cut it
    assert "".join(s for s, _ in shown) + p.flush() == answer and not p.calls


def test_a_call_nested_to_max_depth_is_still_a_call_in_strict_json() -> None:
    text, (call,) = split_answer(f'{OPEN}{{"name": "get_weather", "arguments": {nested(MAX_DEPTH)}}}{CLOSE}', NAMES)
    assert text == "" and call.name == "get_weather"
    assert strict(call.arguments) == json.loads(nested(MAX_DEPTH))
    # Double-encoded arguments are decoded, then sent as JSON text again.
    _, (call,) = split_answer(f'{OPEN}{{"name": "get_weather", "arguments": "{{\\"a\\": 1.5}}"}}{CLOSE}', NAMES)
    assert strict(call.arguments) == {"a": 1.5}


# -- over HTTP -------------------------------------------------------------------------------
ADA = '{"name": {"first": "Ada", "last": "Lovelace"}, "born": 1815}'  # an answer, not a call
REPLIES = {
    "name a list": f'{OPEN}\n{NOT_CALLS["name a list"]}\n{CLOSE}',
    "arguments NaN": f'{OPEN}\n{NOT_CALLS["arguments NaN"]}\n{CLOSE}',
    "arguments past the float range": f'{OPEN}\n{NOT_CALLS["arguments past the float range"]}\n{CLOSE}',
    "arguments a list": f'{OPEN}\n{NOT_CALLS["arguments a list"]}\n{CLOSE}',
    "a JSON answer whose name is an object": ADA,
    "a bare block whose name is a list": NOT_CALLS["name a list"],
}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_the_model_gets_its_words_back_on_every_route(reply: str) -> None:
    with serving(lambda: FakeModel(reply=reply)) as client:
        body = {"messages": USER, "tools": TOOLS, "max_tokens": 200}
        r = client.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        choice = strict(r.text)["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": reply} and choice["finish_reason"] == "stop"
        events = events_of(client.post(CHAT, json={**body, "stream": True}))
        assert events[-1] == sse.DONE
        assert "".join(sse.content(e) for e in events) == reply
        assert not any(c["delta"].get("tool_calls") for e in dicts(events) for c in e.get("choices", []))

        ollama = {"model": "m", "messages": USER, "tools": TOOLS, "options": {"num_predict": 200}}
        r = client.post("/api/chat", json={**ollama, "stream": False})
        assert r.status_code == 200, r.text
        assert strict(r.text)["message"] == {"role": "assistant", "content": reply}
        r = client.post("/api/chat", json=ollama)
        assert r.status_code == 200, r.text
        *parts, final = [strict(s) for s in r.text.splitlines()]
        assert "".join(p["message"]["content"] for p in parts) == reply
        assert not any("tool_calls" in p["message"] for p in parts) and final["done"] is True


# -- a call written without its tags ---------------------------------------------------------
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # the 0.5B model often leaves the tags out
BARE_CASES = {
    "a call": (BARE, None, [("get_weather", {"city": "Paris"})], "tool_calls"),
    "JSON that is no call": ('{"city": "Paris"}', '{"city": "Paris"}', [], "stop"),
    "text": ("It is sunny.", "It is sunny.", [], "stop"),
    # The 0.5B model fences a call as Markdown in 5 of 12 first turns (tool-round-trips.py).
    "a fenced call": (f"```json\n{BARE}\n```", None, [("get_weather", {"city": "Paris"})], "tool_calls"),
    "fenced code": ("```python\nprint(1)\n```", "```python\nprint(1)\n```", [], "stop"),
}


@pytest.mark.parametrize("reply,content,calls,reason", BARE_CASES.values(), ids=BARE_CASES.keys())
def test_an_openai_call_without_its_tags_is_still_a_call(reply: str, content: str | None,
                                                         calls: list[tuple[str, Any]], reason: str) -> None:
    # The same rescue as Ollama's /api/chat (tools.CallStream): only with tools given, and
    # only when the whole answer is one JSON call naming one of them.
    with serving(lambda: FakeModel(reply=reply)) as client:
        body = {"messages": USER, "tools": TOOLS, "max_tokens": 200}
        (choice,) = strict(client.post(CHAT, json=body).text)["choices"]
        message = choice["message"]
        assert message["content"] == content and choice["finish_reason"] == reason
        got = [(c["function"]["name"], strict(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
        assert got == calls
        events = events_of(client.post(CHAT, json={**body, "stream": True}))
        assert events[-1] == sse.DONE
        entries = [c for e in dicts(events) for c in e.get("choices", [])]
        streamed = [(c["function"]["name"], strict(c["function"]["arguments"]))
                    for e in entries for c in e["delta"].get("tool_calls", [])]
        assert streamed == calls and "".join(sse.content(e) for e in events) == (content or "")
        assert [e["finish_reason"] for e in entries if e["finish_reason"]] == [reason]
        if not reply.startswith(("{", "`")):
            assert sum(bool(e["delta"].get("content")) for e in entries) == len(reply)  # plain text is not held back
        if reply.startswith("```python"):  # held only until it cannot be a fenced call
            assert sum(bool(e["delta"].get("content")) for e in entries) > len(reply) - 10
        # Without tools the same text is just text.
        (choice,) = client.post(CHAT, json={"messages": USER, "max_tokens": 200}).json()["choices"]
        assert choice["message"] == {"role": "assistant", "content": reply}


# -- after a tool's result: the call just answered is not made again ------------------------
@dataclass
class EchoModel(FakeModel):
    """Writes its call again, as the 0.5B model does after a tool's result, unless its sampler
    has a grammar (a rewound turn: engine/repeat.py): then it answers. Records the prompts."""

    answer: str = "It is 21 C."
    prompts: list[str] = field(default_factory=list)

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return GrammarSampler(grammar=params.grammar)

    text: str = ""
    i: int = 0
    after_grammar: bool = False  # the last first token came from a grammar sampler

    def sample(self, sampler: FakeSampler, row: int) -> int:
        grammar = getattr(sampler, "grammar", None)
        if sampler.n == 0 and (grammar or not self.after_grammar):  # a turn's (or a rewound turn's) start
            self.text, self.i = (self.answer if grammar else self.reply), 0
        if sampler.n == 0:
            self.after_grammar = bool(grammar)
        sampler.n += 1
        self.i += 1
        return ord(self.text[self.i - 1]) if self.i <= len(self.text) else 0

    def decode(self, tokens: list[int], pos: list[int], seq_ids: list[int], logits: list[bool]) -> None:
        super().decode(tokens, pos, seq_ids, logits)
        self.prompts.append("".join(chr(t) for t in tokens))


@dataclass
class GrammarSampler(FakeSampler):
    grammar: str | None = None


ECHO = OPEN + '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' + CLOSE
AFTER_RESULT = [USER[0], {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'}]


def test_after_a_tools_result_the_same_call_again_becomes_an_answer_on_every_route() -> None:
    model = EchoModel(reply=ECHO)
    with serving(lambda: model) as client:
        body = {"messages": AFTER_RESULT, "tools": TOOLS, "max_tokens": 200}
        (choice,) = strict(client.post(CHAT, json=body).text)["choices"]
        assert choice["message"] == {"role": "assistant", "content": "It is 21 C."} and choice["finish_reason"] == "stop"
        # The answer was read from the chat with the user's question put again after the result.
        asked = USER[0]["content"]
        assert any(f'Answer my question "{asked}" from the tool\'s result' in p for p in model.prompts)
        events = events_of(client.post(CHAT, json={**body, "stream": True}))
        assert "".join(sse.content(e) for e in events) == "It is 21 C."
        assert not any(c["delta"].get("tool_calls") for e in dicts(events) for c in e.get("choices", []))
        # Ollama's chat, its arguments an object.
        msgs = [AFTER_RESULT[0], {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "content": "21 C"}]
        r = client.post("/api/chat", json={"model": "m", "messages": msgs, "tools": TOOLS, "stream": False,
                                           "options": {"num_predict": 200}})
        assert r.status_code == 200 and r.json()["message"]["content"] == "It is 21 C.", r.text
        # Another call (other arguments) goes out as the call it is.
        model.reply = ECHO.replace("Paris", "Lyon")
        (choice,) = strict(client.post(CHAT, json=body).text)["choices"]
        assert choice["finish_reason"] == "tool_calls"
        assert strict(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Lyon"}
