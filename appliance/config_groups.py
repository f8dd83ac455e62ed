"""The settings grouped by the layer that reads them. config.py keeps one flat Config (every
key, flag, APPLIANCE_* variable and flat TOML key as before); these groups order `appliance
config`, `--help` and docs/SETTINGS.md, name the TOML tables a file may use instead of flat
keys (`[engine]`, `[kv]`, ...), and tell the composition root (ops/compose.py) what each
layer is handed: tests/core/test_config_groups.py checks that each builder reads its group only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# group -> (what reads it, its keys). Every Config field is in exactly one group.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "server": ("the process: where it listens, the model file, TLS, the state directory, shutdown", (
        "host", "port", "model", "models_dir", "model_name", "state_dir", "box_name", "mdns", "tls_cert", "tls_key",
        "tls", "http_port", "web_dir", "log_level", "grace_s", "stall_s", "backup_dir", "backup_keep")),
    "engine": ("engine/: the scheduler's slots, batches, queue and fairness, and llama.cpp's threads", (
        "slots", "ctx_per_slot", "tools_tokens", "threads", "cpus", "share_cores", "repack", "batch_tokens",
        "ubatch_tokens", "prefill_chunk", "prefill_steps", "prefill_group", "spec_budget", "max_wait_ms",
        "min_batch", "max_queue", "queue_timeout_s", "ageing_s", "people_slots", "max_per_client",
        "request_timeout_s")),
    "kv": ("engine/kv/: the KV cache, sessions kept, parked and saved, shared prefixes", (
        "kv_tokens", "kv_type", "cached_sessions", "session_ttl_s", "prefix_sharing", "common_system_prompts",
        "system_prompts", "park_ram_mb", "idle_kv_tokens", "restore_min_tokens", "state_max_mb", "save_timeout_s")),
    "http": ("http/: the front door, connections, request bounds and defaults", (
        "trusted_proxies", "api_keys_file", "allowed_hosts", "allowed_origins", "rate_limit_per_s",
        "max_conns_per_client", "request_deadline_s", "response_stall_s", "parse_concurrency", "parse_per_client",
        "max_messages", "max_request_chars", "max_tokens_limit", "default_max_tokens", "default_temperature",
        "default_seed")),
    "people": ("people/: who may use the box, the store of people and chats", (
        "auth", "database_url", "signin_header", "chat_retention_days")),
    "usage": ("usage/: counts per person and quotas", ("usage_retention_days", "quota_tokens_per_day")),
    "documents": ("documents/: reading uploaded files", (
        "document_max_mb", "document_max_pages", "document_timeout_s", "document_workers")),
    "library": ("library/: the office library and embeddings", (
        "library", "library_budget_tokens", "library_translate", "library_sync_s")),
}
GROUP_OF: dict[str, str] = {key: group for group, (_, keys) in GROUPS.items() for key in keys}


def in_group_order(names: list[str]) -> list[str]:
    """`names` (a dataclass's fields) ordered group by group; a name in no group goes last."""
    order = {key: i for i, key in enumerate(GROUP_OF)}
    return sorted(names, key=lambda n: order.get(n, len(order)))


def markdown(defaults: Mapping[str, Any], helps: Mapping[str, str]) -> str:
    """docs/SETTINGS.md: every key under its group, with its default and what it does."""
    lines = ["# Settings", "", "Generated from appliance/config.py and appliance/config_groups.py "
             "(tests/core/test_config_groups.py checks it). Each key is also a flag (`--key`), an environment "
             "variable (`APPLIANCE_KEY`) and a TOML key, flat or in its group's table (`[engine]` ...)."]
    for group, (reader, keys) in GROUPS.items():
        lines += ["", f"## [{group}]", "", reader[0].upper() + reader[1:] + ".", "", "| key | default | meaning |",
                  "|---|---|---|"]
        lines += [f"| `{k}` | `{defaults[k]!r}` | {helps[k].replace('|', '/')} |" for k in keys]
    return "\n".join(lines) + "\n"
