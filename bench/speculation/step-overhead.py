"""What one stream's decode step costs beyond llama_decode, without HTTP: the defaults with
speculation off, one greedy stream of 128 tokens through `Engine`, three times
(docs/benchmarks/speculation.md, "Rewriting at one client, re-run").

    .venv/bin/python bench/speculation/step-overhead.py [MODEL]
    SPEC_BUDGET=16 .venv/bin/python bench/speculation/step-overhead.py    speculation on (the default)
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from appliance import cpu
from appliance.config import load
from appliance.model import llm as L
from appliance.ops.serve import build_engine
from appliance.sampling import SamplingParams

MODEL = Path(sys.argv[1] if len(sys.argv) > 1 else "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
in_decode = [0.0, 0]  # seconds inside llama_decode, calls
_decode = L.LLM.decode


def timed_decode(self: Any, *a: Any, **k: Any) -> None:
    t = time.perf_counter()
    try:
        _decode(self, *a, **k)
    finally:
        in_decode[0] += time.perf_counter() - t
        in_decode[1] += 1


async def main() -> None:
    cpu.set_thread_waiting(os.environ)  # as serve runs llama.cpp's threads
    L.LLM.decode = timed_decode  # type: ignore[method-assign]
    cfg, _ = load({"spec_budget": os.environ.get("SPEC_BUDGET", "0")}, environ={})
    eng = build_engine(cfg, MODEL)
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 120)
    for rep in range(3):
        h = eng.submit(list(range(1000, 1100)) + [rep], SamplingParams(max_tokens=128, temperature=0.0),
                       client=f"c{rep}")
        first, mark = 0.0, (0.0, 0)
        async for _ in h.events():
            if not first:  # from the first token on: decode steps only
                first, mark = time.perf_counter(), (in_decode[0], in_decode[1])
        steps = in_decode[1] - mark[1]
        wall = (time.perf_counter() - first) * 1000 / steps
        dec = (in_decode[0] - mark[0]) * 1000 / steps
        c = eng.snapshot.counters
        print(f"{steps} steps: {wall:.1f} ms per step, {dec:.1f} in llama_decode, {wall - dec:.1f} beyond it "
              f"({c.draft_tokens} draft tokens so far, {c.draft_accepted} kept)")
    eng.stop()


asyncio.run(main())
