"""How long one llama_decode takes with 1, 2, 4, 8 and 16 rows (one sequence, 300 tokens of
context), with logits for every row (as drafts need) or the last only. The speculation
budget in appliance/engine/spec.py comes from these numbers.

    .venv/bin/python bench/speculation/rows.py
    ALL=1 ROWS="$(seq -s ' ' 1 20)" .venv/bin/python bench/speculation/rows.py   every count, all logits
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from appliance import cpu
from appliance.config import Config
from appliance.model.llm import LLM, ContextSpec

MODEL = Path(__file__).resolve().parents[2] / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def main() -> None:
    cfg = Config()
    spec = ContextSpec(n_ctx=4096, n_seq_max=2, n_batch=512, threads=cpu.choose_threads(cfg, cpu.choose_cpus(cfg)),
                       repack=cpu.use_repack(cfg))
    m = LLM(MODEL, spec)
    toks = m.tokenizer.tokenize("hello world " * 150)[:300]
    m.decode(toks, list(range(300)), [0] * 300, [False] * 299 + [True])
    for rows in (int(x) for x in os.environ.get("ROWS", "1 2 4 8 16").split()):
        for all_logits in ((True,) if os.environ.get("ALL") else (True, False)):
            times = []
            for _ in range(6):
                t0 = time.perf_counter()
                m.decode(toks[:rows], list(range(300, 300 + rows)), [0] * rows, [all_logits] * (rows - 1) + [True])
                times.append(time.perf_counter() - t0)
                m.seq_rm(0, 300, -1)
            times.sort()
            print(f"{rows:2d} rows, logits for {'every row' if all_logits else 'the last '}: "
                  f"{1000 * times[len(times) // 2]:.1f} ms (median of 6)")


if __name__ == "__main__":
    main()
