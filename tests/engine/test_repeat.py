"""An answer after a tool's result that only repeats the call just answered is sampled again
as an answer (engine/repeat.py), on the fake model: its opening is held while it could be
such a call, nothing of the repeat goes out, the KV is rewound, and a turn is rewound once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from helpers.engines import make
from helpers.fakes import EOS, FakeModel, FakeSampler

from appliance.engine.events import Delta, Done
from appliance.engine.repeat import ANSWER_START, CallGuard
from appliance.sampling import SamplingParams
from appliance.structured.tools import answered, call_key

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
KEY = call_key("get_weather", {"city": "Oslo"})


@dataclass
class BannedSampler(FakeSampler):
    banned: frozenset[int] = frozenset()
    grammar: str | None = None


@dataclass
class Repeater(FakeModel):
    """One turn at a time: writes `reply`, and `instead` from the start once a sampler with
    a grammar takes its first token (a rewound turn)."""

    instead: str = "It is 7 C in Oslo."
    samplers: list[BannedSampler] = field(default_factory=list)
    text: str = ""
    i: int = 0

    def new_sampler(self, params: SamplingParams) -> BannedSampler:
        s = BannedSampler(banned=frozenset(t for t, b in params.logit_bias if b == -math.inf), grammar=params.grammar)
        self.samplers.append(s)
        return s

    def sample(self, sampler: FakeSampler, row: int) -> int:
        assert isinstance(sampler, BannedSampler)
        if not self.text:
            self.text = self.reply
        if sampler.n == 0 and sampler.grammar is not None:
            self.text, self.i = self.instead, 0
        sampler.n += 1
        self.i += 1
        return ord(self.text[self.i - 1]) if self.i <= len(self.text) else EOS


def params(**kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=200, temperature=0.0, **kw)  # type: ignore[arg-type]


def test_a_repeated_call_is_rewound_and_answered_instead() -> None:
    model = Repeater(reply=CALL)
    c = make(model)
    prompt = [ord(x) for x in "the weather? <tool_response>7 C</tool_response>"]
    t, rec = c.submit(prompt, params=params(answered=(KEY,)))
    c.run()
    assert rec.text == "It is 7 C in Oslo."
    assert isinstance(rec.end, Done) and rec.end.finish_reason == "stop"
    assert rec.end.completion_tokens == len("It is 7 C in Oslo.")
    assert "<tool_call>" not in rec.text and "get_weather" not in rec.text
    # The rewound answer's first token was sampled under ANSWER_START (not "<", "{", "`" or
    # a blank), the rest without a grammar.
    assert model.samplers[1].grammar == ANSWER_START and model.samplers[2].grammar is None
    assert len(model.samplers) == 3
    # The KV holds the prompt and the answer only: the repeat's cells were removed.
    assert c.leaked_ids() == set()


def test_a_retry_prompt_is_read_from_where_it_parts_from_the_prompt() -> None:
    model = Repeater(reply=CALL)
    c = make(model)
    prompt = [ord(x) for x in "weather? <tool_response>7 C</tool_response>"]
    retry = prompt + [ord(x) for x in " Answer my question from the result."]
    t, rec = c.submit(prompt, params=params(answered=(KEY,), retry_prompt=tuple(retry)))
    c.run()
    assert rec.text == "It is 7 C in Oslo." and isinstance(rec.end, Done)
    assert t.prompt == retry and rec.end.prompt_tokens == len(retry)
    # The fake checks every position follows the cells held: the repeat's cells went, the
    # retry's own tail was computed from where it parts from the prompt.
    fed = {p: tok for toks, pos, _, _ in model.calls[-(len(rec.text) + 2):] for tok, p in zip(toks, pos)}
    assert [fed[p] for p in range(len(prompt), len(retry))] == retry[len(prompt):]
    # The reservation was made for the longer prompt and given back whole.
    assert c.core.budget.reserved == 0 and c.leaked_ids() == set()


def test_a_retry_prompt_shorter_than_the_prompt_gives_back_the_whole_reservation() -> None:
    """A rewound turn's prompt is its retry prompt: what it may come to hold shrinks, what it
    gives back does not (the budget kept the difference for good before Turn.reserved)."""
    model = Repeater(reply=CALL)
    c = make(model)
    prompt = [ord(x) for x in "the weather in Oslo, please? <tool_response>7 C</tool_response>"]
    retry = [ord(x) for x in "the weather? <tool_response>7 C</tool_response>"]
    t, rec = c.submit(prompt, params=params(answered=(KEY,), retry_prompt=tuple(retry)))
    c.step()
    assert t.reserved == len(prompt) + 200 and c.core.budget.reserved == t.reserved
    c.run()
    assert rec.text == "It is 7 C in Oslo." and t.prompt == retry
    assert c.core.budget.reserved == 0 and t.reserved == 0 and c.leaked_ids() == set()


def test_a_different_call_goes_out_as_it_was_written() -> None:
    other = CALL.replace("Oslo", "Lisbon")
    model = Repeater(reply=other)
    c = make(model)
    _, rec = c.submit([ord(x) for x in "weather in Lisbon too?"], params=params(answered=(KEY,)))
    c.run()
    assert rec.text == other and len(model.samplers) == 1


def test_text_goes_out_from_its_first_token_and_a_turn_without_answered_calls_is_not_held() -> None:
    model = Repeater(reply="It rains.")
    c = make(model)
    _, rec = c.submit([ord(x) for x in "weather?"], params=params(answered=(KEY,)))
    c.step(), c.step()
    assert [e.text for e in rec.events if isinstance(e, Delta)][0] == "I"
    c.run()
    model2 = Repeater(reply=CALL)
    c2 = make(model2)
    _, rec2 = c2.submit([ord(x) for x in "weather?"], params=params())
    c2.run()
    assert rec2.text == CALL and len(model2.samplers) == 1


def test_an_answer_that_ends_while_held_goes_out_whole() -> None:
    model = Repeater(reply="<tool_call>\n{\"name\": \"get_weather\"")  # cut: EOS while held
    c = make(model)
    _, rec = c.submit([ord(x) for x in "weather?"], params=params(answered=(KEY,)))
    c.run()
    assert rec.text == model.reply and isinstance(rec.end, Done)


@pytest.mark.parametrize("opening, verdict", [
    (CALL, None),
    ('  <tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>', None),  # key order, spaces
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', None),  # bare and double-encoded
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', None),  # fenced, as the 0.5B writes
    (CALL.replace("Oslo", "Bergen"), "out"),
    ("```python\nprint(1)", "out"),
    ('{"answer": 1}', "out"),
    ("The weather", "out"),
])
def test_the_guard_knows_a_repeat_however_it_is_spaced(opening: str, verdict: str | None) -> None:
    g = CallGuard(frozenset({KEY}))
    results = [g.feed(ch.encode()) for ch in opening]
    if verdict is None:  # nothing let out before the repeat is known (the engine stops feeding there)
        first = results.index(None)
        assert all(r == [] for r in results[:first]) and first >= opening.index("}")
    else:
        out = [r for r in results if r]
        assert out and b"".join(b"".join(r) for r in out) == opening[:len(b"".join(b"".join(r) for r in out))].encode()


def test_answered_names_the_calls_whose_results_end_the_chat() -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "7 C"}]
    assert answered(msgs) == (KEY,)
    assert answered(msgs + [{"role": "user", "content": "and tomorrow?"}]) == ()
    assert answered(msgs[:2]) == ()
    ollama = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}  # arguments as an object
    assert answered([msgs[0], {"role": "assistant", "content": "", "tool_calls": [ollama]}, msgs[2]]) == (KEY,)
