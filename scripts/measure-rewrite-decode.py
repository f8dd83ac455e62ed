"""Rewriting at one client without HTTP: the bench's rewrite prompts through `Engine` one
after another (one client, greedy, 160 tokens), and the time from each answer's first token
to its last, where speculation acts (docs/BENCHMARKS.md, "Draft rows in whole tiles").

    .venv/bin/python scripts/measure-rewrite-decode.py [N_PROMPTS]
    SPEC_BUDGET=0 .venv/bin/python scripts/measure-rewrite-decode.py     speculation off
    PYTHONPATH=/tmp/old-worktree .venv/bin/python scripts/measure-rewrite-decode.py   another commit
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from appliance import cpu
from appliance.bench.prompts import DEFAULT_SYSTEM, REWRITE_PROMPTS
from appliance.config import load
from appliance.sampling import SamplingParams
from appliance.serve import build_engine

MODEL = Path(__file__).resolve().parent.parent / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


async def main(n_prompts: int) -> None:
    cpu.set_thread_waiting(os.environ)  # as serve runs llama.cpp's threads
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
            first = first or time.perf_counter()
            tokens += 1
        decoding += time.perf_counter() - first
        prefill += first - t0
    c = eng.snapshot.counters
    print(f"{n_prompts} prompts, {tokens} events: first token to last {decoding * 1000:.0f} ms, "
          f"before the first {prefill * 1000:.0f} ms; {c.draft_tokens} draft tokens, {c.draft_accepted} kept")
    eng.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
