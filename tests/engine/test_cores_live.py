"""share_cores on the real server: while another process keeps one of its cores busy, the
engine decodes on one llama.cpp thread fewer, and takes the core back once it is free
(docs/benchmarks/threads.md, "Giving a busy core up instead"). Every answer comes back whole.

The mechanism is asserted, not a count a quiet machine would show: the thread count always
follows what the engine measured of others (engine/threads.py's rule), it drops to one when
the test's own busy process starts, and it comes back to two once that process ends if the
rest of the machine leaves the core free (a neighbour that keeps it busy keeps it at one,
and the measure says so)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from helpers.live import Live
from helpers.sse import content_of

from appliance.engine.threads import FREE, TAKE

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def gauge(live: Live, name: str, page: str = "") -> float:
    m = re.search(rf"^{name} (\S+)$", page or live.client.get("/metrics").text, re.M)
    assert m, name
    return float(m.group(1))


def share(live: Live) -> tuple[int, float]:
    """(llama.cpp threads, cores others used) from one /metrics page (one snapshot), checked
    against the rule: two threads only while others use at most TAKE of a core, one only
    while they use at least FREE (the hysteresis between them keeps the last decision)."""
    page = live.client.get("/metrics").text
    threads, others = int(gauge(live, "appliance_llama_threads", page)), gauge(live, "appliance_cores_used_by_others", page)
    assert (others <= TAKE) if threads == 2 else (threads == 1 and others >= FREE), (threads, others)
    return threads, others


def answer(live: Live, max_tokens: int) -> None:
    events = list(live.stream(PROMPT, max_tokens=max_tokens, temperature=0, seed=1))
    assert events[-1] == "[DONE]"
    finish = [e["choices"][0].get("finish_reason") for e in events if isinstance(e, dict) and e.get("choices")]
    assert finish[-1] == "length" and content_of(events)


def decode_until(live: Live, done: Callable[[int, float], bool], timeout_s: float = 120) -> tuple[int, float]:
    """Stream answers until done(threads, others) holds (the engine samples its cores only
    while it decodes, every half second), checking the rule at every look."""
    deadline = time.monotonic() + timeout_s
    while not done(*(now := share(live))):
        assert time.monotonic() < deadline, live.log()[-2000:]
        answer(live, 48)
    return now


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give one up")
def test_a_core_another_process_keeps_busy_is_given_up_then_taken_back(start_server: Callable[..., Live]) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    live = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, threads=2, cpus=",".join(map(str, cpus)))
    hog: subprocess.Popen[bytes] | None = None
    try:
        live.wait_ready()
        answer(live, 32)
        share(live)  # two threads on a quiet machine, one beside a busy neighbour: by the rule either way

        hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpus[0])])
        decode_until(live, lambda threads, others: threads == 1)
        assert gauge(live, "appliance_cores_used_by_others") >= TAKE
        assert "1 llama.cpp threads: others used" in live.log()
        answer(live, 64)  # decoding goes on beside the busy core

        hog.kill()
        hog.wait()
        hog = None
        answer(live, 48)  # samples taken after the busy process ended
        # The core comes back, unless the rest of the machine keeps it busy (FREE or more of it).
        threads, _ = decode_until(live, lambda threads, others: threads == 2 or others >= FREE)
        if threads == 2:
            assert "2 llama.cpp threads: others used" in live.log()
        assert live.wait_idle()["slots"]["busy"] == 0
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        assert live.stop() == 0
