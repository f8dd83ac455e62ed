"""Which cores to use and pinning the calling thread to them (the only psutil user)."""

from __future__ import annotations

import logging
import os

import psutil

from .config import Config, ConfigError, parse_cpu_list

log = logging.getLogger(__name__)


def allowed_cpus() -> list[int]:
    """CPUs this process may run on (respects taskset/cgroup cpusets)."""
    return sorted(psutil.Process().cpu_affinity() or range(psutil.cpu_count() or 1))


def choose_cpus(cfg: Config) -> list[int]:
    allowed = allowed_cpus()
    if not cfg.cpus:
        return allowed
    wanted = parse_cpu_list(cfg.cpus)
    bad = [c for c in wanted if c not in allowed]
    if bad:
        raise ConfigError(f"config key 'cpus': CPUs {bad} are not available (allowed: {allowed})")
    return wanted


def choose_threads(cfg: Config, cpus: list[int]) -> int:
    # One llama.cpp thread per pinned core: more threads than cores only adds contention,
    # and on SMT machines the physical-core count is usually the sweet spot.
    if cfg.threads:
        return cfg.threads
    physical = psutil.cpu_count(logical=False) or len(cpus)
    return max(1, min(len(cpus), physical))


def pin_current_thread(cpus: list[int]) -> None:
    """Pin the *calling* thread.

    sched_setaffinity(0, ...) acts on the calling thread only, and threads created later by
    it (llama.cpp's OpenMP/ggml workers) inherit the mask; this is why the engine thread
    calls it before creating the llama context. psutil's cpu_affinity() would set the mask
    of the main thread instead, which does not help the engine.
    """
    try:
        os.sched_setaffinity(0, cpus)
        log.info("engine thread pinned to CPUs %s", cpus)
    except (AttributeError, OSError) as e:  # not Linux, or a restricted cpuset
        log.warning("could not pin threads to CPUs %s: %s", cpus, e)


def amx_advertised() -> bool:
    """Does the CPU claim Intel AMX? llama.cpp then routes prompt matmuls through AMX tiles,
    which crash (SIGILL/SIGSEGV) on virtual machines whose kernel does not enable them."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return " amx_int8" in f.read()
    except OSError:
        return False


def use_repack(cfg: Config) -> bool:
    if cfg.repack != "auto":
        return cfg.repack == "on"
    return not amx_advertised()


def available_memory() -> int:
    return int(psutil.virtual_memory().available)

