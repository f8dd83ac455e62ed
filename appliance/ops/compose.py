"""The composition root: every service of an `appliance serve` process built from the config
in one place, each layer handed what it reads. What starts and stops them, in order, is the
app's lifespan (http/lifecycle.py); serve.py runs the result behind uvicorn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.config import Config, ConfigError
from appliance.documents.document import DocumentLimits, MiB
from appliance.documents.reader import DocumentReader
from appliance.engine.engine import Engine
from appliance.http.accounting import Accounting
from appliance.http.guard import GuardPolicy
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing, KeysFileError
from appliance.http.metrics import Metrics
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.ops import address
from appliance.ops.engine import build_engine
from appliance.ops.https import Https, prepare
from appliance.ops.library import build_library
from appliance.ops.mdns import Announcer
from appliance.usage.ledger import Ledger
from appliance.usage.shared import SharedUsageStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Process:
    """What serve.py runs: the app's state (its services), and the parts it also reaches
    from outside the app (the engine for the drain and watchdog, the keys for SIGHUP)."""

    app: App
    engine: Engine
    keys: KeyRing
    metrics: Metrics
    https: Https | None = None  # None: plain HTTP


def compose(cfg: Config, model_path: Path, on_fatal: Callable[[], None] = lambda: None) -> Process:
    """Checks what must hold before the model loads (TLS files, the keys file, the box's CA), then builds."""
    check_files(cfg)
    keys = keyring(cfg)
    https = prepare(cfg)
    engine = build_engine(cfg, model_path, on_fatal)
    metrics = Metrics()
    metrics.attach(engine)
    store, people = people_store(cfg)
    library, embedder = build_library(cfg, engine)
    # The name it announces is its own: a browser that found it by name is let in (the DNS rebinding guard).
    hosts = (*cfg.allowed_hosts, address.box(cfg).host)
    guard = GuardPolicy.build(keys, parse_networks(cfg.trusted_proxies), hosts, cfg.allowed_origins,
                              cfg.rate_limit_per_s, people)
    app = App(engine, cfg.model_name or model_path.stem, request_bounds(cfg), Path(cfg.web_dir) if cfg.web_dir else None,
              metrics, system_prompts=cfg.system_prompts, guard=guard, parse_concurrency=cfg.parse_concurrency,
              parse_per_client=cfg.parse_per_client, documents=document_reader(cfg), usage=accounting(cfg, store),
              people=people, library=library, embedder=embedder, store=store, box=address.box(cfg),
              announcer=Announcer(address.box(cfg), cfg.host) if cfg.mdns == "on" else None)
    app.trust = https.trust if https is not None else None
    return Process(app, engine, keys, metrics, https)


def check_files(cfg: Config) -> None:
    for key in ("tls_cert", "tls_key"):
        if getattr(cfg, key) and not Path(getattr(cfg, key)).is_file():
            raise ConfigError(f"config key '{key}': no such file {getattr(cfg, key)!r}")


def keyring(cfg: Config) -> KeyRing:
    try:
        keys = KeyRing(cfg.api_keys_file)  # a bad file stops start-up here, before the model loads
    except KeysFileError as e:
        raise ConfigError(f"config key 'api_keys_file': {e}") from None
    if keys.enabled:
        log.info("API keys on: %d keys from %s", len(keys), cfg.api_keys_file)
    return keys


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


def request_bounds(cfg: Config) -> RequestBounds:
    return RequestBounds(default_max_tokens=cfg.default_max_tokens, max_tokens_limit=cfg.max_tokens_limit,
                         ctx_limit=cfg.ctx_per_slot, max_messages=cfg.max_messages, max_chars=cfg.max_request_chars,
                         default_temperature=cfg.default_temperature,
                         default_seed=None if cfg.default_seed == -1 else cfg.default_seed)
