"""Wire config -> engine -> app, and run uvicorn with a graceful drain on SIGTERM/SIGINT."""

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
from appliance.config import Config, ConfigError
from appliance.documents.document import DocumentLimits, MiB
from appliance.documents.reader import DocumentReader
from appliance.engine import faults
from appliance.engine.engine import Engine, EngineOptions, EngineState
from appliance.engine.kv.store import CachePolicy
from appliance.engine.model_api import Model
from appliance.engine.scheduler import Limits
from appliance.engine.threads import CoreShare
from appliance.http import conn
from appliance.http.accounting import Accounting
from appliance.http.app import create_app
from appliance.http.guard import GuardPolicy
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing, KeysFileError
from appliance.http.metrics import Metrics
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.ops.library import build_library
from appliance.ops.notify import Notifier, Watchdog
from appliance.usage.ledger import Ledger
from appliance.usage.shared import SharedUsageStore

log = logging.getLogger(__name__)



def document_reader(cfg: Config) -> DocumentReader:
    """The reader of uploaded documents, with the operator's size, page and time limits."""
    limits = DocumentLimits(max_bytes=cfg.document_max_mb * MiB, max_pages=cfg.document_max_pages,
                            wall_s=cfg.document_timeout_s, cpu_s=max(1, int(cfg.document_timeout_s / 2)))
    return DocumentReader(limits, workers=cfg.document_workers)

def people_store(cfg: Config) -> tuple[People | None, People | None]:
    """The store of people and chats (SQLite in state_dir, or PostgreSQL at database_url, which
    also takes the usage table so quotas count every box), and people mode's use of it (only
    with auth = people)."""
    store = People.open(cfg.state_dir, cfg.chat_retention_days, cfg.database_url, cfg.signin_header) \
        if cfg.auth == "people" or cfg.database_url else None
    return store, store if cfg.auth == "people" else None


def accounting(cfg: Config, people: People | None = None) -> Accounting:
    """Usage per person kept in state_dir, or in the store several boxes share (database_url),
    and the default quota (a key's own quota comes with the keys file, so SIGHUP's reload
    carries it)."""
    db = people.db if people is not None and cfg.database_url else None
    shared = (lambda: SharedUsageStore(db)) if db is not None else None
    return Accounting(Ledger(cfg.state_dir, cfg.usage_retention_days, shared=shared), cfg.quota_tokens_per_day)


def build_engine(cfg: Config, model_path: Path, on_fatal: Any = lambda: None) -> Engine:
    cpus = cpu.choose_cpus(cfg)
    threads = cpu.choose_threads(cfg, cpus)
    repack = cpu.use_repack(cfg)
    limits = Limits(
        slots=cfg.slots, batch_tokens=cfg.batch_tokens, prefill_chunk=cfg.prefill_chunk,
        prefill_steps=cfg.prefill_steps, prefill_group=cfg.prefill_group, kv_tokens=cfg.kv_tokens,
        ctx_limit=cfg.ctx_per_slot,
        max_wait_s=cfg.max_wait_ms / 1000, min_batch=cfg.min_batch, max_queue=cfg.max_queue,
        queue_timeout_s=cfg.queue_timeout_s, ageing_s=cfg.ageing_s, people_slots=cfg.people_slots,
        tools_tokens=cfg.tools_tokens)

    n_seq = cfg.slots + cfg.cached_sessions
    presets = tuple(cfg.system_prompts.values())
    park = cfg.park_ram_mb * 2**20 if cfg.park_ram_mb >= 0 else auto_park_bytes(model_path)
    policy = CachePolicy(n_seq=n_seq, ttl_s=cfg.session_ttl_s, share_all=cfg.prefix_sharing == "all",
                         park_bytes=park, restore_min_tokens=cfg.restore_min_tokens,
                         state_dir=cfg.state_dir, state_max_bytes=cfg.state_max_mb * 2**20,
                         save_timeout_s=cfg.save_timeout_s, memory=cpu.read_memory,
                         idle_kv_tokens=cfg.kv_tokens // 4 if cfg.idle_kv_tokens < 0 else cfg.idle_kv_tokens,
                         common_prompts=cfg.common_system_prompts)

    def load() -> Model:
        from appliance.model.llm import LLM, ContextSpec  # imported here: only the engine thread loads llama.cpp

        # Beyond the sessions' ids: one per public prefix (the default system prompt + presets),
        # then one per system prompt that may become public once common.
        n_public = 1 + len(presets) + cfg.common_system_prompts
        spec = ContextSpec(n_ctx=cfg.kv_tokens, n_seq_max=n_seq + n_public, n_batch=cfg.batch_tokens, threads=threads,
                           repack=repack, kv_type=cfg.kv_type, n_ubatch=cfg.ubatch_tokens)
        log.info("loading %s: %d slots x %d tokens, %d KV cells, %d threads on CPUs %s, repack %s",
                 model_path, cfg.slots, cfg.ctx_per_slot, cfg.kv_tokens, threads, cpus, "on" if repack else "off")
        return LLM(model_path, spec)

    cores = (CoreShare(len(cpus), threads, lambda: cpu.cpu_seconds(cpus), time.monotonic)
             if cfg.share_cores == "on" else None)
    return Engine(load, EngineOptions(limits, policy, max_per_client=cfg.max_per_client, presets=presets,
                  spec_budget=cfg.spec_budget, cores=cores,
                  request_timeout_s=cfg.request_timeout_s,
                  pin=lambda: cpu.pin_current_thread(cpus), on_fatal=on_fatal,
                  stall_s=cfg.stall_s, fault=faults.from_env(os.environ)))


def auto_park_bytes(model_path: Path) -> int:
    """park_ram_mb = -1: a quarter of the memory available at start-up beyond the model
    file, so a 1 GiB board parks little and a big PC a lot. It is a ceiling: while
    serving, parking yields whenever memory runs short (kv/store.park_budget)."""
    mem = cpu.read_memory()
    size = model_path.stat().st_size if model_path.is_file() else 0
    park = max(0, mem.available - size) // 4
    log.info("parking: up to %d MiB (a quarter of the %d MiB available beyond the model), less when memory runs short",
             park >> 20, max(0, mem.available - size) >> 20)
    return park


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
                 notifier: Notifier | None = None) -> None:
        super().__init__(config)
        self.engine = engine
        self.keys = keys
        self.notifier = notifier or Notifier()
        self.grace_s = grace_s
        self._draining = False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        if self.keys is not None:  # SIGHUP re-reads the keys file (systemctl reload)
            self.loop.add_signal_handler(signal.SIGHUP, self.keys.reload)
        await super().serve(sockets)

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


def request_bounds(cfg: Config) -> RequestBounds:
    return RequestBounds(default_max_tokens=cfg.default_max_tokens, max_tokens_limit=cfg.max_tokens_limit,
                         ctx_limit=cfg.ctx_per_slot, max_messages=cfg.max_messages, max_chars=cfg.max_request_chars,
                         default_temperature=cfg.default_temperature,
                         default_seed=None if cfg.default_seed == -1 else cfg.default_seed)


def serve(cfg: Config, model_path: Path) -> int:
    # Set before llama.cpp (and libgomp) load in the engine thread.
    cpu.set_thread_waiting(os.environ, cfg.share_cores == "on")
    metrics = Metrics()
    server: _Server | None = None

    def fatal() -> None:
        # Called from the engine thread: a dead engine means a useless server, so exit
        # (non-zero) and let systemd restart us rather than answer 503 forever.
        if server is not None and server.loop is not None:
            server.loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    for key in ("tls_cert", "tls_key"):
        if getattr(cfg, key) and not Path(getattr(cfg, key)).is_file():
            raise ConfigError(f"config key '{key}': no such file {getattr(cfg, key)!r}")
    try:
        keys = KeyRing(cfg.api_keys_file)  # a bad file stops start-up here, before the model loads
    except KeysFileError as e:
        raise ConfigError(f"config key 'api_keys_file': {e}") from None
    if keys.enabled:
        log.info("API keys on: %d keys from %s", len(keys), cfg.api_keys_file)
    engine = build_engine(cfg, model_path, fatal)
    metrics.attach(engine)
    # A hang the watchdog kills (SIGABRT) leaves every thread's Python stack in the journal.
    faulthandler.enable()
    notifier = Notifier.from_env()
    web = Path(cfg.web_dir) if cfg.web_dir else None
    store, people = people_store(cfg)
    library, embedder = build_library(cfg, engine)
    guard = GuardPolicy.build(keys, parse_networks(cfg.trusted_proxies), cfg.allowed_hosts, cfg.allowed_origins,
                              cfg.rate_limit_per_s, people)
    app = create_app(App(engine, cfg.model_name or model_path.stem, request_bounds(cfg), web, metrics,
                         system_prompts=cfg.system_prompts, guard=guard, parse_concurrency=cfg.parse_concurrency,
                         parse_per_client=cfg.parse_per_client, documents=document_reader(cfg), usage=accounting(cfg, store),
                         people=people, library=library, embedder=embedder))
    ucfg = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                          # _drain has waited grace_s already: what is left gets a few seconds.
                          timeout_graceful_shutdown=max(1, min(5, int(cfg.grace_s))), lifespan="on",
                          ssl_certfile=cfg.tls_cert or None, ssl_keyfile=cfg.tls_key or None,
                          http=conn.http_protocol(cfg.request_deadline_s, cfg.max_conns_per_client,
                                                  parse_networks(cfg.trusted_proxies), cfg.response_stall_s))
    server = _Server(ucfg, engine, cfg.grace_s, keys, notifier)
    watchdog = supervise(engine, notifier, lambda: server.started)
    watchdog.start()
    try:
        server.run()
    finally:
        watchdog.stop()
        notifier.close()
    return 1 if engine.state is EngineState.FAILED else 0
