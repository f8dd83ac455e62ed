#!/usr/bin/env python3
"""Restore (llama_state_seq_set_data) vs recompute (prefill) cost by history length, on the
real model: where parking a session pays off. Usage: .venv/bin/python bench/memory/restore.py MODEL.gguf"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from appliance import cpu
from appliance.config import Config
from appliance.model.llm import LLM, ContextSpec


def main() -> None:
    model = Path(sys.argv[1])
    threads = cpu.choose_threads(Config(), cpu.allowed_cpus())
    m = LLM(model, ContextSpec(n_ctx=8192, n_seq_max=4, n_batch=512, threads=threads,
                               repack=cpu.use_repack(Config())))
    text = "The office assistant answers questions about printers, rooms and lunch. " * 200
    toks = m.tokenizer.tokenize(text)
    print(f"{'tokens':>7} {'recompute ms':>13} {'save ms':>8} {'restore ms':>11} {'state KiB':>10}")
    for n in (8, 16, 32, 64, 128, 256, 512, 1024, 2048):
        seq = toks[:n]
        m.seq_rm(0)
        t0 = time.perf_counter()
        for i in range(0, n, 512):
            chunk = seq[i:i + 512]
            m.decode(chunk, list(range(i, i + len(chunk))), [0] * len(chunk), [False] * len(chunk))
        recompute = time.perf_counter() - t0
        t0 = time.perf_counter()
        data = m.seq_state(0)
        save = time.perf_counter() - t0
        m.seq_rm(1)
        t0 = time.perf_counter()
        ok = m.set_seq_state(1, data)
        restore = time.perf_counter() - t0
        assert ok and m.seq_pos_max(1) == n - 1
        print(f"{n:>7} {recompute * 1e3:>13.1f} {save * 1e3:>8.2f} {restore * 1e3:>11.2f} {len(data) / 1024:>10.0f}")
    m.close()


if __name__ == "__main__":
    main()
