"""The engine as the config asks for it: its limits, KV cache policy, CPUs and threads, and
the model loaded on the engine thread."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from appliance import cpu
from appliance.config import Config
from appliance.engine import faults
from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.model_api import Model
from appliance.engine.scheduler import Limits
from appliance.engine.threads import CoreShare

log = logging.getLogger(__name__)


def build_engine(cfg: Config, model_path: Path, on_fatal: Callable[[], None] = lambda: None) -> Engine:
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

