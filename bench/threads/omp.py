#!/usr/bin/env python3
"""A/B of llama.cpp's thread waiting (docs/benchmarks/threads.md, "spinning or passive waiting"):
the real appliance (8 slots, drafts off) under each waiting setting, one and then eight
concurrent streams of 96 greedy tokens, tokens/s over all streams; each setting on a quiet
machine and with another process busy on core 0, alternating, twice.

    .venv/bin/python bench/threads/omp.py [NAME=VAR=VALUE ...]
    EXTRA_ARGS="--threads 1" CONDITIONS="busy quiet" ...     more server flags; other conditions

Default settings: passive (OMP_WAIT_POLICY=passive), spin200 / spin600 / spin2k
(GOMP_SPINCOUNT=N: spin N rounds, then sleep) and spin300k (libgomp's default count when
nothing is set, which is what llama.cpp gets by default).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from helpers.live import start  # noqa: E402

from appliance.bench import sse  # noqa: E402

MODEL = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def run(env: dict[str, str], log_dir: Path) -> dict[int, float]:
    live = start(MODEL, log_dir, "--slots", "8", "--spec-budget", "0", *os.environ.get("EXTRA_ARGS", "").split(), env=env)
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


SETTINGS = {"passive": {"OMP_WAIT_POLICY": "passive"}, "spin200": {"GOMP_SPINCOUNT": "200"},
            "spin600": {"GOMP_SPINCOUNT": "600"}, "spin2k": {"GOMP_SPINCOUNT": "2000"},
            "spin300k": {"GOMP_SPINCOUNT": "300000"}}


def main() -> int:
    settings = SETTINGS
    if sys.argv[1:]:  # e.g. spin1k=GOMP_SPINCOUNT=1000
        settings = {name: dict([kv.split("=", 1)]) for name, kv in (a.split("=", 1) for a in sys.argv[1:])}
    with tempfile.TemporaryDirectory() as d:
        for condition in os.environ.get("CONDITIONS", "quiet busy quiet busy").split():
            hog = (subprocess.Popen(["taskset", "-c", "0", "sh", "-c", "while :; do :; done"])
                   if condition == "busy" else None)
            try:
                for name, env in settings.items():
                    print(condition, name, run(env, Path(d)), flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
