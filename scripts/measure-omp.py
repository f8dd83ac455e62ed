#!/usr/bin/env python3
"""A/B of llama.cpp's thread waiting (docs/BENCHMARKS.md, "spinning or passive waiting"):
the real appliance (8 slots, drafts off) with OMP_WAIT_POLICY unset (spin) and `passive`,
alternating, twice each; one and then eight concurrent streams of 96 greedy tokens.
Prints tokens/s over all streams. Run it on a quiet machine, then again with a busy core
(e.g. `taskset -c 0 sh -c 'while :; do :; done' &`).

    .venv/bin/python scripts/measure-omp.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from live import start  # noqa: E402

from appliance import sse  # noqa: E402

MODEL = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def run(env: dict[str, str], log_dir: Path) -> dict[int, float]:
    live = start(MODEL, log_dir, "--slots", "8", "--spec-budget", "0", env=env)
    live.wait_ready()
    out: dict[int, float] = {}
    try:
        for n in (1, 8):
            def one(i: int) -> int:
                body = {"messages": [{"role": "user", "content": f"Write the numbers from {i} to 300, one per line."}],
                        "stream": True, "max_tokens": 96, "temperature": 0}
                with live.user_client(i).stream("POST", "/v1/chat/completions", json=body) as r:
                    return sum(1 for ev in sse.iter_events(sse.lines(r.iter_text()))
                               if isinstance(ev, dict) and sse.content(ev))

            t0 = time.monotonic()
            with ThreadPoolExecutor(n) as pool:
                tokens = sum(pool.map(one, range(n)))
            out[n] = round(tokens / (time.monotonic() - t0), 1)
    finally:
        live.stop()
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        for env in ({}, {"OMP_WAIT_POLICY": "passive"}, {}, {"OMP_WAIT_POLICY": "passive"}):
            print(env.get("OMP_WAIT_POLICY", "spin"), run(env, Path(d)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
