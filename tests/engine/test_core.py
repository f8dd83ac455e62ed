"""EngineCore driven synchronously, one loop iteration at a time, on the fakes: the edges
where drafts, parking, admission and public prefixes meet (found by a randomised review run
against the invariants: every sequence id accounted for, greedy text as without drafts)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest
from helpers.engines import make
from helpers.fakes import FakeModel, RuleModel

from appliance.engine.events import Done, Failed
from appliance.errors import GrammarDeadEnd
from appliance.sampling import SamplingParams

ALPHA = "abcdefghijklmnopqrstuvwxyz"


def letters(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize("ctx_limit", range(61, 92, 3))
def test_drafts_near_the_context_limit_stop_where_plain_decoding_does(ctx_limit: int) -> None:
    # A verified run advances n_cached by all its accepted drafts at once; the context
    # check must count the tokens actually taken, or the turn stops up to a run early.
    prompt = letters(ALPHA * 2 + "a")  # the model continues b, c, d...: every draft holds
    texts = {}
    for budget in (0, 16):
        c = make(RuleModel(), ctx_limit=ctx_limit, spec_budget=budget)
        _, rec = c.submit(prompt, max_tokens=500)
        c.run()
        assert isinstance(rec.end, Done) and rec.end.finish_reason == "length"
        texts[budget] = rec.text
        if budget:
            assert c.core.stats.draft_accepted > 0
    assert texts[0] == texts[16] and len(texts[0]) == ctx_limit - len(prompt)


def test_restoring_a_parked_conversation_survives_the_parking_budget() -> None:
    # Freeing an id for the restore parks another session, which pushes the parked total
    # over budget; the conversation being restored (the oldest parked) must not be the one
    # dropped, or its turn fails and the id it was restored into is lost for good.
    model = FakeModel(reply="hello")
    c = make(model, slots=1, n_seq=2, park_bytes=120)  # room for one parked state, not two
    p1 = list(range(100, 120))
    c.submit(p1, client="C")  # C's conversation without a session id
    c.run()
    c.clock.advance(1)
    c.submit(list(range(300, 320)), client="C", session="named-session-x")
    c.run()
    c.clock.advance(1)
    c.submit(list(range(500, 520)), client="D")  # no free id: C's first conversation is parked
    c.run()
    c.clock.advance(1)
    assert [e.state for e in c.core.cache.entries.values()].count("parked") == 1
    _, rec = c.submit(p1 + letters("hello") + list(range(700, 710)), client="C")  # C continues it
    c.run()
    assert isinstance(rec.end, Done) and rec.end.cached_tokens == len(p1) + 5, rec.end
    assert c.core.kv.stats.restored == 1
    assert not c.leaked_ids()
    # And the box keeps serving everyone (ids were once lost one by one until none was left).
    for i in range(4):
        _, r = c.submit(list(range(2000 + 50 * i, 2010 + 50 * i)), client=f"E{i}")
        c.run()
        assert isinstance(r.end, Done)
    assert not c.leaked_ids()


@dataclass
class NBatchModel(RuleModel):
    """RuleModel that refuses batches over n_batch, as llm.LLM.decode does."""

    n_batch: int = 256
    largest: int = 0

    def decode(self, tokens: list[int], pos: list[int], seq_ids: list[int], logits: list[bool]) -> None:
        self.largest = max(self.largest, len(tokens))
        if len(tokens) > self.n_batch:
            raise RuntimeError(f"batch of {len(tokens)} tokens exceeds n_batch {self.n_batch}")
        super().decode(tokens, pos, seq_ids, logits)


@pytest.mark.parametrize(("prefill_chunk", "prefill_group", "n_new"), [(0, 0, 600), (64, 256, 250)])
def test_drafts_never_push_a_step_past_batch_tokens(prefill_chunk: int, prefill_group: int, n_new: int) -> None:
    # The scheduler plans the prefill without drafts; a stream copying with long drafts
    # must not turn a full prefill step into a batch llama.cpp refuses (both turns failed).
    model = NBatchModel()
    c = make(model, slots=2, n_seq=4, batch_tokens=256, spec_budget=16, prefill_chunk=prefill_chunk,
             prefill_group=prefill_group)
    a, ra = c.submit(letters(ALPHA * 3 + "a"), max_tokens=300, client="A")
    while not (a.drafts is not None and a.drafts.state.armed and a.drafts.state.length == 16):
        c.step()
    _, rb = c.submit([1000 + i % 50 for i in range(n_new)], max_tokens=5, client="B")
    c.run()
    assert model.largest <= 256
    assert isinstance(ra.end, Done) and isinstance(rb.end, Done), (ra.end, rb.end)
    assert c.core.stats.draft_accepted > 100


@pytest.mark.parametrize("park_bytes", [0, 10_000])
def test_a_continued_conversation_is_not_evicted_by_its_own_admission(park_bytes: int) -> None:
    # Its cells are inside its turn's own reservation (prompt + max_tokens): counted as idle
    # cells too, it was evicted just before being taken over (recomputed, or parked and
    # restored at once).
    c = make(FakeModel(reply="hello"), slots=2, n_seq=4, kv_tokens=300, ctx_limit=300, park_bytes=park_bytes)
    p1 = [100 + i % 50 for i in range(100)]
    c.submit(p1, session="s")
    c.run()
    c.clock.advance(1)
    p2 = p1 + letters("hello") + [7] * 10
    _, rec = c.submit(p2, max_tokens=300 - len(p2), session="s")
    c.run()
    assert isinstance(rec.end, Done) and rec.end.cached_tokens == len(p1) + 5
    assert c.core.cache.events.evicted == 0 and c.core.kv.stats.restored == 0


def test_public_prefix_cells_are_never_promised_to_a_reservation(caplog: pytest.LogCaptureFixture) -> None:
    # The pinned prefix holds cells of the cache that no running turn may count on: a
    # second request waits for room instead of both failing "KV cache full" at the end.
    caplog.set_level(logging.CRITICAL)
    model = FakeModel(reply="x" * 400, capacity=300)  # llama.cpp's n_ctx = kv_tokens
    c = make(model, slots=2, n_seq=3, kv_tokens=300, ctx_limit=300)
    public = letters("You are a helpful assistant.")
    c.core.add_public(public)
    assert c.core.sched.pinned == len(public)
    _, ra = c.submit([5] * 50, max_tokens=100, client="A")  # private system prompts: nothing copied
    _, rb = c.submit([6] * 50, max_tokens=100, client="B")  # 300 reserved in all + 28 pinned > 300
    c.step()
    assert len(c.core.sched.running) == 1  # B waits for A's cells
    c.run()
    assert all(isinstance(r.end, Done) and r.end.finish_reason == "length" for r in (ra, rb)), (ra.end, rb.end)
    assert len(ra.text) == len(rb.text) == 100
    # A lone turn asking for the whole cache stops at what the prefix leaves, "length", not 503.
    _, rc = c.submit([7] * 50, max_tokens=250, client="C")
    c.run()
    assert isinstance(rc.end, Done) and rc.end.finish_reason == "length"
    assert len(rc.text) == 300 - len(public) - 50


def test_any_integer_seed_samples_with_drafts() -> None:
    # A negative seed is a seed (llama.cpp's chain masks it); numpy's generator for the
    # drafts' acceptance refused it outside the admission's error handling, and the engine
    # loop crashed for everyone.
    c = make(RuleModel(), spec_budget=16)
    prompt = letters(ALPHA * 2 + "a")
    for seed in (-1, -5, 2**70):
        _, rec = c.submit(prompt, params=SamplingParams(max_tokens=30, temperature=1.0, seed=seed))
        c.run()
        assert isinstance(rec.end, Done) and len(rec.text) == 30, rec.end
    assert c.core.stats.draft_accepted > 0


def test_a_subnormal_temperature_samples_as_greedy_with_drafts() -> None:
    # logits / 1e-310 overflow to inf; inf - inf in the softmax made NaN, the only candidate
    # was rejected and sampling an empty row crashed the engine loop.
    c = make(RuleModel(), spec_budget=16)
    prompt = letters(ALPHA * 2 + "a")
    _, rec = c.submit(prompt, params=SamplingParams(max_tokens=40, temperature=1e-310, top_k=1))
    c.run()
    assert isinstance(rec.end, Done) and rec.text == (ALPHA * 3)[1:41]
    assert c.core.stats.draft_accepted > 0


@dataclass
class DeadEndModel(FakeModel):
    """A fake whose grammar-bound samplers find no allowed token: LLM.sample_all returns
    the refusal in that pick's place, as the real one does."""

    def sample_all(self, picks: list[tuple[Any, int]]) -> list[int | Exception]:
        return [GrammarDeadEnd() if getattr(smp, "grammar", False) else self.sample(smp, row) for smp, row in picks]

    def new_sampler(self, params: SamplingParams) -> Any:
        smp = super().new_sampler(params)
        smp.grammar = params.grammar is not None  # type: ignore[attr-defined]
        return smp


def test_a_grammar_with_no_way_on_fails_its_turn_only() -> None:
    c = make(DeadEndModel(reply="hello"), slots=2, n_seq=3)
    _, stuck = c.submit([1, 2, 3], params=SamplingParams(max_tokens=10, grammar='root ::= "a" [z-a]'), client="A")
    _, other = c.submit([4, 5, 6], max_tokens=10, client="B")
    c.run()
    assert isinstance(stuck.end, Failed) and stuck.end.error.status == 400
    assert "allows no further token" in stuck.end.error.message
    assert isinstance(other.end, Done) and other.text == "hello"
    assert not c.leaked_ids() and not c.core.sched.running


def test_streams_beside_a_long_prompt_run_in_their_own_call_and_answer_the_same() -> None:
    # batch.split: once streams and a prompt chunk reach 64 rows, the chunk runs in a call
    # of its own, and the streams (drafts included) keep under 64 rows in theirs.
    stream_prompts = [letters(ALPHA * 30 + "a"), letters(ALPHA * 30 + "m")]  # 1,562 cells together
    texts = {}
    for with_paste in (False, True):
        model = RuleModel()
        c = make(model, slots=3, batch_tokens=256, prefill_chunk=64, spec_budget=16)
        recs = [c.submit(p, max_tokens=200, client=f"s{i}")[1] for i, p in enumerate(stream_prompts)]
        while not all(r.text for r in recs):  # both streaming
            c.step()
        if with_paste:
            _, paste = c.submit(list(range(1000, 1300)), max_tokens=4, client="paste")
        c.run()
        assert all(isinstance(r.end, Done) for r in recs)
        texts[with_paste] = [r.text for r in recs]
        if with_paste:
            assert isinstance(paste.end, Done)
            streams_rows = [sum(t < 1000 for t in tokens) for tokens, *_ in model.calls]
            big = [i for i, (tokens, *_) in enumerate(model.calls) if len(tokens) >= 64 and max(tokens) >= 1000]
            assert big, "the paste was read in chunks of 64"
            assert all(streams_rows[i] == 0 for i in big)  # no stream row in a call of a tile or more
            # ... and the streams were not held back: they decoded in the iterations the
            # chunks were read in (a call of stream rows right after each chunk's call).
            assert all(streams_rows[i + 1] > 0 for i in big if i + 1 < len(model.calls))
    assert texts[False] == texts[True]
