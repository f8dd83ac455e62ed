"""Speculative decoding inside the engine, on a fake model with known logits: accepted
tokens are exactly the model's own picks, rejected drafts leave no trace in the KV cache,
and busy steps get no drafts."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.engines import collect, run
from helpers.fakes import RuleModel

from appliance.engine.engine import Engine, EngineOptions, EngineState
from appliance.engine.events import Delta, Done
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.sampling import SamplingParams

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def chain(start: str, n: int) -> str:
    """What the model says after `start`, one token at a time (the ground truth)."""
    out, t = [], ord(start)
    for _ in range(n):
        t = RuleModel.rule(t)
        out.append(chr(t))
    return "".join(out)


async def engine(model: RuleModel, spec_budget: int, slots: int = 4, **kw: Any) -> Engine:
    limits = Limits(slots=slots, batch_tokens=256, kv_tokens=8192, ctx_limit=1024, max_wait_s=0.0,
                    max_queue=32, queue_timeout_s=30.0)
    eng = Engine(lambda: model, EngineOptions(limits, CachePolicy(n_seq=slots + 4, min_shared=4), spec_budget=spec_budget, **kw))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    assert eng.state is EngineState.READY
    return eng


# The prompt holds the alphabet as the model would continue it (drafts accepted), then a
# broken copy whose "fgh" is followed by "XYZ": being the latest occurrence, it is what the
# drafts propose at "fgh", and the model rejects it.
PROMPT = [ord(c) for c in "Q: " + ALPHABET + " then " + ALPHABET[:8] + "XYZ" + " go: a"]


def test_greedy_accepted_tokens_are_exactly_the_models_picks() -> None:
    async def main() -> None:
        for temperature in (0.0, 1.0):
            texts = {}
            for budget in (0, 16):
                model = RuleModel()
                eng = await engine(model, budget)
                text, end = await collect(eng.submit(PROMPT, SamplingParams(max_tokens=60, temperature=temperature,
                                                                            seed=7), session="s"))
                assert isinstance(end, Done) and end.finish_reason == "length"
                texts[budget] = text
                c = eng.snapshot.counters
                if budget:
                    # Drafts were tried, many accepted, and some rejected (after "mno").
                    assert c.draft_accepted > 20 and c.draft_tokens > c.draft_accepted, c
                    assert c.steps < 60 - 20  # fewer decode steps than tokens
                else:
                    assert c.draft_tokens == 0
                # Rejected drafts left nothing behind: the cache holds exactly the session.
                (entry,) = eng.core.cache.entries.values()
                assert model.kv[entry.seq_id] == list(range(entry.n_tokens))
                assert entry.tokens == (PROMPT + [ord(x) for x in text])[:entry.n_tokens]
                # The next turn continues from that cache (the fake asserts contiguous positions).
                nxt = entry.tokens + [ord(x) for x in text[entry.n_tokens - len(PROMPT):]] + [ord("a")]
                _, end2 = await collect(eng.submit(nxt, SamplingParams(max_tokens=5, temperature=temperature),
                                                   session="s"))
                assert isinstance(end2, Done) and end2.cached_tokens == entry.n_tokens
                eng.stop()
            assert texts[0] == texts[16] == chain("a", 60), texts
    run(main())


def test_rejected_drafts_are_removed_mid_answer_too() -> None:
    async def main() -> None:
        model = RuleModel()
        eng = await engine(model, 16)
        # Cut the answer while drafts are in flight: a stop string inside an accepted run.
        text, end = await collect(eng.submit(PROMPT, SamplingParams(max_tokens=60, temperature=0.0, stop=("pq",)),
                                             session="s"))
        assert text == chain("a", 60).split("pq")[0] and end.finish_reason == "stop"
        (entry,) = eng.core.cache.entries.values()
        assert model.kv[entry.seq_id] == list(range(entry.n_tokens))
        assert len(entry.tokens) <= len(PROMPT) + len(text) + 2
        eng.stop()
    run(main())


def test_busy_steps_get_no_drafts() -> None:
    async def main() -> None:
        model = RuleModel(delay=0.001)
        eng = await engine(model, 16, slots=16)
        hs = [eng.submit(PROMPT, SamplingParams(max_tokens=30, temperature=0.0), session=f"s{i}", client=f"c{i}")
              for i in range(16)]
        results = await asyncio.gather(*(collect(h) for h in hs))
        assert all(t == chain("a", 30) for t, _ in results)
        log = eng.snapshot.step_log
        full = [s for s in log if s[0] == 16]
        assert full and all(drafts == 0 for *_, drafts in full), full
        # Alone, a stream has budget again.
        text, _ = await collect(eng.submit(PROMPT, SamplingParams(max_tokens=30, temperature=0.0)))
        assert text == chain("a", 30)
        assert any(drafts > 0 for decode, _, _, drafts in eng.snapshot.step_log[len(log):] if decode == 1)
        eng.stop()
    run(main())


def test_speculation_off_for_penalised_requests() -> None:
    async def main() -> None:
        model = RuleModel()
        eng = await engine(model, 16)
        await collect(eng.submit(PROMPT, SamplingParams(max_tokens=30, temperature=0.0, repeat_penalty=1.1)))
        assert eng.snapshot.counters.draft_tokens == 0
        eng.stop()
    run(main())


def test_draft_steps_fill_whole_tiles_of_rows() -> None:
    # The CPU matmuls take rows four at a time and a row past a tile costs about a whole
    # one-row step (spec.ROW_TILE): a lone stream drafts 3, 7 or 15 tokens, never 4, 8, 16.
    async def main() -> None:
        model = RuleModel()
        eng = await engine(model, 16)
        text, _ = await collect(eng.submit(PROMPT, SamplingParams(max_tokens=60, temperature=0.0), session="s"))
        assert text == chain("a", 60)
        drafted = [drafts for decode, prefill, _, drafts in eng.snapshot.step_log if drafts and not prefill]
        assert drafted and all((1 + d) % 4 == 0 for d in drafted), drafted
        assert max(drafted) == 15
        eng.stop()
    run(main())


def test_a_steps_accepted_drafts_reach_the_stream_as_one_delta() -> None:
    # One SSE event per step, not per token: the event loop wakes once for a verified run.
    async def main() -> None:
        model = RuleModel()
        eng = await engine(model, 16)
        deltas: list[str] = []
        async for ev in eng.submit(PROMPT, SamplingParams(max_tokens=60, temperature=0.0), session="s").events():
            if isinstance(ev, Delta):
                deltas.append(ev.text)
        c = eng.snapshot.counters
        assert "".join(deltas) == chain("a", 60)
        assert c.draft_accepted > 20
        # No more deltas than decode steps (the prompt's step emits the first token).
        decode_steps = sum(1 for decode, *_ in eng.snapshot.step_log if decode)
        assert len(deltas) <= decode_steps + 1 < 60 - 20, (len(deltas), decode_steps)
        assert any(len(d) > 1 for d in deltas)
        eng.stop()
    run(main())
