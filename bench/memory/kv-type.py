#!/usr/bin/env python3
"""KV cache precision f16 vs q8_0 on the real model: memory, prompt and batched decode
speed, and quality as agreement of greedy tokens with f16 (same prompts, same schedule).
Usage: .venv/bin/python bench/memory/kv-type.py MODEL.gguf"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from appliance import cpu
from appliance.config import Config
from appliance.model.llm import LLM, ContextSpec

PROMPTS = [
    "Explain what a KV cache is in two sentences.",
    "Write a Python function that reverses a string.",
    "List three things to check before printing a long document.",
    "What is the capital of Australia, and why is it not Sydney?",
    "用中文简单介绍一下太阳系。",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Give me a short checklist for onboarding a new colleague.",
    "How do I find the largest file in a directory on Linux?",
]
N_GEN = 64


def run(model: Path, kv_type: str) -> tuple[list[list[int]], float, float, list[list[np.ndarray]]]:
    threads = cpu.choose_threads(Config(), cpu.allowed_cpus())
    m = LLM(model, ContextSpec(n_ctx=8192, n_seq_max=8, n_batch=512, threads=threads,
                               repack=cpu.use_repack(Config()), kv_type=kv_type))
    tok = m.tokenizer
    prompts = [tok.tokenize(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n") for p in PROMPTS]
    toks, pos, seqs, want = [], [], [], []
    for s, p in enumerate(prompts):
        toks += p
        pos += range(len(p))
        seqs += [s] * len(p)
        want += [False] * (len(p) - 1) + [True]
    t0 = time.perf_counter()
    m.decode(toks, pos, seqs, want)
    pp = len(toks) / (time.perf_counter() - t0)
    rows = np.cumsum([len(p) for p in prompts]) - 1
    out: list[list[int]] = [[] for _ in prompts]
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    t0 = time.perf_counter()
    for step in range(N_GEN):
        for s, r in enumerate(rows):
            lg = m.logits_rows(int(r), 1)[0].copy()  # a view until the next decode: kept, so copied
            logits[s].append(lg)
            out[s].append(int(np.argmax(lg)))
        m.decode([o[-1] for o in out], [len(p) + step for p in prompts], list(range(8)), [True] * 8)
        rows = np.arange(8)
    tg = 8 * N_GEN / (time.perf_counter() - t0)
    m.close()
    return out, pp, tg, logits


def main() -> None:
    model = Path(sys.argv[1])
    base, pp16, tg16, lg16 = run(model, "f16")
    q8, pp8, tg8, lg8 = run(model, "q8_0")
    same_prefix = []
    top5 = []
    for a, b, la, lb in zip(base, q8, lg16, lg8):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        same_prefix.append(n)
        # Over the steps both runs share, is f16's greedy token among q8_0's top 5?
        top5 += [int(np.argmax(x)) in np.argsort(y)[-5:] for x, y in zip(la[:n + 1], lb[:n + 1])]
    print(f"{'kv':>5} {'bytes/token':>12} {'prompt tok/s':>13} {'8-seq decode tok/s':>19}")
    print(f"{'f16':>5} {12288:>12} {pp16:>13.1f} {tg16:>19.1f}")
    print(f"{'q8_0':>5} {6528:>12} {pp8:>13.1f} {tg8:>19.1f}")
    print(f"greedy tokens identical to f16 before the first difference, per prompt: {same_prefix} of {N_GEN}")
    print(f"f16's greedy token within q8_0's top 5 (up to and at the first difference): "
          f"{100 * sum(top5) / len(top5):.1f}%")


if __name__ == "__main__":
    main()
