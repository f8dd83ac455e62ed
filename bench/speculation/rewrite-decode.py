"""Rewriting at one client without HTTP: the bench's rewrite prompts through `Engine` one
after another (one client, greedy, 160 tokens), and the time from each answer's first token
to its last, where speculation acts (docs/benchmarks/speculation.md, "Draft rows in whole tiles"), and
how much of that was inside llama_decode, by the step's rows.

    .venv/bin/python bench/speculation/rewrite-decode.py [N_PROMPTS]
    SPEC_BUDGET=0 .venv/bin/python bench/speculation/rewrite-decode.py     speculation off
    PYTHONPATH=/tmp/old-worktree .venv/bin/python bench/speculation/rewrite-decode.py   another commit
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from appliance import cpu
from appliance.bench.prompts import DEFAULT_SYSTEM, REWRITE_PROMPTS
from appliance.config import load
from appliance.model import llm as L
from appliance.ops.serve import build_engine
from appliance.sampling import SamplingParams

MODEL = Path(__file__).resolve().parents[2] / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
steps: dict[int, list[float]] = defaultdict(list)  # rows -> seconds in llama_decode, decode phase only
timing = False
_decode = L.LLM.decode


def timed_decode(self: Any, tokens: list[int], *a: Any, **k: Any) -> None:
    t = time.perf_counter()
    try:
        _decode(self, tokens, *a, **k)
    finally:
        if timing:
            steps[len(tokens)].append(time.perf_counter() - t)


async def main(n_prompts: int) -> None:
    global timing
    cpu.set_thread_waiting(os.environ)  # as serve runs llama.cpp's threads
    L.LLM.decode = timed_decode  # type: ignore[method-assign,assignment]
    cfg, _ = load({"spec_budget": os.environ.get("SPEC_BUDGET", "16"), "state_dir": ""}, environ={})
    eng = build_engine(cfg, MODEL)
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 120)
    decoding = prefill = 0.0
    tokens = 0
    for text in REWRITE_PROMPTS[:n_prompts]:
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": text}]
        prompt = await eng.prepare(messages, 160)
        t0 = time.perf_counter()
        first = 0.0
        async for _ in eng.submit(prompt, SamplingParams(max_tokens=160, temperature=0.0), client="one").events():
            if not first:
                first, timing = time.perf_counter(), True
            tokens += 1
        timing = False
        decoding += time.perf_counter() - first
        prefill += first - t0
    c = eng.snapshot.counters
    print(f"{n_prompts} prompts, {tokens} events: first token to last {decoding * 1000:.0f} ms, "
          f"before the first {prefill * 1000:.0f} ms; {c.draft_tokens} draft tokens, {c.draft_accepted} kept")
    n_steps = sum(len(v) for v in steps.values())
    inside = sum(sum(v) for v in steps.values())
    print(f"{n_steps} decode steps, {inside * 1000:.0f} ms in llama_decode, "
          f"{(decoding - inside) * 1000 / max(1, n_steps):.2f} ms per step beyond it")
    for rows, times in sorted(steps.items()):
        print(f"  {rows:3d} rows: {len(times):5d} steps, median {statistics.median(times) * 1000:.1f} ms")
    eng.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
