"""One frozen configuration for the whole process.

Precedence, lowest first: defaults < TOML file (--config, or /etc/appliance/appliance.toml
when present) < APPLIANCE_* environment variables < command-line flags. Every value is
validated once here; a bad one stops start-up with a ConfigError naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.config_checks import MAX_PRESETS, Network, parse_cpu_list, parse_networks  # noqa: F401 (re-exported)
from appliance.config_checks import cpus as _cpus
from appliance.config_checks import networks as _networks
from appliance.config_checks import non_negative as _non_negative
from appliance.config_checks import one_of as _one_of
from appliance.config_checks import port as _port
from appliance.config_checks import positive as _positive
from appliance.config_checks import presets as _presets
from appliance.config_groups import GROUP_OF, GROUPS, in_group_order

SYSTEM_CONFIG = Path("/etc/appliance/appliance.toml")
ENV_PREFIX = "APPLIANCE_"
# APPLIANCE_* variables that are not settings: read by their own modules or scripts.
NOT_SETTINGS = frozenset({
    "APPLIANCE_FAULT",  # faults.py: test-only fault injection
    "APPLIANCE_PORTABLE",  # scripts/setup.sh, which scripts/run.sh runs before `appliance serve`
})


class ConfigError(Exception):
    """A configuration problem; str() is the one line shown to the user."""


def _opt(help: str, check: Callable[[Any], str | None] | None = None) -> dict[str, Any]:
    return {"help": help, "check": check}


@dataclass(frozen=True, slots=True)
class Config:
    host: str = field(default="0.0.0.0", metadata=_opt("address to listen on"))
    port: int = field(default=8080, metadata=_opt("TCP port", _port))
    model: str = field(default="", metadata=_opt("GGUF file; empty = resolve from models_dir"))
    models_dir: str = field(default="models", metadata=_opt("where GGUF files live"))
    model_name: str = field(default="", metadata=_opt("model id shown in the API; empty = file stem"))
    # 24, not 16: twenty people at once are all decoded instead of four waiting for a slot
    # (the office workload: TTFT p95 1.6 s against 3.6 s, docs/benchmarks/office.md); a step
    # costs what its rows cost, so idle slots cost nothing.
    slots: int = field(default=24, metadata=_opt("sequences decoded together (batch width)", _positive))
    ctx_per_slot: int = field(default=4096, metadata=_opt("context limit of one conversation, tokens", _positive))
    # 8192: Open WebUI attaches its 36 built-in tools (6,626 tokens rendered) to every chat turn;
    # the block is read once and shared (engine/kv/commons), so a conversation's own cells stay
    # within ctx_per_slot (issue 37).
    tools_tokens: int = field(default=8192, metadata=_opt(
        "tokens of tool definitions a request may send beyond ctx_per_slot (a front-end's built-in tools)",
        _non_negative))
    kv_tokens: int = field(default=16384, metadata=_opt("KV cache cells shared by all sequences (12 KiB each in f16)", _positive))
    kv_type: str = field(default="f16", metadata=_opt(
        "KV cache precision: f16, or q8_0 for half the memory", _one_of("f16", "q8_0")))
    threads: int = field(default=0, metadata=_opt("llama.cpp threads; 0 = one per pinned core", _non_negative))
    cpus: str = field(default="", metadata=_opt("cores to pin to, e.g. '0-3' or '0,2'; empty = all allowed", _cpus))
    share_cores: str = field(default="on", metadata=_opt(
        "decode on one thread fewer per core other processes keep busy (llama.cpp's threads then "
        "spin while they wait); off = always `threads`, sleeping after a short spin", _one_of("on", "off")))
    repack: str = field(default="auto", metadata=_opt(
        "llama.cpp weight repacking (extra buffer types); auto = off where AMX is advertised", _one_of("auto", "on", "off")))
    batch_tokens: int = field(default=512, metadata=_opt("tokens per decode step (decode + prefill chunks)", _positive))
    ubatch_tokens: int = field(default=256, metadata=_opt(
        "tokens llama.cpp computes at once within a step (its compute buffer scales with it); "
        "at most batch_tokens", _positive))
    prefill_chunk: int = field(default=64, metadata=_opt(
        "prompt tokens per step while other streams generate, and in a long prompt's first step "
        "(its first progress note); 0 = batch_tokens", _non_negative))
    prefill_steps: int = field(default=4, metadata=_opt(
        "while others stream, read a long prompt in about this many steps (at most half of "
        "batch_tokens a step, at least prefill_chunk); 0 = prefill_chunk pieces", _non_negative))
    prefill_group: int = field(default=256, metadata=_opt(
        "finish the shortest waiting prompts that fit in this many tokens in one step, for earlier "
        "first tokens; 0 = off", _non_negative))
    spec_budget: int = field(default=16, metadata=_opt(
        "speculative draft tokens per decode step with one stream, a quarter per extra stream; 0 = off",
        _non_negative))
    max_wait_ms: int = field(default=20, metadata=_opt("admission window when the engine is idle, ms", _non_negative))
    min_batch: int = field(default=0, metadata=_opt("close the window early once this many wait; 0 = slots", _non_negative))
    max_queue: int = field(default=64, metadata=_opt("requests waiting for a slot before 429", _non_negative))
    queue_timeout_s: float = field(default=120.0, metadata=_opt("longest wait for a slot before 503", _positive))
    cached_sessions: int = field(default=48, metadata=_opt(
        "idle conversations kept in the KV cache beside the running ones", _positive))
    session_ttl_s: float = field(default=1800.0, metadata=_opt("forget an idle conversation after this, s", _positive))
    prefix_sharing: str = field(default="client", metadata=_opt(
        "KV reuse: within each client plus public system prompts (client; 'system' is the old name), "
        "or any common prefix across clients (all: leaks between clients)", _one_of("client", "system", "all")))
    # 8: Open WebUI alone keeps five public (its admins' and users' tools, its title, tags and
    # follow-ups templates); with 4 they pushed each other out, and a tools block is 6,626 tokens.
    common_system_prompts: int = field(default=8, metadata=_opt(
        "system prompts (and front-end task templates) made public once three different clients send the same "
        "one, whole (an office tool's); a client learns at most that two others sent exactly its system prompt "
        "(docs/SECURITY.md); 0 = off", _non_negative))
    system_prompts: dict[str, str] = field(default_factory=dict, metadata=_opt(
        "preset system prompts [system_prompts] name = text: computed at start-up, shared by all clients",
        lambda v: _presets(v)))
    trusted_proxies: tuple[str, ...] = field(default=(), metadata=_opt(
        "proxies whose X-Forwarded-For names the client, e.g. '127.0.0.1' or '10.0.0.0/24'",
        lambda v: _networks(v)))
    park_ram_mb: int = field(default=-1, metadata=_opt(
        "RAM for sessions parked out of the KV cache, MiB; -1 = a quarter of available memory, 0 = off",
        lambda v: None if v >= -1 else "must be >= -1"))
    idle_kv_tokens: int = field(default=-1, metadata=_opt(
        "idle conversations' KV cells beyond this are parked in RAM once idle for 5 s, as every decode step attends over "
        "the cache's whole used range; -1 = a quarter of kv_tokens, 0 = no limit",
        lambda v: None if v >= -1 else "must be >= -1"))
    restore_min_tokens: int = field(default=8, metadata=_opt(
        "shorter parked histories are recomputed instead of restored, tokens", _non_negative))
    state_dir: str = field(default="state", metadata=_opt(
        "where sessions are saved at shutdown and found after a restart; empty = off"))
    state_max_mb: int = field(default=1024, metadata=_opt("disk budget for saved sessions, MiB", _non_negative))
    backup_dir: str = field(default="backups", metadata=_opt(
        "where `appliance backup` (and the daily appliance-backup.timer) writes backups; relative to the working "
        "directory as state_dir is: /var/lib/appliance/backups for the service"))
    backup_keep: int = field(default=7, metadata=_opt(
        "`appliance backup` keeps the newest this many backups in backup_dir and removes older ones; 0 = keep all",
        _non_negative))
    usage_retention_days: int = field(default=90, metadata=_opt(
        "days of per-person usage counts kept in state_dir/usage.sqlite3 (older days are pruned)", _positive))
    quota_tokens_per_day: int = field(default=0, metadata=_opt(
        "generated tokens each person (key label, or address without keys) may use a day, 429 beyond it until "
        "local midnight; a key's third field in api_keys_file overrides it; 0 = no quota", _non_negative))
    ageing_s: float = field(default=2.0, metadata=_opt(
        "a new conversation waiting this long ranks with continuing ones, s", _non_negative))
    people_slots: int = field(default=-1, metadata=_opt(
        "free slots background requests (service_tier flex, priority > 0, X-Priority: background, a chat "
        "front-end's title and tag requests) leave to people; -1 = a quarter of the slots, at least 1",
        lambda v: None if isinstance(v, int) and v >= -1 else "must be -1 or more"))
    max_per_client: int = field(default=0, metadata=_opt(
        "running + queued requests per client identity (address, or API key); 0 = no cap", _non_negative))
    rate_limit_per_s: float = field(default=0.0, metadata=_opt(
        "requests per second per client identity, 429 beyond it; 0 = no limit", _non_negative))
    auth: str = field(default="open", metadata=_opt(
        "who may use the box: open (anyone on the network; api_keys_file, when set, asks programs for a key) or "
        "people (everyone signs in; the operator adds people in /admin; chats are kept on the box in "
        "state_dir/people.sqlite3)", _one_of("open", "people")))
    database_url: str = field(default="", metadata=_opt(
        "PostgreSQL for several boxes behind one nginx, e.g. postgresql://appliance@db.office/appliance (a "
        "password from ~/.pgpass or PGPASSWORD): people, keys, chats, the usage table (so quotas count "
        "every box) and the library are shared; empty = SQLite in state_dir"))
    signin_header: str = field(default="", metadata=_opt(
        "people mode behind a proxy that signs people in itself (oauth2-proxy, Authelia): the header naming "
        "the person, e.g. X-Forwarded-User, believed from trusted_proxies only; empty = off (every proxy in "
        "trusted_proxies must then drop a client's own copy of it)"))
    chat_retention_days: int = field(default=0, metadata=_opt(
        "people mode: chats nobody touched for this many days are deleted; 0 = keep them", _non_negative))
    api_keys_file: str = field(default="", metadata=_opt(
        "file of API keys, one per line: KEY [LABEL [QUOTA]] ('admin' = operator; QUOTA = its daily "
        "generated tokens, 0 = none); empty = no keys"))
    allowed_hosts: tuple[str, ...] = field(default=(), metadata=_opt(
        "Host names accepted besides IP literals, localhost and this machine's names (DNS rebinding guard)"))
    allowed_origins: tuple[str, ...] = field(default=(), metadata=_opt(
        "web origins, besides the page's own, that may call the API from a browser (enables CORS for them)"))
    max_messages: int = field(default=2048, metadata=_opt("messages one request may carry", _positive))
    max_request_chars: int = field(default=1_000_000, metadata=_opt(
        "characters of message text, tool calls and tool definitions one request may carry", _positive))
    parse_concurrency: int = field(default=4, metadata=_opt(
        "requests read, parsed and tokenized at once (all clients)", _positive))
    parse_per_client: int = field(default=2, metadata=_opt(
        "requests read, parsed and tokenized at once per client identity", _positive))
    document_max_mb: int = field(default=20, metadata=_opt(
        "largest file POST /v1/documents/text reads, MiB (413 above, refused before it is read)", _positive))
    document_max_pages: int = field(default=2000, metadata=_opt(
        "a PDF with more pages is refused before any page is read", _positive))
    document_timeout_s: float = field(default=10.0, metadata=_opt(
        "wall-clock limit of reading one document, s (the worker is killed; its CPU limit is half of this)",
        lambda v: None if v >= 1 else "must be >= 1"))
    document_workers: int = field(default=1, metadata=_opt(
        "documents read at once, each by its own worker process (on 2 cores one leaves the engine a core)", _positive))
    library: bool = field(default=True, metadata=_opt(
        "the office library: documents added in /admin (and, in people mode, each person's own) searched by chats "
        "that ask for it, and /v1/embeddings; loads the bundled embedding model (~60 MiB of RAM)"))
    library_budget_tokens: int = field(default=700, metadata=_opt(
        "tokens of library passages a chat is given at most (at most 4 passages)", _positive))
    library_translate: bool = field(default=True, metadata=_opt(
        "a chat's question is also searched in the library's other language (English, Chinese), put into it by the "
        "chat model first, when the documents it may cite hold some in that language: a short generation before the "
        "first token (median 2.9 s measured on a busy 2-core VM; an estimated 3-4 s on a Pi 4); and its words looked up "
        "in a Chinese-English dictionary, for that search and to tell when it names a thing no document mentions "
        "(~40 MiB of RAM once the library holds a document)"))
    library_sync_s: float = field(default=2.0, metadata=_opt(
        "with database_url: how often a box takes the documents added or deleted on the others, s", _positive))
    request_deadline_s: float = field(default=30.0, metadata=_opt(
        "a connection must deliver a request's headers and body within this, s", _positive))
    response_stall_s: float = field(default=120.0, metadata=_opt(
        "a response whose client reads none of it for this long is cut and its buffer freed, s", _positive))
    max_conns_per_client: int = field(default=64, metadata=_opt(
        "open connections per client address (trusted proxies exempt); 0 = no cap", _non_negative))
    box_name: str = field(default="appliance", metadata=_opt(
        "the box's name on the LAN: <box_name>.local (mdns), and in links made on the box itself",
        lambda v: None if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", v) else "must be one DNS label"))
    mdns: str = field(default="on", metadata=_opt(
        "announce <box_name>.local and the chat page on the LAN (mDNS/DNS-SD)", _one_of("on", "off")))
    tls_cert: str = field(default="", metadata=_opt("TLS certificate (PEM); with tls_key, serve https"))
    tls_key: str = field(default="", metadata=_opt("TLS private key (PEM)"))
    tls: str = field(default="auto", metadata=_opt(
        "https: auto = with the box's own CA (state_dir/tls) where secrets travel (auth = people or api_keys_file) "
        "and no trusted_proxies front it, else plain http; on; off (a proxy terminates TLS); tls_cert wins over all",
        _one_of("auto", "on", "off")))
    http_port: int = field(default=0, metadata=_opt(
        "with https on, also redirect plain http from this port (80 needs CAP_NET_BIND_SERVICE); 0 = none", _port))
    max_tokens_limit: int = field(default=2048, metadata=_opt("server cap on a request's max_tokens", _positive))
    default_max_tokens: int = field(default=512, metadata=_opt("max_tokens when a request gives none", _positive))
    default_temperature: float = field(default=0.7, metadata=_opt(
        "temperature when a request gives none (0 = greedy)", lambda v: None if 0 <= v <= 2 else "must be 0-2"))
    default_seed: int = field(default=-1, metadata=_opt(
        "seed when a request gives none: -1 = a fresh one each request; any other value makes the same unseeded "
        "request sample the same answer (llama-server's --seed)", lambda v: None if v >= -1 else "must be >= -1"))
    request_timeout_s: float = field(default=600.0, metadata=_opt("wall-clock limit of one generation", _positive))
    grace_s: float = field(default=30.0, metadata=_opt("on SIGTERM, how long running streams may finish", _non_negative))
    save_timeout_s: float = field(default=15.0, metadata=_opt(
        "at shutdown, sessions are saved most recent first for at most this long, s", _non_negative))
    stall_s: float = field(default=60.0, metadata=_opt(
        "an engine step running longer than this is a hang: /health says 'stalled' (503) and the "
        "systemd watchdog pings stop, s", lambda v: None if v >= 1 else "must be >= 1"))
    web_dir: str = field(default="", metadata=_opt("chat page directory; empty = the bundled web/"))
    log_level: str = field(default="info", metadata=_opt("logging level", _one_of("debug", "info", "warning", "error")))



# In group order (config_groups.py): `appliance config`, `--help` and the docs list them so.
_DECLARED = {f.name: f for f in dataclasses.fields(Config)}
FIELDS: dict[str, dataclasses.Field[Any]] = {name: _DECLARED[name] for name in in_group_order(list(_DECLARED))}


def _coerce(name: str, raw: Any, from_text: bool) -> Any:
    """Convert raw to the field's type; text (env, CLI) is parsed, TOML types must match."""
    ftype = FIELDS[name].type  # a string under `from __future__ import annotations`
    try:
        if ftype == "int":
            if isinstance(raw, bool) or not (isinstance(raw, int) or from_text):
                raise ValueError
            value: Any = int(raw)
        elif ftype == "float":
            if isinstance(raw, bool) or not (isinstance(raw, (int, float)) or from_text):
                raise ValueError
            value = float(raw)
        elif ftype == "bool":  # was refused from TOML, and "false" from text was truthy
            words = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}
            if not isinstance(raw, bool) and not (from_text and str(raw).strip().lower() in words):
                raise ValueError
            value = raw if isinstance(raw, bool) else words[str(raw).strip().lower()]
        elif ftype == "tuple[str, ...]":
            if from_text and isinstance(raw, str):
                raw = [x.strip() for x in raw.split(",") if x.strip()]
            if not isinstance(raw, (list, tuple)) or not all(isinstance(x, str) for x in raw):
                raise ValueError
            value = tuple(raw)
        elif ftype == "dict[str, str]":
            if from_text:
                raise ConfigError(f"config key '{name}' is a table: set it in the config file")
            if not isinstance(raw, dict) or not all(isinstance(x, str) for x in raw.values()):
                raise ValueError
            value = dict(raw)
        else:
            if not isinstance(raw, str):
                raise ValueError
            value = raw
    except ValueError:
        raise ConfigError(f"config key '{name}': expected {ftype}, got {raw!r}") from None
    check = FIELDS[name].metadata.get("check")
    problem = check(value) if check else None
    if problem:
        raise ConfigError(f"config key '{name}': {problem} (got {raw!r})")
    return value


def load(
    cli: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Config, dict[str, str]]:
    """Build the effective Config and, per key, where its value came from (the file, then
    APPLIANCE_* variables, then the command line: each later one wins)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources = {name: "default" for name in FIELDS}
    path = Path(config_file) if config_file else (SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None)
    if path is not None:
        _read_file(path, values, sources)
    _read_environ(environ, values, sources)
    _read_cli(cli or {}, values, sources)
    cfg = Config(**values)
    if "ubatch_tokens" not in values and cfg.ubatch_tokens > cfg.batch_tokens:
        # The default fits the default batch; a smaller batch takes the default down with it.
        cfg = dataclasses.replace(cfg, ubatch_tokens=cfg.batch_tokens)
    _check_together(cfg)
    return cfg, sources


def _read_file(path: Path, values: dict[str, Any], sources: dict[str, str]) -> None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    # Accept a flat file or an [appliance] table, each with keys flat or in group tables.
    if set(data) == {"appliance"} and isinstance(data["appliance"], dict):
        data = data["appliance"]
    for key, raw in _flatten(path, data).items():
        if key not in FIELDS:
            raise ConfigError(f"config file {path}: unknown key '{key}'")
        values[key] = _coerce(key, raw, from_text=False)
        sources[key] = f"file {path}"


def _flatten(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A group's table ([engine], [kv], ...: config_groups.py) read as its keys, flat."""
    flat = {key: raw for key, raw in data.items() if not (key in GROUPS and isinstance(raw, dict))}
    for group in (key for key, raw in data.items() if key in GROUPS and isinstance(raw, dict)):
        for key, raw in data[group].items():
            if GROUP_OF.get(key) != group:
                where = f" (it belongs in [{GROUP_OF[key]}])" if key in GROUP_OF else ""
                raise ConfigError(f"config file {path}: unknown key '{key}' in [{group}]{where}")
            if key in flat:
                raise ConfigError(f"config file {path}: key '{key}' given twice (flat and in [{group}])")
            flat[key] = raw
    return flat


def _read_environ(environ: Mapping[str, str], values: dict[str, Any], sources: dict[str, str]) -> None:
    for env_key, raw in environ.items():
        if not env_key.startswith(ENV_PREFIX) or env_key in NOT_SETTINGS:
            continue
        key = env_key[len(ENV_PREFIX):].lower()
        if key not in FIELDS:
            raise ConfigError(f"environment variable {env_key}: unknown key '{key}'")
        values[key] = _coerce(key, raw, from_text=True)
        sources[key] = f"env {env_key}"


def _read_cli(cli: Mapping[str, Any], values: dict[str, Any], sources: dict[str, str]) -> None:
    for key, raw in cli.items():
        if raw is None:
            continue
        if key not in FIELDS:
            raise ConfigError(f"unknown config key '{key}'")
        values[key] = _coerce(key, raw, from_text=isinstance(raw, str))
        sources[key] = "command line"


# Keys that need an optional library (pyproject.toml's extras; the service installs the
# runtime dependencies only): key -> (module, extra). Checked by load(), so a box set to use
# PostgreSQL without psycopg says which extra to install instead of a traceback (issue 47).
NEEDS_EXTRA = {"database_url": ("psycopg", "postgres")}


def install_hint(extra: str) -> str:
    return f"scripts/setup.sh bundled-model,{extra} (or .venv/bin/pip install '.[{extra}]' in the checkout)"


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses it outright (the suite's runtime-only check)
        return False


def _check_together(cfg: Config) -> None:
    """The rules between keys (each key's own rules are checked as it is read)."""
    for key, (module, extra) in NEEDS_EXTRA.items():
        if getattr(cfg, key) and not has_module(module):
            raise ConfigError(f"config key '{key}' needs the optional library {module}, the '{extra}' extra: "
                              f"install it with {install_hint(extra)}")
    for key, ok, why in (
        ("default_max_tokens", cfg.default_max_tokens <= cfg.max_tokens_limit, "must be <= max_tokens_limit"),
        ("kv_tokens", cfg.kv_tokens >= cfg.ctx_per_slot, "must be >= ctx_per_slot"),
        ("batch_tokens", cfg.batch_tokens >= cfg.slots, "must be >= slots (one decode token per slot)"),
        ("ubatch_tokens", cfg.ubatch_tokens <= cfg.batch_tokens, "must be <= batch_tokens"),
        ("ctx_per_slot", cfg.ctx_per_slot >= 64, "must be >= 64"),
        ("tls_key", bool(cfg.tls_cert) == bool(cfg.tls_key), "tls_cert and tls_key go together"),
        ("parse_per_client", cfg.parse_per_client <= cfg.parse_concurrency, "must be <= parse_concurrency"),
        # llama.cpp allows at most 256 sequence ids in one context.
        ("cached_sessions", cfg.slots + cfg.cached_sessions + 1 + len(cfg.system_prompts) <= 256,
         "slots + cached_sessions + system prompt presets must be < 256"),
    ):
        if not ok:
            raise ConfigError(f"config key '{key}': {why} (got {getattr(cfg, key)})")


def describe(cfg: Config, sources: Mapping[str, str]) -> str:
    """Every effective value, its group and where it came from, one per line, group by group."""
    width = max(map(len, FIELDS))
    lines = []
    for name in FIELDS:
        lines.append(f"{name:<{width}}  {getattr(cfg, name)!r:<24} {'[' + GROUP_OF[name] + ']':<11} "
                     f"# {sources.get(name, 'default')}")
    return "\n".join(lines)
