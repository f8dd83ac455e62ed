"""Which cores to use, pinning the calling thread to them (the only psutil user) and how
llama.cpp's threads wait; how much memory is left and how hot the CPU runs."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from appliance.config import Config, ConfigError, parse_cpu_list

log = logging.getLogger(__name__)


def allowed_cpus() -> list[int]:
    """CPUs this process may run on (respects taskset/cgroup cpusets)."""
    return sorted(psutil.Process().cpu_affinity() or range(psutil.cpu_count() or 1))


def set_thread_waiting(environ: MutableMapping[str, str], share_cores: bool = True) -> None:
    """llama.cpp's OpenMP threads wait for each other hundreds of times per decode step.
    Sleeping at once (passive) costs a lone stream 40% on a quiet machine, as every wait
    becomes a futex sleep and wake-up; libgomp's default spins ~300k rounds first, 1.2-1.3x
    faster again than 600 rounds for one stream, but it collapses when another process takes
    one of the cores (docs/benchmarks/threads.md, "llama.cpp's threads"). With share_cores the engine
    leaves such a core to the other process (engine/threads.py's CoreShare), so it spins the default count;
    without, 600 rounds: most of the quiet speed, and as fast as passive with a core taken.
    OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment (a systemd drop-in) wins."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = "300000" if share_cores else "600"


def cpu_seconds(cpus: list[int]) -> tuple[float, float]:
    """(busy seconds of these CPUs, by every process, since boot; this process's CPU seconds),
    for engine/threads.py's CoreShare. (0, 0) where they cannot be read."""
    try:
        per_cpu, own = psutil.cpu_times(percpu=True), psutil.Process().cpu_times()
    except (OSError, psutil.Error):
        return 0.0, 0.0
    return sum(busy_seconds(per_cpu[c]) for c in cpus if c < len(per_cpu)), own.user + own.system


def busy_seconds(times: Any) -> float:
    """A CPU's time not idle: user, nice, system, interrupts, and the hypervisor's steal,
    a core taken as surely as another process's work (not iowait: that is idle)."""
    return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


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


# -- memory and temperature (read by the engine's parking budget, /health and /metrics) --------

@dataclass(frozen=True, slots=True)
class Memory:
    total: int  # bytes this process may use: the RAM, or its cgroup's limit when lower
    available: int  # bytes it could still get: MemAvailable, or the cgroup's headroom when lower
    pressure: float  # PSI "some avg10": % of the last 10 s in which a task waited for memory
    cgroup_limit: int = 0  # the memory cgroup's limit (MemoryMax/MemoryHigh), 0 = none


@dataclass(frozen=True, slots=True)
class Thermal:
    zones: tuple[tuple[str, float], ...] = ()  # (zone type, degrees C) per thermal zone
    throttled: bool = False  # a CPU cooling device is active, or a zone is past a passive trip point


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _keyed(text: str) -> dict[str, int]:
    """'name value' (memory.stat) or 'Name:  value kB' (/proc/meminfo) lines."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return out


def _psi_some_avg10(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("some "):
            for field_ in line.split()[1:]:
                key, _, value = field_.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return 0.0
    return 0.0


def _cgroup_memory(proc: Path, cgroups: Path) -> tuple[int, int, float]:
    """(limit, bytes in use that reclaim cannot free cheaply, PSI some avg10) of this
    process's memory cgroup; limit 0 when there is none. cgroup v2 (pure or hybrid) and v1."""
    paths = {}
    for line in _read(proc / "self" / "cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path.lstrip("/")
    # PSI of our own cgroup (v2 only; also mounted at unified/ on hybrid systems).
    v2_root = cgroups if (cgroups / "cgroup.controllers").exists() else cgroups / "unified"
    v2_dir = v2_root / paths.get("", "")
    pressure = _psi_some_avg10(_read(v2_dir / "memory.pressure"))
    v1 = next((p for c, p in paths.items() if "memory" in c.split(",")), None)
    if v1 is not None:
        d = cgroups / "memory" / v1
        if not d.is_dir():  # a container's cgroup namespace: our cgroup is the mount's root
            d = cgroups / "memory"
        stat = _keyed(_read(d / "memory.stat"))
        limits = [_int(_read(d / "memory.limit_in_bytes")), stat.get("hierarchical_memory_limit")]
        usage = (_int(_read(d / "memory.usage_in_bytes")) or 0) - stat.get("total_inactive_file", 0)
    else:
        limits, d = [], v2_dir
        while True:  # a parent's limit (the slice's) binds us too
            for name in ("memory.max", "memory.high"):
                limits.append(_int(_read(d / name)))  # "max" -> None
            if d == v2_root or v2_root not in d.parents:
                break
            d = d.parent
        stat = _keyed(_read(v2_dir / "memory.stat"))
        usage = (_int(_read(v2_dir / "memory.current")) or 0) - stat.get("inactive_file", 0)
    real = [n for n in limits if n is not None and 0 < n < 1 << 60]  # 2**63-ish means none
    return (min(real) if real else 0), max(0, usage), pressure


def _meminfo(proc: Path) -> dict[str, int]:
    return _keyed(_read(proc / "meminfo"))


def ram_bytes(proc: Path = Path("/proc")) -> int:
    """The machine's RAM (MemTotal), whatever a cgroup allows; 0 if it cannot be read."""
    return _meminfo(proc).get("MemTotal", 0)


def cgroup_memory_limit(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The tightest memory limit of this process's cgroup and its parents (v2: the lower of
    memory.max and memory.high; v1: memory.limit_in_bytes and the hierarchical limit), or None."""
    return _cgroup_memory(proc, cgroups)[0] or None


def read_memory(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> Memory:
    """What memory is left for this process, and how hard the kernel is working for it.

    In a memory cgroup (systemd's MemoryMax=/MemoryHigh=, a container) the limit binds
    before the machine runs out, so headroom is the limit minus what the cgroup uses
    beyond inactive file pages (the "working set": what reclaim cannot free cheaply).
    """
    info = _meminfo(proc)
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    limit, used, pressure = _cgroup_memory(proc, cgroups)
    pressure = max(pressure, _psi_some_avg10(_read(proc / "pressure" / "memory")))
    if limit and (not total or limit < total):
        total = limit
    if limit:
        available = min(available, max(0, limit - used))
    return Memory(total=total, available=available, pressure=pressure, cgroup_limit=limit)


def read_thermal(root: Path = Path("/sys/class/thermal")) -> Thermal:
    """Temperatures and whether the CPU is being throttled, from the kernel's thermal
    framework (a Raspberry Pi's `vcgencmd get_throttled` needs /dev/vchiq, which the
    unit's PrivateDevices=yes hides)."""
    zones: list[tuple[str, float]] = []
    throttled = False
    for zone in sorted(root.glob("thermal_zone*")):
        temp = _int(_read(zone / "temp"))
        if temp is None:
            continue
        name = _read(zone / "type").strip() or zone.name
        if any(n == name for n, _ in zones):  # two zones of one type: tell them apart
            name = f"{name}/{zone.name}"
        zones.append((name, temp / 1000))
        for trip in zone.glob("trip_point_*_type"):
            if _read(trip).strip() == "passive":
                limit = _int(_read(trip.with_name(trip.name.replace("_type", "_temp"))))
                throttled |= limit is not None and temp >= limit
    for dev in root.glob("cooling_device*"):
        kind = _read(dev / "type").strip().lower()
        if "cpu" in kind or "processor" in kind:
            throttled |= (_int(_read(dev / "cur_state")) or 0) > 0
    return Thermal(tuple(zones), throttled)


class Sensors:
    """Memory and thermal readings for /health and /metrics, read at most once per
    `max_age_s` of `clock` however often they are asked for (reading is a few small files)."""

    def __init__(self, max_age_s: float = 1.0, memory: Callable[[], Memory] = read_memory,
                 thermal: Callable[[], Thermal] = read_thermal, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._read = (memory, thermal)
        self._clock = clock
        self._last: tuple[float, Memory, Thermal] | None = None

    def read(self) -> tuple[Memory, Thermal]:
        last = self._last
        now = self._clock()
        if last is None or now - last[0] > self.max_age_s:
            last = self._last = (now, self._read[0](), self._read[1]())
        return last[1], last[2]


def trim_heap() -> None:
    """Give freed heap memory back to the kernel. Parked sessions are large bytes objects;
    once glibc has raised its mmap threshold, blocks of that size come from the heap, and
    free() alone returns little of them."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


SENSORS = Sensors()  # the HTTP side's: /health and /metrics share one reading a second


def rss_bytes() -> int:
    """This process's resident memory (the admin page's RSS; `appliance tune`'s after each
    prompt), 0 if it cannot be read."""
    try:
        return int(psutil.Process().memory_info().rss)
    except (OSError, psutil.Error):
        return 0
