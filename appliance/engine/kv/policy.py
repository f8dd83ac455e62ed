"""What the KV side is configured with (CachePolicy): sequence ids, TTL, sharing, parking,
restoring, saving across restarts. Built by ops/serve.py; read by the KV store and the core."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from appliance.cpu import Memory


@dataclass(frozen=True, slots=True)
class CachePolicy:
    n_seq: int  # llama.cpp sequence ids: `slots` for running requests, the rest hold idle sessions
    ttl_s: float = 1800.0
    share_all: bool = False  # False: across clients, reuse only public prefixes
    park_bytes: int = 0  # RAM for sessions evicted from the KV cache, at most; 0 = no parking
    restore_min_tokens: int = 0  # shorter parked histories are cheaper to recompute
    min_shared: int = 8  # shortest prefix worth sharing between sequences
    state_dir: str = ""  # where sessions survive a restart; "" = they do not
    state_max_bytes: int = 1 << 30
    save_timeout_s: float = 15.0  # at shutdown, the most recent sessions saved within this
    # Idle sessions' KV cells beyond this are parked (when parking is on); 0 = no limit.
    idle_kv_tokens: int = 0
    # System prompts that may become public once common (kv/commons.py); 0 = off.
    common_prompts: int = 0
    # Free memory and pressure, read once a second: parking gives memory back before the
    # kernel runs out (kv/parking.park_budget). None: the budget stays park_bytes.
    memory: Callable[[], Memory] | None = None
