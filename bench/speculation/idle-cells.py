"""How much idle KV cells slow a decode step: two contexts on the bundled model, each with 16
sequences of 200 tokens, one of them also holding 12 idle 1,000-token conversations; 16-row
decode steps alternated between the two (docs/benchmarks/speculation.md, issue 7). `idle_kv_tokens`
comes from this: a step attends over the cache's whole used range, idle cells included.

    .venv/bin/python bench/speculation/idle-cells.py
"""

from __future__ import annotations

import time
from pathlib import Path

from appliance import cpu
from appliance.config import Config
from appliance.model.llm import LLM, ContextSpec

MODEL = Path(__file__).resolve().parents[2] / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
ACTIVE, CONTEXT = 16, 200


def prefill(m: LLM, toks: list[int], seq: int, n: int) -> None:
    for s in range(0, n, 512):
        k = min(512, n - s)
        m.decode(toks[s:s + k], list(range(s, s + k)), [seq] * k, [False] * (k - 1) + [True])


def step(m: LLM, tok: int, r: int) -> float:
    t0 = time.perf_counter()
    m.decode([tok] * ACTIVE, [CONTEXT + r] * ACTIVE, list(range(ACTIVE)), [True] * ACTIVE)
    return time.perf_counter() - t0


def main() -> None:
    cfg = Config()
    spec = ContextSpec(n_ctx=16384, n_seq_max=40, n_batch=512, n_ubatch=256,
                       threads=cpu.choose_threads(cfg, cpu.choose_cpus(cfg)), repack=cpu.use_repack(cfg))
    plain, crowded = LLM(MODEL, spec), LLM(MODEL, spec)
    toks = plain.tokenizer.tokenize("hello world, this is a test of many tokens. " * 2000)
    for m in (plain, crowded):
        for i in range(ACTIVE):
            prefill(m, toks, i, CONTEXT)
    for j in range(12):
        prefill(crowded, toks, 20 + j, 1000)
    times: dict[str, list[float]] = {"no idle cells": [], "12k idle cells": []}
    for r in range(24):
        times["no idle cells"].append(step(plain, toks[5], r % 8))
        times["12k idle cells"].append(step(crowded, toks[5], r % 8))
        if r % 8 == 7:  # back to the same context length
            for m in (plain, crowded):
                for i in range(ACTIVE):
                    m.seq_rm(i, CONTEXT, -1)
    for name, t in times.items():
        t.sort()
        print(f"{name}: 16-row step median {1000 * t[len(t) // 2]:.1f} ms, p25 {1000 * t[len(t) // 4]:.1f} ms")


if __name__ == "__main__":
    main()
