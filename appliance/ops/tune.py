"""`appliance tune`: measure this machine and pick the settings that fit it, with reasons.

Three parts: what the machine is (cores without SMT siblings or little cores, memory
including a cgroup's limit), what the model does on it (prompt and decode speed at a few
thread counts and micro-batch sizes, resident memory; the only part that loads llama.cpp),
and `choose()`, a pure function of the two that tests drive with simulated machines.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MiB = 2**20
UBATCHES = (64, 128, 256, 512)
STEP_ROWS = (1, 2, 4, 8, 16, 24)
MEM_SHARE = 0.80  # of the memory limit the appliance may plan for; the rest is the OS's and headroom
SERVER_MB = 45  # uvicorn, Starlette, prometheus_client and the HTTP side beyond what `measure` loads (MiB)
MIN_STREAM_TPS = 3.0  # tokens/s each user still sees with every slot busy
KV_Q8_RATIO = 34 / 64  # q8_0 stores 32 values in 34 bytes where f16 takes 64
QUESTION_TOKENS = 40  # a typical new question after a cached system prompt, for the TTFT estimate
PROMPT_TOKENS = 512


# -- the machine -----------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pick_cpus(allowed: list[int], sys_cpu: Path = Path("/sys/devices/system/cpu")) -> tuple[list[int], str]:
    """One CPU per physical core among `allowed`: no SMT siblings (they share a core's
    arithmetic units, and llama.cpp's threads wait for the slowest), no little cores (ARM
    big.LITTLE: `cpu_capacity`, else the highest clock)."""
    info: dict[int, tuple[tuple[str, str], int]] = {}
    for c in allowed:
        topo = sys_cpu / f"cpu{c}" / "topology"
        core = (_read(topo / "physical_package_id") or "0", _read(topo / "core_id") or str(c))
        cap = _read(sys_cpu / f"cpu{c}" / "cpu_capacity") or _read(sys_cpu / f"cpu{c}" / "cpufreq" / "cpuinfo_max_freq")
        info[c] = (core, int(cap) if cap and cap.isdigit() else 0)
    best = max((cap for _, cap in info.values()), default=0)
    big = [c for c in allowed if info[c][1] >= 0.9 * best]
    seen: set[tuple[str, str]] = set()
    chosen = []
    for c in big:
        if info[c][0] not in seen:
            seen.add(info[c][0])
            chosen.append(c)
    why = [f"{len(chosen)} of {len(allowed)} allowed CPUs"]
    if len(big) < len(allowed):
        why.append(f"{len(allowed) - len(big)} little cores left out")
    if len(chosen) < len(big):
        why.append(f"{len(big) - len(chosen)} SMT siblings left out")
    return chosen, ", ".join(why)


@dataclass(frozen=True, slots=True)
class Machine:
    cpus: list[int]  # the cores to pin to
    cpus_why: str
    mem_bytes: int  # what this process may use: MemTotal, or a cgroup's limit when lower
    mem_why: str

    @staticmethod
    def detect() -> Machine:
        from appliance import cpu

        cpus, why = pick_cpus(cpu.allowed_cpus())
        total = cpu.ram_bytes()
        limit = cpu.cgroup_memory_limit()
        if limit is not None and limit < total:
            return Machine(cpus, why, limit, f"cgroup limit {limit / MiB:.0f} MiB (RAM {total / MiB:.0f} MiB)")
        return Machine(cpus, why, total, f"RAM {total / MiB:.0f} MiB")


# -- the model on this machine ---------------------------------------------------------------
@dataclass(slots=True)
class Measured:
    threads: int
    model_mb: float
    kv_bytes_per_token: int  # f16
    prompt_tps: dict[int, float] = field(default_factory=dict)  # ubatch -> prompt tokens/s
    rss_mb: dict[int, float] = field(default_factory=dict)  # ubatch -> process RSS after a prompt
    step_ms: dict[int, float] = field(default_factory=dict)  # rows -> ms per decode step
    by_threads: dict[int, float] = field(default_factory=dict)  # threads -> 8-row step ms
    kv_cells: int = 2048  # of the measuring context, inside rss_mb


def _thread_candidates(n: int) -> list[int]:
    return sorted({max(1, n // 2), max(1, n - 1), n})


def measure(model_path: Path, machine: Machine, repack: bool, quick: bool = False,
            log: Any = print) -> Measured:
    """Load the model a few times (one context per thread count and micro-batch size) and time
    prompts and decode steps. About 30 s on 2 x86-64 cores, a few minutes on a Raspberry Pi."""
    from appliance import cpu

    cpu.pin_current_thread(machine.cpus)
    probe = _Probe(model_path, repack, reps=2 if quick else 3,
                   prompt=[1000 + (i * 7919) % 20000 for i in range(256 if quick else PROMPT_TOKENS)])
    size_mb = model_path.stat().st_size / MiB
    m = Measured(threads=0, model_mb=size_mb, kv_bytes_per_token=0, kv_cells=probe.n_cells)
    for t in _thread_candidates(len(machine.cpus)):
        llm = probe.open(t, 128)
        try:
            m.by_threads[t] = probe.steps(llm, (8,))[8]
        finally:
            llm.close()
        log(f"  {t} threads: a decode step of 8 streams takes {m.by_threads[t]:.0f} ms")
    m.threads = min(m.by_threads, key=lambda t: (m.by_threads[t], t))
    for ub in UBATCHES:
        _measure_ubatch(probe, m, ub)
        log(f"  ubatch {ub}: prompt {m.prompt_tps[ub]:.0f} tokens/s, RSS {m.rss_mb[ub]:.0f} MiB")
    log("  decode step: " + ", ".join(f"{r} streams {ms:.0f} ms" for r, ms in m.step_ms.items()))
    return m


def _measure_ubatch(probe: _Probe, m: Measured, ub: int) -> None:
    """Prompt speed and resident memory at micro-batch `ub`; at the first one also the KV
    bytes a token and the decode step times."""
    from appliance import cpu

    llm = probe.open(m.threads, ub)
    try:
        probe.prefill(llm, probe.prompt[:ub])  # warm-up: first touch of the weights and buffers
        llm.seq_rm(0)
        m.prompt_tps[ub] = probe.prefill(llm, probe.prompt)
        m.rss_mb[ub] = cpu.rss_bytes() / MiB
        if ub == UBATCHES[0]:
            llm.seq_rm(0)
            llm.decode(probe.prompt[:64], list(range(64)), [0] * 64, [False] * 64)
            m.kv_bytes_per_token = len(llm.seq_state(0)) // 64
            llm.seq_rm(0)
            m.step_ms = probe.steps(llm, STEP_ROWS)
    finally:
        llm.close()


@dataclass(frozen=True, slots=True)
class _Probe:
    """How the model is loaded for measuring, and the timed decodes run on it."""
    model_path: Path
    repack: bool
    reps: int  # timings per measured step (their median is kept)
    prompt: list[int]
    n_cells: int = 2048

    def open(self, threads: int, ubatch: int) -> Any:
        from appliance.model.llm import LLM, ContextSpec

        return LLM(self.model_path, ContextSpec(n_ctx=self.n_cells, n_seq_max=max(STEP_ROWS) + 1, n_batch=512, threads=threads,
                                                repack=self.repack, n_ubatch=ubatch))

    @staticmethod
    def prefill(llm: Any, tokens: list[int]) -> float:
        t0 = time.perf_counter()
        llm.decode(tokens, list(range(len(tokens))), [0] * len(tokens), [False] * (len(tokens) - 1) + [True])
        return len(tokens) / (time.perf_counter() - t0)

    def steps(self, llm: Any, rows_list: tuple[int, ...]) -> dict[int, float]:
        # As many sequences of 32 tokens as the widest step, then one token for each of `rows`
        # of them per step.
        n, prompt, k = 32, self.prompt, max(rows_list)
        for first in range(0, k, 16):  # 16 x 32 tokens: one n_batch of 512
            seqs = range(first, min(k, first + 16))
            toks = [t for s in seqs for t in prompt[s:s + n]]
            llm.decode(toks, [p for _ in seqs for p in range(n)], [s for s in seqs for _ in range(n)], [False] * len(toks))
        pos, out = [n] * k, {}  # each sequence's next position (llama.cpp wants them consecutive)
        for rows in rows_list:
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                llm.decode([prompt[rows]] * rows, pos[:rows], list(range(rows)), [True] * rows)
                times.append((time.perf_counter() - t0) * 1000)
                pos[:rows] = [p + 1 for p in pos[:rows]]
            out[rows] = statistics.median(times)
        return out


# -- the choice ------------------------------------------------------------------------------
@dataclass(slots=True)
class Choice:
    settings: dict[str, Any]
    reasons: list[str]
    expected: dict[str, float]  # tok/s for 1 user and for every slot busy, TTFT ms
    rss_mb: float  # expected peak RSS with these settings (parking full)
    budget_mb: float


def _step(m: Measured, rows: int) -> float:
    """ms of a decode step with `rows` streams, interpolated between measured row counts."""
    pts = sorted(m.step_ms.items())
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
        if r0 <= rows <= r1:
            return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
    r, t = pts[-1] if rows > pts[-1][0] else pts[0]
    return t * rows / r


def choose(machine: Machine, m: Measured) -> Choice:
    why: list[str] = []
    budget = machine.mem_bytes / MiB * MEM_SHARE
    why.append(f"memory: plan for {budget:.0f} MiB, {MEM_SHARE:.0%} of {machine.mem_why}")
    why.append(f"cores: {','.join(map(str, machine.cpus))} ({machine.cpus_why}); {m.threads} threads "
               "(fastest 8-stream step: " + ", ".join(f"{t}: {ms:.0f} ms" for t, ms in sorted(m.by_threads.items())) + ")")
    slots = _choose_slots(m, why)
    want_kv = max(4096, min(16384, slots * 1024))
    ubatch = _choose_ubatch(m, want_kv, budget, why)
    left = budget - _fixed_mb(m, ubatch)
    kv_type, kv_tokens = _choose_kv(m, want_kv, left, why)
    kv_mb = _kv_mb(m)
    ctx = min(4096, kv_tokens)
    park = int(max(0.0, min(left - kv_tokens * kv_mb[kv_type], machine.mem_bytes / MiB / 8, 1024)))
    why.append(f"ctx_per_slot {ctx}; park_ram_mb {park}: what is left of the plan, at most 1/8 of memory")
    rss = _fixed_mb(m, ubatch) + kv_tokens * kv_mb[kv_type] + park
    ttft = QUESTION_TOKENS / m.prompt_tps[ubatch] * 1000 + _step(m, 1)
    expected = {"tps_1": 1000 / _step(m, 1), "tps_all": slots * 1000 / _step(m, slots), "ttft_ms": ttft}
    settings: dict[str, Any] = {
        "threads": m.threads, "cpus": ",".join(map(str, machine.cpus)), "slots": slots,
        "ctx_per_slot": ctx, "kv_tokens": kv_tokens, "kv_type": kv_type, "ubatch_tokens": ubatch,
        "park_ram_mb": park,
    }
    return Choice(settings, why, expected, rss, budget)


def _kv_mb(m: Measured) -> dict[str, float]:
    """MiB of KV cache a token, by kv_type."""
    return {"f16": m.kv_bytes_per_token / MiB, "q8_0": m.kv_bytes_per_token * KV_Q8_RATIO / MiB}


def _fixed_mb(m: Measured, ub: int) -> float:
    """MiB of everything but the KV cache and parked sessions, at micro-batch `ub`."""
    return m.rss_mb[ub] - m.kv_cells * _kv_mb(m)["f16"] + SERVER_MB


def _choose_slots(m: Measured, why: list[str]) -> int:
    """As many streams per step as still give each user MIN_STREAM_TPS."""
    slots = 1
    for r in (24, 16, 8, 4, 2):
        if 1000 / _step(m, r) >= MIN_STREAM_TPS:
            slots = r
            break
    why.append(f"slots {slots}: a step of {slots} streams takes {_step(m, slots):.0f} ms, "
               f"{1000 / _step(m, slots):.1f} tokens/s each (at least {MIN_STREAM_TPS:.0f} wanted)"
               + ("" if slots == 24 else f"; 24 would give {1000 / _step(m, 24):.1f}"))
    return slots


def _choose_ubatch(m: Measured, want_kv: int, budget: float, why: list[str]) -> int:
    """The smallest micro-batch whose prompt speed is within 10% of the best; smaller if memory is short."""
    best = max(m.prompt_tps.values())
    ubatch = min(ub for ub in m.prompt_tps if m.prompt_tps[ub] >= 0.9 * best)
    if _fixed_mb(m, ubatch) + want_kv * _kv_mb(m)["f16"] > budget * 0.9:  # memory is short: the smallest buffer
        ubatch = min(m.prompt_tps)
    why.append(f"ubatch_tokens {ubatch}: prompt {m.prompt_tps[ubatch]:.0f} tokens/s against the best "
               f"{best:.0f}; " + ", ".join(f"{ub}: {m.rss_mb[ub]:.0f} MiB" for ub in sorted(m.rss_mb))
               + " resident after a prompt")
    return ubatch


def _choose_kv(m: Measured, want_kv: int, left: float, why: list[str]) -> tuple[str, int]:
    """The KV cache's type and size in the `left` MiB: f16 when it fits in 3/4 of it, else q8_0."""
    kv_mb = _kv_mb(m)
    if want_kv * kv_mb["f16"] <= left * 0.75:
        kv_type, kv_tokens = "f16", want_kv
    else:
        kv_type = "q8_0"
        kv_tokens = min(want_kv, int(left * 0.75 / kv_mb["q8_0"]) // 1024 * 1024)
    if kv_tokens < 2048:
        why.append(f"WARNING: {left:.0f} MiB left after the model ({m.model_mb:.0f} MiB) and buffers: "
                   "too little memory; a smaller model file (appliance pull --quant q4_0) with repack = \"off\" "
                   "would help (with repacking on, a 4-bit file's repacked copy costs more memory than it saves)")
        kv_tokens = 2048
    why.append(f"kv_type {kv_type}, kv_tokens {kv_tokens}: {kv_tokens * kv_mb[kv_type]:.0f} MiB of KV cache "
               f"({m.kv_bytes_per_token * (1 if kv_type == 'f16' else KV_Q8_RATIO):.0f} bytes a token)"
               + (" ; q8_0 because f16 would not leave room (output close to f16's, not token-identical)"
                  if kv_type == "q8_0" else ""))
    return kv_type, kv_tokens


# -- writing the config file -----------------------------------------------------------------
def _toml(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def write_settings(path: Path, values: dict[str, Any], note: str) -> None:
    """Set `values` in the TOML file at path (created if absent), keeping everything else:
    a key's existing line (or its commented-out default) is replaced in place, new keys go
    before the first table. The result must load (config.load) or the file is left as it was."""
    from appliance.config import load

    old = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = old.splitlines()
    top = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")), len(lines))
    if top < len(lines) and lines[top].strip() == "[appliance]":
        top = next((i for i in range(top + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    new_lines: list[str] = []
    for key, v in values.items():
        line = f"{key} = {_toml(v)}"
        pat = re.compile(rf"^\s*#?\s*{re.escape(key)}\s*=")
        hits = [i for i in range(top) if pat.match(lines[i])]
        if hits:
            lines[hits[0]] = line
        else:
            new_lines.append(line)
    if new_lines:
        lines[top:top] = [f"# {note}", *new_lines, *([""] if top < len(lines) else [])]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tune-{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    try:
        load(config_file=str(tmp), environ={})
    except Exception:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


# -- the command -----------------------------------------------------------------------------
def report(c: Choice, m: Measured) -> str:
    s, e = c.settings, c.expected
    out = ["settings:"] + [f"  {k} = {_toml(v)}" for k, v in s.items()]
    out += ["why:"] + [f"  - {r}" for r in c.reasons]
    out += ["expect:",
            f"  1 user: {e['tps_1']:.0f} tokens/s; {s['slots']} users at once: {e['tps_all']:.0f} tokens/s "
            f"in all ({e['tps_all'] / s['slots']:.1f} each)",
            f"  time to first token for a {QUESTION_TOKENS}-token question (system prompt cached): "
            f"{e['ttft_ms']:.0f} ms",
            f"  resident memory at most about {c.rss_mb:.0f} MiB (model {m.model_mb:.0f} MiB mapped, KV cache, "
            f"buffers, Python, parked sessions) of the {c.budget_mb:.0f} MiB planned"]
    return "\n".join(out)


def run(args: argparse.Namespace, cfg: Any, model_path: Path) -> int:
    from appliance import cpu
    from appliance.config import SYSTEM_CONFIG

    machine = Machine.detect()
    print(f"tuning for {model_path.name} on CPUs {machine.cpus} ({machine.cpus_why}), {machine.mem_why}")
    t0 = time.monotonic()
    m = measure(model_path, machine, cpu.use_repack(cfg), quick=args.quick)
    print(f"measured in {time.monotonic() - t0:.0f} s")
    c = choose(machine, m)
    print(report(c, m))
    if args.json:
        Path(args.json).write_text(__import__("json").dumps(
            {"machine": asdict(machine), "measured": asdict(m), "settings": c.settings,
             "expected": c.expected, "rss_mb": c.rss_mb, "reasons": c.reasons}, indent=2) + "\n")
    target = Path(args.config) if args.config else (SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None)
    if args.dry_run or target is None:
        print("not written" + ("" if args.dry_run else ": give --config FILE to save these settings"))
        return 0
    write_settings(target, c.settings, f"appliance tune, {time.strftime('%Y-%m-%d')}: {machine.mem_why}, "
                                       f"{len(machine.cpus)} cores")
    print(f"written to {target}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and a shorter prompt")
    p.add_argument("--json", metavar="PATH", help="also write what was measured and chosen as JSON")

