"""Quality and prompt speed of GGUF files through the appliance's own llama.cpp.

    .venv/bin/python bench/memory/quant-quality.py REFERENCE.gguf [OTHER.gguf ...] [--json OUT]

For each file: size, prompt tokens/s (one 512-token prompt after a warm-up, the appliance's
ubatch_tokens default, 2 threads, no repack on this AMX-advertising VM), perplexity on
Debian's GPL-3 text as `llama-perplexity -c 512` computes it, and teacher-forced greedy
agreement with the first file (the share of positions where both pick the same top token).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from appliance import config, cpu
from appliance.model.llm import LLM, ContextSpec
from appliance.ops import quality, tune


def prompt_tps(path: Path, threads: int, repack: bool, ubatch: int) -> float:
    llm = LLM(path, ContextSpec(n_ctx=1024, n_seq_max=1, n_batch=512, threads=threads, repack=repack, n_ubatch=ubatch))
    try:
        toks = [1000 + (i * 7919) % 20000 for i in range(512)]
        best = 0.0
        for _ in range(3):
            llm.seq_rm(0)
            t0 = time.perf_counter()
            llm.decode(toks, list(range(512)), [0] * 512, [False] * 511 + [True])
            best = max(best, 512 / (time.perf_counter() - t0))
        return best
    finally:
        llm.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--chunks", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    cfg = config.Config()
    repack = cpu.use_repack(cfg)
    threads = args.threads or len(tune.pick_cpus(cpu.allowed_cpus())[0])
    rows = []
    ref = None
    for f in args.files:
        t0 = time.monotonic()
        q = quality.perplexity(f, Path(quality.PPL_TEXT), args.chunks, threads=threads, repack=repack)
        ref = ref or q
        row = {"file": f.name, "mib": round(f.stat().st_size / 2**20),
               "prompt_tps": round(prompt_tps(f, threads, repack, cfg.ubatch_tokens)),
               "ppl": round(q.ppl, 3), "agreement": round(quality.agreement(ref, q), 4),
               "positions": len(q.top), "seconds": round(time.monotonic() - t0)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
