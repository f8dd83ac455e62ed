"""Run the composed process (compose.py) behind uvicorn, with a graceful drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import uvicorn

from appliance import cpu
from appliance.config import Config
from appliance.engine.engine import Engine, EngineState
from appliance.http import conn
from appliance.http.app import create_app
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing
from appliance.ops.compose import compose
from appliance.ops.https import Https
from appliance.ops.notify import Notifier, Watchdog
from appliance.tls.hsts import hsts

log = logging.getLogger(__name__)


def supervise(engine: Engine, notifier: Notifier, listening: Any = lambda: True) -> Watchdog:
    """systemd's view of us: READY=1 once the model is loaded and the port open, then
    watchdog pings for as long as the engine loop makes progress."""
    def ready() -> bool | None:
        if engine.state is EngineState.FAILED:
            return False
        return True if engine.state is not EngineState.LOADING and listening() else None

    def status() -> str:
        if engine.stalled_s:
            return f"stalled: one engine step has been running for {engine.stalled_s:.0f} s"
        snap = engine.snapshot
        return f"{engine.status}: {snap.running} of {snap.slots} slots busy, {snap.queue} queued"

    def alive() -> bool | None:
        # STOPPED is an ordinary stop (SIGTERM), not a stall: it came before the watchdog's
        # own stop in 2 of 8 stops and was logged as an error.
        return None if engine.state is EngineState.STOPPED else engine.status in ("ok", "draining")

    return Watchdog(notifier, ready, alive, status)


class _Server(uvicorn.Server):
    """On the first SIGTERM/SIGINT: stop admitting (/health says draining), let running
    streams finish within the grace period, then stop the engine (answers still running end
    with the `shutting_down` error event and their conversations are saved), wait for the
    responses to be written, and only then let uvicorn shut down: uvicorn cancelling the
    request tasks cut 7 of 8 streams mid-body with no word. A second signal exits at once."""

    LAST_WRITES_S = 5.0  # after the engine stopped: the error events and stream ends reach their clients

    def __init__(self, config: uvicorn.Config, engine: Engine, grace_s: float, keys: KeyRing | None = None,
                 notifier: Notifier | None = None, https: Https | None = None) -> None:
        super().__init__(config)
        self.engine = engine
        self.keys = keys
        self.https = https
        self.notifier = notifier or Notifier()
        self.grace_s = grace_s
        self._draining = False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        if self.keys is not None:  # SIGHUP re-reads the keys file (systemctl reload)
            self.loop.add_signal_handler(signal.SIGHUP, self.keys.reload)
        plain = await self.https.plain_listener(self.config.host) if self.https is not None else None
        try:
            await super().serve(sockets)
        finally:
            if plain is not None:
                plain.close()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._draining:
            return super().handle_exit(sig, frame)
        self._draining = True
        log.info("signal %d: draining (grace %.0f s)", sig, self.grace_s)
        self.notifier.send("STOPPING=1", "STATUS=draining")
        self.engine.drain()
        asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.grace_s
        while self.engine.n_active and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.engine.n_active:
            log.info("grace over: %d answers still running end with shutting_down, their conversations saved",
                     self.engine.n_active)
        # The engine thread fails what still runs (keeping its KV), saves the sessions and
        # exits; its last events reach the streams through the loop meanwhile.
        await asyncio.to_thread(self.engine.stop)
        deadline = time.monotonic() + self.LAST_WRITES_S
        while any(not t.done() for t in self.server_state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.should_exit = True


def serve(cfg: Config, model_path: Path) -> int:
    # Set before llama.cpp (and libgomp) load in the engine thread.
    cpu.set_thread_waiting(os.environ, cfg.share_cores == "on")
    server: _Server | None = None

    def fatal() -> None:
        # Called from the engine thread: a dead engine means a useless server, so exit
        # (non-zero) and let systemd restart us rather than answer 503 forever.
        if server is not None and server.loop is not None:
            server.loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    process = compose(cfg, model_path, fatal)  # compose.py: every service built from the config
    engine = process.engine
    # A hang the watchdog kills (SIGABRT) leaves every thread's Python stack in the journal.
    faulthandler.enable()
    notifier = Notifier.from_env()
    app: Any = create_app(process.app)
    http: type[asyncio.Protocol] = conn.http_protocol(cfg.request_deadline_s, cfg.max_conns_per_client,
                                                      parse_networks(cfg.trusted_proxies), cfg.response_stall_s)
    https = process.https
    if https is not None:  # TLS per connection (tls/listener.py): uvicorn itself listens plain
        app, http = hsts(app), https.protocol(http)
    ucfg = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False, lifespan="on",
                          # _drain has waited grace_s already: what is left gets a few seconds.
                          timeout_graceful_shutdown=max(1, min(5, int(cfg.grace_s))), http=http)
    server = _Server(ucfg, engine, cfg.grace_s, process.keys, notifier, https)
    watchdog = supervise(engine, notifier, lambda: server.started)
    helpers = [watchdog] + ([https.renewer] if https is not None and https.renewer is not None else [])
    for worker in helpers:
        worker.start()
        process.app.beside.append(worker)  # /admin/status lists them with the app's workers
    try:
        server.run()
    finally:
        for worker in helpers:
            worker.stop()
        notifier.close()
    return 1 if engine.state is EngineState.FAILED else 0
