"""The real `appliance serve` under a fake systemd: READY=1 once the model is loaded, watchdog
pings while the engine works, none while a decode hangs (APPLIANCE_FAULT), /health
"stalled" meanwhile, and STOPPING=1 on the way out."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.fakes import FakeSystemd
from helpers.live import Live
from helpers.polling import wait_until

pytestmark = pytest.mark.integration

WATCHDOG_S = 1.0  # what WatchdogSec= would be
STALL_S = 2.0
BLOCK_S = 6.0


def test_real_server_pings_systemd_only_while_its_engine_makes_progress(start_server: Callable[..., Live]) -> None:
    systemd = FakeSystemd()
    env = {**systemd.env(WATCHDOG_S), "APPLIANCE_FAULT": f"decode-block:{BLOCK_S}"}
    live = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, stall_s=STALL_S, env=env)
    try:
        live.wait_ready()
        t_ready = systemd.wait_for("READY=1", 5)
        first = systemd.messages()[0]
        assert first.startswith("READY=1\nSTATUS=ok: 0 of 2 slots busy"), first
        wait_until(lambda: len(systemd.pings()) >= 4, 5, "four pings", seen=systemd.messages)
        assert min(systemd.pings()) > t_ready  # no ping before READY=1
        assert live.health()["status"] == "ok"
        workers = {w["name"]: w for w in live.client.get("/admin/status").json()["workers"]}
        assert workers["watchdog"]["alive"]  # serve.py hands it to the app's list

        # The first decode after start-up blocks for BLOCK_S: the chat's prompt.
        stalled: list[tuple[float, dict[str, Any]]] = []
        with cf.ThreadPoolExecutor(1) as pool:
            t_sent = time.monotonic()
            answer = pool.submit(live.chat, [{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0)
            while not answer.done():
                r = live.client.get("/health")
                if r.status_code == 503:
                    stalled.append((time.monotonic(), r.json()))
                time.sleep(0.1)
            r = answer.result()
            t_answered = time.monotonic()
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        assert time.monotonic() - t_sent >= BLOCK_S

        assert stalled and {b["status"] for _, b in stalled} == {"stalled"}, stalled
        # Reported stalled once STALL_S had passed, and while the decode still blocked (before the
        # answer came back): the order, not how soon after STALL_S a busy machine polled.
        assert STALL_S <= stalled[0][0] - t_sent
        assert stalled[-1][0] < t_answered
        assert all(b["stalled_s"] >= STALL_S for _, b in stalled)

        # Pings resume, and the silence spanned the whole stalled window: longer than
        # WatchdogSec, so systemd would have killed and restarted us.
        t_done = time.monotonic()
        wait_until(lambda: [t for t in systemd.pings() if t > t_done], 5, "the pings to resume")
        assert live.health()["status"] == "ok"
        pings = systemd.pings()
        gap, start_, end = max((b - a, a, b) for a, b in zip(pings, pings[1:]))
        assert gap > BLOCK_S - STALL_S - 1 and gap > WATCHDOG_S
        assert start_ < stalled[0][0] and stalled[-1][0] < end
        # Elsewhere the pings came every quarter of WatchdogSec: not more often (how much later a
        # busy machine wakes the timer is not bounded here).
        others = sorted(b - a for a, b in zip(pings, pings[1:]) if (b - a) != gap)
        assert others[len(others) // 2] >= WATCHDOG_S / 4 - 0.1
        assert "watchdog pings stopped" in live.log() and "watchdog pings resume" in live.log()
        assert any(m.startswith("STATUS=stalled: one engine step has been running for") for m in systemd.messages())
    finally:
        rc = live.stop()
        systemd.close()
    assert rc == 0
    assert "STOPPING=1\nSTATUS=draining" in systemd.messages()
