"""How far drafting from the conversation can go on this machine: the bench's rewrite (and
chat) prompts answered greedily, then each answer replayed against the step costs measured
here, under the appliance's own draft rule and under two bounds no drafter can beat
(docs/benchmarks/speculation.md, "How far speculation can go here").

    .venv/bin/python bench/speculation/spec-bound.py            (about 5 minutes on 2 cores)

- **appliance**: `appliance.engine.spec` as the engine runs it for a lone stream (the n-gram lookup,
  DraftState's arming and doubling, the step budget, whole tiles), each step costed by its
  rows; it should land near what `bench/speculation/rewrite.sh` measures.
- **oracle length**: the same lookup, but every step drafts exactly the length that will be
  kept when that is cheaper per token than a plain step: no draft row is ever wasted.
- **oracle length, ideal source**: also drafts the longest stretch of the conversation so
  far that the answer is about to repeat (found by looking ahead): the ceiling of any drafter
  that copies from the conversation, as the issue's n-gram drafting does.

Speedups are over plain decoding of the same answers (one row per step), decode phase only:
the prompt's prefill is the same with or without drafts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from appliance import cpu
from appliance.bench.prompts import DEFAULT_SYSTEM, PROMPTS, REWRITE_PROMPTS
from appliance.config import Config
from appliance.engine.spec import ROW_TILE, DraftState, NgramIndex, allocate, fit_tile, step_budget
from appliance.model.llm import LLM, ContextSpec
from appliance.model.prompt import ChatTemplate, build_prompt

MODEL = Path(__file__).resolve().parents[2] / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MAX_TOKENS = 160  # as the bench's rewrite workload asks
MAX_ROWS = 20
PREVIOUS_RULE = {"start": 4, "arm_after": 2}  # DraftState's defaults before bea0e3e


def answers(m: LLM, texts: list[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy answer) per text, as the appliance would template and decode them."""
    tok = m.tokenizer
    template = ChatTemplate(tok.chat_template, tok.bos_text, tok.eos_text)
    out = []
    for text in texts:
        msgs = [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": text}]
        p = build_prompt(msgs, template, lambda s, special: tok.tokenize(s, False, special), 4096).tokens
        m.seq_rm(0)
        m.decode(p, list(range(len(p))), [0] * len(p), [False] * (len(p) - 1) + [True])
        ans: list[int] = []
        t = m.greedy_rows(len(p) - 1, 1)[0]
        while len(ans) < MAX_TOKENS and not tok.is_eog(t):
            ans.append(t)
            m.decode([t], [len(p) + len(ans) - 1], [0], [True])
            t = m.greedy_rows(0, 1)[0]
        out.append((p, ans))
    return out


def step_costs(m: LLM) -> dict[int, float]:
    """ms per llama_decode of 1..MAX_ROWS rows, every row with logits (as drafts need), at
    300 tokens of context: the median of 5, then the middle of 3 passes."""
    toks = m.tokenizer.tokenize("hello world " * 150)[:300]
    m.seq_rm(0)
    m.decode(toks, list(range(300)), [0] * 300, [False] * 299 + [True])
    runs: dict[int, list[float]] = {r: [] for r in range(1, MAX_ROWS + 1)}
    for _ in range(3):
        for rows in runs:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                m.decode(toks[:rows], list(range(300, 300 + rows)), [0] * rows, [True] * rows)
                times.append(time.perf_counter() - t0)
                m.seq_rm(0, 300, -1)
            runs[rows].append(1000 * sorted(times)[2])
    return {r: sorted(v)[1] for r, v in runs.items()}


def kept(draft: list[int], future: list[int]) -> int:
    n = 0
    while n < len(draft) and n < len(future) and draft[n] == future[n]:
        n += 1
    return n


def appliance_rule(prompt: list[int], ans: list[int], cost: dict[int, float], **rule: int) -> float:
    """A lone stream as core._drafts/_verify run it (greedy acceptance); `rule` overrides
    DraftState's defaults (start, max_len, arm_after) to compare another rule."""
    index, state, i, ms = NgramIndex(prompt), DraftState(**rule), 0, 0.0
    while i < len(ans):
        want = state.want()
        room = len(ans) - i + 2  # max_tokens bounds the draft as in the engine
        draft = index.draft(min(want + ROW_TILE - 1 if want else 1, room))
        state.guess = draft[0] if draft else -1
        got = allocate([min(want, len(draft))], step_budget(1))
        got = fit_tile(got, [len(draft) - got[0]], [state.armed], 1)
        d = draft[:got[0]]
        ms += cost[1 + len(d)]
        if d:
            n = kept(d, ans[i:])
            state.record(len(d), n)
            out = ans[i:i + n + 1]
        else:
            out = ans[i:i + 1]
            state.observe(out[0])
        index.extend(out)
        i += len(out)
    return ms


def best_step(n_right: int, cost: dict[int, float]) -> int:
    """Draft length (at most n_right, the tokens that would hold) cheapest per emitted token."""
    return min(range(min(n_right, MAX_ROWS - 1) + 1), key=lambda k: cost[1 + k] / (k + 1))


def oracle(prompt: list[int], ans: list[int], cost: dict[int, float], ideal: bool) -> float:
    index, i, ms = NgramIndex(prompt), 0, 0.0
    while i < len(ans):
        future = ans[i:i + MAX_ROWS - 1]
        n = longest_copy(index.tokens, future) if ideal else kept(index.draft(MAX_ROWS - 1), future)
        k = best_step(n, cost)
        ms += cost[1 + k]
        index.extend(ans[i:i + k + 1])
        i += k + 1
    return ms


def longest_copy(history: list[int], future: list[int]) -> int:
    """The longest prefix of `future` that occurs somewhere in `history`."""
    best = 0
    for s, t in enumerate(history):
        if t == future[0]:
            n = 0
            while n < len(future) and s + n < len(history) and history[s + n] == future[n]:
                n += 1
            best = max(best, n)
    return best


def main() -> None:
    cpu.set_thread_waiting(os.environ)  # as serve runs llama.cpp's threads
    m = LLM(MODEL, ContextSpec(n_ctx=4096, n_seq_max=2, n_batch=512, threads=2, repack=cpu.use_repack(Config())))
    cost = step_costs(m)
    print("ms per step by rows:", ", ".join(f"{r}: {c:.0f}" for r, c in cost.items()))
    for name, texts in (("rewrite", list(REWRITE_PROMPTS)), ("chat", list(PROMPTS[:8]))):
        pairs = answers(m, texts)
        plain = sum(cost[1] * len(a) for _, a in pairs)
        rule = sum(appliance_rule(p, a, cost) for p, a in pairs)
        before = sum(appliance_rule(p, a, cost, **PREVIOUS_RULE) for p, a in pairs)
        length = sum(oracle(p, a, cost, ideal=False) for p, a in pairs)
        ideal = sum(oracle(p, a, cost, ideal=True) for p, a in pairs)
        print(f"{name}: {len(pairs)} answers, {sum(len(a) for _, a in pairs)} tokens; decode phase over plain "
              f"decoding: appliance {plain / rule:.2f}x (the rule before bea0e3e {plain / before:.2f}x), "
              f"oracle length {plain / length:.2f}x, "
              f"oracle length with an ideal source {plain / ideal:.2f}x")
    m.close()


if __name__ == "__main__":
    main()
