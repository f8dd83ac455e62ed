"""share_cores on the real server: while another process keeps one of its cores busy, the
engine decodes on one llama.cpp thread fewer, and takes the core back once it is free
(docs/benchmarks/threads.md, "Giving a busy core up instead"). Every answer comes back whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.live import Live, start
from helpers.sse import content_of

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def gauge(live: Live, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", live.client.get("/metrics").text, re.M)
    assert m, name
    return float(m.group(1))


def answer(live: Live, max_tokens: int) -> None:
    events = list(live.stream(PROMPT, max_tokens=max_tokens, temperature=0, seed=1))
    assert events[-1] == "[DONE]"
    finish = [e["choices"][0].get("finish_reason") for e in events if isinstance(e, dict) and e.get("choices")]
    assert finish[-1] == "length" and content_of(events)


def decode_until(live: Live, threads: int, timeout_s: float = 60) -> None:
    """Stream answers until the engine runs `threads` llama.cpp threads (it samples its
    cores only while it decodes)."""
    deadline = time.monotonic() + timeout_s
    while gauge(live, "appliance_llama_threads") != threads:
        assert time.monotonic() < deadline, live.log()[-2000:]
        answer(live, 48)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give one up")
def test_a_core_another_process_keeps_busy_is_given_up_then_taken_back(bundled_model: Path, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    live = start(bundled_model, tmp_path, "--slots", "2", "--kv-tokens", "4096", "--ctx-per-slot", "1024",
                 "--threads", "2", "--cpus", ",".join(map(str, cpus)))
    hog: subprocess.Popen[bytes] | None = None
    try:
        live.wait_ready()
        answer(live, 32)
        assert gauge(live, "appliance_llama_threads") == 2  # a quiet machine: both cores

        hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpus[0])])
        decode_until(live, 1)
        assert gauge(live, "appliance_cores_used_by_others") >= 0.3
        assert "1 llama.cpp threads: others used" in live.log()
        answer(live, 64)  # decoding goes on beside the busy core

        hog.kill()
        hog.wait()
        hog = None
        decode_until(live, 2)
        assert "2 llama.cpp threads: others used" in live.log()
        assert live.wait_idle()["slots"]["busy"] == 0
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        assert live.stop() == 0
