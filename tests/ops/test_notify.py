"""notify.py and faults.py: systemd's notify protocol against a fake NOTIFY_SOCKET, the
watchdog that pings only while the engine makes progress, and the test-only fault hook,
over the fake model in-process (tests/ops/test_watchdog_live.py does it on the real server)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers.fakes import FakeModel, FakeSystemd, Pauses
from helpers.polling import wait_until
from starlette.testclient import TestClient

from appliance.config import ConfigError
from appliance.config import load as load_config
from appliance.engine import faults
from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.app import create_app
from appliance.http.metrics import Metrics
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.ops.notify import Notifier, Watchdog
from appliance.ops.serve import supervise

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def systemd() -> Iterator[FakeSystemd]:
    fake = FakeSystemd()
    yield fake
    fake.close()


# -- the protocol ------------------------------------------------------------------------
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notifier_sends_one_datagram_per_message(abstract: bool) -> None:
    fake = FakeSystemd(abstract=abstract)
    try:
        n = Notifier.from_env(fake.env(watchdog_s=2.5))
        assert n.enabled and n.watchdog_s == 2.5
        assert n.send("READY=1", "STATUS=ok: 0 of 2 slots busy")
        assert n.send("WATCHDOG=1")
        wait_until(lambda: len(fake.received) == 2)
        assert fake.messages() == ["READY=1\nSTATUS=ok: 0 of 2 slots busy", "WATCHDOG=1"]
        n.close()
    finally:
        fake.close()


def test_watchdog_settings_come_from_the_environment() -> None:
    assert Notifier.from_env({}).enabled is False
    assert Notifier.from_env({}).send("READY=1") is False  # not under systemd: nothing to do
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}
    assert Notifier.from_env(env).watchdog_s == 30.0
    # WATCHDOG_PID names the process the watchdog is for; another process must not ping.
    assert Notifier.from_env({**env, "WATCHDOG_PID": "1"}, pid=1).watchdog_s == 30.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "1"}, pid=2).watchdog_s == 0.0
    assert Notifier.from_env({**env, "WATCHDOG_USEC": "soon"}).watchdog_s == 0.0


def test_a_missing_socket_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    n = Notifier("/nonexistent/notify.sock", 1.0)
    assert n.send("READY=1") is False and n.send("WATCHDOG=1") is False
    assert sum("cannot notify systemd" in r.getMessage() for r in caplog.records) == 1


def test_watchdog_says_ready_then_pings_only_while_alive(systemd: FakeSystemd) -> None:
    state: dict[str, Any] = {"ready": None, "alive": True, "dead_ticks": 0}

    def alive() -> bool:  # the watchdog asks once a tick: ticks are counted, not timed
        state["dead_ticks"] += not state["alive"]
        return bool(state["alive"])

    dog = Watchdog(Notifier.from_env(systemd.env(watchdog_s=0.2)), lambda: state["ready"],
                   alive, lambda: "stalled" if not state["alive"] else "ok")
    assert dog.tick_s == pytest.approx(0.05)
    dog.start()
    try:
        time.sleep(0.2)
        assert systemd.messages() == []  # nothing while starting
        state["ready"] = True
        systemd.wait_for("READY=1", 2)
        wait_until(lambda: len(systemd.pings()) >= 3)
        assert systemd.messages()[0] == "READY=1\nSTATUS=ok"  # READY before any ping
        state["alive"] = False
        wait_until(lambda: state["dead_ticks"] >= 1 and len(systemd.pings()) == dog.pings)  # a ping on its way lands
        n = len(systemd.pings())
        wait_until(lambda: state["dead_ticks"] >= 11)  # 10 ticks
        assert len(systemd.pings()) == n
        assert "STATUS=stalled" in systemd.messages()
        state["alive"] = True
        wait_until(lambda: len(systemd.pings()) > n + 2)
    finally:
        dog.stop()


def test_a_failed_start_sends_nothing(systemd: FakeSystemd) -> None:
    dog = Watchdog(Notifier.from_env(systemd.env(watchdog_s=0.2)), lambda: False, lambda: True)
    dog.start()
    dog._thread.join(2)
    assert not dog._thread.is_alive() and systemd.messages() == []


# -- the fault hook ----------------------------------------------------------------------
def test_fault_specs() -> None:
    assert faults.parse("decode-block") == faults.Fault("decode-block", math.inf, 0)
    assert faults.parse("decode-block:2.5@3") == faults.Fault("decode-block", 2.5, 3)
    assert faults.parse("decode-fail") == faults.Fault("decode-fail", 1.0, 0)
    assert faults.parse("decode-fail:2") == faults.Fault("decode-fail", 2.0, 0)
    assert faults.from_env({}) is None
    for bad in ("decode-hang", "decode-block:x", "decode-fail@", "1"):
        with pytest.raises(ConfigError, match="APPLIANCE_FAULT"):
            faults.parse(bad)
    # Read by faults.py (and setup.sh), not settings: the configuration loader lets them through.
    cfg, _ = load_config(environ={"APPLIANCE_FAULT": "decode-fail", "APPLIANCE_PORTABLE": "1", "APPLIANCE_SLOTS": "3"})
    assert cfg.slots == 3
    with pytest.raises(ConfigError, match="APPLIANCE_FAUL"):
        load_config(environ={"APPLIANCE_FAUL": "decode-fail"})  # a typo is still an error


def test_fault_wraps_only_decode_and_counts_from_arming(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FakeModel()
    faults.inject(m, faults.Fault("decode-fail", 2, after=1))
    m.decode([1], [0], [0], [True])  # the one good decode
    for _ in range(2):
        with pytest.raises(RuntimeError, match="injected"):
            m.decode([2], [1], [0], [True])
    m.decode([2], [1], [0], [True])
    assert len(m.calls) == 2  # the failed ones never reached the model
    blocked = FakeModel()
    pauses = Pauses()
    monkeypatch.setattr(faults, "threading", pauses)
    faults.inject(blocked, faults.Fault("decode-block", 0.3))
    blocked.decode([1], [0], [0], [True])
    blocked.decode([2], [1], [0], [True])  # only the first one blocks
    assert pauses.seconds == [0.3] and len(blocked.calls) == 2


# -- the engine, its /health and systemd together ------------------------------------------
@contextmanager
def app_with(fault: faults.Fault | None, stall_s: float, notifier: Notifier | None = None
             ) -> Iterator[tuple[TestClient, Engine, Watchdog | None]]:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=512, max_wait_s=0.0)
    engine = Engine(lambda: FakeModel(reply="hello"), EngineOptions(limits, CachePolicy(n_seq=6), stall_s=stall_s, fault=fault))
    metrics = Metrics()
    metrics.attach(engine)
    app = create_app(App(engine, "fake-model", RequestBounds(default_max_tokens=32, max_tokens_limit=64, ctx_limit=512),
                         metrics=metrics))
    dog = supervise(engine, notifier) if notifier is not None else None
    with TestClient(app, base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        if dog is not None:
            dog.start()
        try:
            wait_until(lambda: client.get("/health").status_code == 200)
            yield client, engine, dog
        finally:
            if dog is not None:
                dog.stop()


def test_systemd_sees_ready_then_pings_that_stop_while_a_decode_blocks(systemd: FakeSystemd) -> None:
    """The issue's check: READY=1, then watchdog pings; a decode that blocks (3 s, stall
    limit 1 s) stops them and /health says stalled meanwhile; then both recover."""
    notifier = Notifier.from_env(systemd.env(watchdog_s=0.4))
    with app_with(faults.Fault("decode-block", 3.0), stall_s=1.0, notifier=notifier) as (client, engine, dog):
        t_ready = systemd.wait_for("READY=1", 5)
        wait_until(lambda: len([t for t in systemd.pings() if t > t_ready]) >= 5)
        health = client.get("/health").json()
        assert health["status"] == "ok" and "stalled_s" not in health
        assert health["memory"]["total_bytes"] > 0 and "throttled" in health["thermal"]

        with cf.ThreadPoolExecutor(1) as pool:
            t_sent = time.monotonic()
            answer = pool.submit(client.post, "/v1/chat/completions", json={"messages": USER})
            stalled: list[tuple[float, dict[str, Any]]] = []
            while not answer.done():
                r = client.get("/health")
                if r.status_code == 503:
                    stalled.append((time.monotonic(), r.json()))
                    if len(stalled) == 1:
                        metrics = client.get("/metrics").text
                time.sleep(0.05)
            assert answer.result().status_code == 200
            assert answer.result().json()["choices"][0]["message"]["content"] == "hello"
        t_done = time.monotonic()

        assert stalled, "health never said stalled"
        assert {b["status"] for _, b in stalled} == {"stalled"}
        assert all(b["stalled_s"] >= 1.0 for _, b in stalled)
        assert stalled[0][0] - t_sent > 1.0  # once the step outlived stall_s (how late a busy machine says so: no bound)
        stalled_line = next(ln for ln in metrics.splitlines() if ln.startswith("appliance_engine_stalled_seconds "))
        assert float(stalled_line.split()[1]) > 1.0

        # Recovered: pings again, and health says ok.
        wait_until(lambda: len([t for t in systemd.pings() if t > t_done]) >= 3)
        assert client.get("/health").json()["status"] == "ok"

        # No ping while health said stalled: the longest silence covers that whole window
        # and is longer than WatchdogSec, so systemd would have restarted us.
        pings = systemd.pings()
        gap, start, end = max((b - a, a, b) for a, b in zip(pings, pings[1:]))
        assert gap > notifier.watchdog_s and gap > 1.5, [round(p - t_sent, 2) for p in pings]
        assert start < stalled[0][0] and stalled[-1][0] < end
        assert any("STATUS=stalled: one engine step has been running for" in m for m in systemd.messages())
        assert engine.stalled_s == 0.0


def test_a_failing_decode_fails_its_request_and_the_server_carries_on() -> None:
    with app_with(faults.Fault("decode-fail", 1), stall_s=5.0) as (client, engine, _):
        r = client.post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 500 and "injected decode failure" in r.json()["error"]["message"]
        r = client.post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
        assert client.get("/health").json()["status"] == "ok"


def test_an_ordinary_stop_ends_the_pings_without_an_error(systemd: FakeSystemd, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 47: a SIGTERM stops the engine a moment before the watchdog; that was logged as
    # "ERROR ... watchdog pings stopped" in 2 of 8 stops.
    state: dict[str, bool | None] = {"alive": True}
    dog = Watchdog(Notifier.from_env(systemd.env(watchdog_s=0.2)), lambda: True, lambda: state["alive"], lambda: "ok")
    with caplog.at_level(logging.INFO, logger="appliance.ops.notify"):
        dog.start()
        try:
            wait_until(lambda: len(systemd.pings()) >= 2)
            state["alive"] = None  # the engine is STOPPED
            dog._thread.join(5)
            assert not dog._thread.is_alive()
        finally:
            dog.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("watchdog pings end" in r.getMessage() for r in caplog.records)
    assert not any("STATUS=stalled" in m for m in systemd.messages())


def test_supervise_takes_a_stopped_engine_as_an_ordinary_stop(systemd: FakeSystemd, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier.from_env(systemd.env(watchdog_s=0.2))
    with caplog.at_level(logging.INFO, logger="appliance.ops.notify"):
        with app_with(None, stall_s=1.0, notifier=notifier) as (_client, engine, dog):
            assert dog is not None
            t_ready = systemd.wait_for("READY=1", 5)
            wait_until(lambda: len([t for t in systemd.pings() if t > t_ready]) >= 2)
            engine.stop()  # as _Server._drain does, before the watchdog is stopped
            dog._thread.join(5)
            assert not dog._thread.is_alive()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("watchdog pings end" in r.getMessage() for r in caplog.records)
