"""Tests for appliance.ops.tune: the machine's cores (its memory is cpu.py's, read in
tests/engine/test_pressure.py), the choice on this machine and on a simulated 1 GiB one-core
board, writing the config file, and one real `appliance tune`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance import config as config_mod
from appliance.config import load
from appliance.ops import tune
from appliance.ops.tune import Machine, Measured, MiB, choose

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_system_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", tmp_path / "absent" / "appliance.toml")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- the machine -----------------------------------------------------------------------------
def fake_cpu(root: Path, cpu: int, core: int, package: int = 0, capacity: int | None = None) -> None:
    write(root / f"cpu{cpu}" / "topology" / "core_id", f"{core}\n")
    write(root / f"cpu{cpu}" / "topology" / "physical_package_id", f"{package}\n")
    if capacity is not None:
        write(root / f"cpu{cpu}" / "cpu_capacity", f"{capacity}\n")


def test_pick_cpus_leaves_out_smt_siblings(tmp_path: Path) -> None:
    for cpu, core in [(0, 0), (1, 1), (2, 0), (3, 1)]:  # Intel numbering: 2 and 3 are siblings of 0 and 1
        fake_cpu(tmp_path, cpu, core)
    cpus, why = tune.pick_cpus([0, 1, 2, 3], tmp_path)
    assert cpus == [0, 1] and "2 SMT siblings left out" in why
    assert tune.pick_cpus([1, 2, 3], tmp_path)[0] == [1, 2]  # within the allowed set


def test_pick_cpus_leaves_out_little_cores(tmp_path: Path) -> None:
    for cpu in range(4):
        fake_cpu(tmp_path, cpu, cpu, capacity=446)  # Cortex-A55
    for cpu in range(4, 6):
        fake_cpu(tmp_path, cpu, cpu, capacity=1024)  # Cortex-A76
    cpus, why = tune.pick_cpus(list(range(6)), tmp_path)
    assert cpus == [4, 5] and "4 little cores left out" in why


def test_pick_cpus_without_topology_keeps_every_cpu(tmp_path: Path) -> None:
    assert tune.pick_cpus([0, 1, 2], tmp_path) == ([0, 1, 2], "3 of 3 allowed CPUs")


# -- the choice ------------------------------------------------------------------------------
def two_core_x86() -> Measured:
    """`appliance tune --dry-run` on this 2-core x86-64 VM, as bench/memory/ubatch-table.sh ran it
    (docs/benchmarks/memory.md, the ubatch_tokens table)."""
    return Measured(threads=2, model_mb=468.6, kv_bytes_per_token=12309,
                    prompt_tps={64: 103.7, 128: 102.2, 256: 123.1, 512: 122.9},
                    rss_mb={64: 635.8, 128: 640.4, 256: 649.3, 512: 667.2},
                    step_ms={1: 28.9, 2: 52.5, 4: 79.7, 8: 143.2, 16: 237.8}, by_threads={1: 302.6, 2: 143.8})


def small_board() -> Measured:
    """`appliance tune` inside compat/small-board.sh's 1 GiB cgroup on one core of this VM
    (docs/SERVICE.md, "A small board, simulated")."""
    return Measured(threads=1, model_mb=468.6, kv_bytes_per_token=12309,
                    prompt_tps={64: 64.3, 128: 63.0, 256: 52.7, 512: 65.2},
                    rss_mb={64: 635.7, 128: 640.4, 256: 649.4, 512: 667.2},
                    step_ms={1: 50.4, 2: 85.6, 4: 127.1, 8: 243.7, 16: 427.1}, by_threads={1: 237.0})


def loads(settings: dict[str, object], tmp_path: Path) -> config_mod.Config:
    path = tmp_path / "tuned.toml"
    tune.write_settings(path, settings, "test")
    return load(config_file=str(path), environ={})[0]


def test_choice_on_a_two_core_pc_keeps_the_fast_defaults(tmp_path: Path) -> None:
    machine = Machine([0, 1], "2 of 2 allowed CPUs", 24 * 2**30, "RAM 24576 MiB")
    c = choose(machine, two_core_x86())
    s = c.settings
    assert (s["threads"], s["cpus"], s["slots"], s["kv_type"], s["kv_tokens"]) == (2, "0,1", 16, "f16", 16384)
    assert s["ubatch_tokens"] == 256  # 64 and 128 are more than 10% slower at prompts
    assert s["park_ram_mb"] == 1024 and c.rss_mb <= c.budget_mb
    assert round(c.expected["tps_1"]) == 35 and round(c.expected["tps_all"]) == 67
    assert any(r.startswith("slots 16:") for r in c.reasons)
    cfg = loads(s, tmp_path)
    assert (cfg.slots, cfg.ubatch_tokens, cfg.cpus) == (16, 256, "0,1")


def test_choice_on_a_simulated_small_board_fits_in_900_mib(tmp_path: Path) -> None:
    machine = Machine([0], "1 of 1 allowed CPUs", 2**30, "cgroup limit 1024 MiB (RAM 24106 MiB)")
    c = choose(machine, small_board())
    s = c.settings
    assert c.budget_mb < 900 and c.rss_mb <= c.budget_mb
    assert s["threads"] == 1 and s["cpus"] == "0"
    assert s["ubatch_tokens"] == 64  # the smallest compute buffer: memory is short
    assert s["slots"] == 8  # 16 streams would get 2.3 tokens/s each
    assert 2048 <= s["kv_tokens"] <= 8192 and s["ctx_per_slot"] <= s["kv_tokens"] and s["park_ram_mb"] <= 128
    # What `appliance tune` wrote and expected in there (docs/SERVICE.md).
    assert (s["kv_type"], s["kv_tokens"], s["ctx_per_slot"], s["park_ram_mb"]) == ("f16", 8192, 4096, 66)
    assert (round(c.expected["tps_1"]), round(c.expected["tps_all"])) == (20, 33)
    assert c.expected["ttft_ms"] == pytest.approx(673, abs=2)
    text = tune.report(c, small_board())
    assert f"kv_type {s['kv_type']}, kv_tokens {s['kv_tokens']}" in text and "cgroup limit 1024 MiB" in text
    loads(s, tmp_path)


def test_choice_when_nothing_fits_says_so() -> None:
    machine = Machine([0], "1 of 1 allowed CPUs", 512 * MiB, "RAM 512 MiB")
    c = choose(machine, small_board())
    assert c.settings["kv_tokens"] == 2048
    assert any("too little memory" in r and "--quant q4_0" in r for r in c.reasons)


# -- the config file -------------------------------------------------------------------------
def test_write_settings_replaces_in_place_and_keeps_tables(tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text('port = 9000\n# slots = 16\n\n[system_prompts]\nhelp = "Be brief."\n')
    path.chmod(0o640)
    tune.write_settings(path, {"slots": 4, "kv_type": "q8_0"}, "tuned")
    text = path.read_text()
    assert text.startswith("port = 9000\nslots = 4\n\n# tuned\nkv_type = \"q8_0\"\n\n[system_prompts]\n")
    assert path.stat().st_mode & 0o777 == 0o640
    cfg = load(config_file=str(path), environ={})[0]
    assert (cfg.port, cfg.slots, cfg.kv_type, cfg.system_prompts) == (9000, 4, "q8_0", {"help": "Be brief."})
    tune.write_settings(path, {"slots": 8}, "again")
    assert path.read_text().count("slots =") == 1


def test_write_settings_refuses_what_would_not_load(tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text("batch_tokens = 256\n")
    with pytest.raises(config_mod.ConfigError, match="ubatch_tokens"):
        tune.write_settings(path, {"ubatch_tokens": 512}, "bad")
    assert path.read_text() == "batch_tokens = 256\n" and [p.name for p in tmp_path.iterdir()] == ["appliance.toml"]


# -- ubatch_tokens reaches llama.cpp, and a real `appliance tune` -------------------------
@pytest.mark.integration
def test_ubatch_tokens_reaches_the_llama_context(bundled_model: Path) -> None:
    import llama_cpp

    from appliance.model.llm import LLM, ContextSpec

    llm = LLM(bundled_model, ContextSpec(n_ctx=256, n_seq_max=2, n_batch=128, threads=1, repack=False, n_ubatch=64))
    try:
        assert (llama_cpp.llama_n_batch(llm.ctx), llama_cpp.llama_n_ubatch(llm.ctx)) == (128, 64)
        llm.decode(list(range(1000, 1100)), list(range(100)), [0] * 100, [False] * 99 + [True])  # two ubatches
        assert llm.seq_pos_max(0) == 99
    finally:
        llm.close()


@pytest.mark.integration
def test_appliance_tune_on_this_machine(bundled_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text("port = 8081\n")
    out = subprocess.run([sys.executable, "-m", "appliance", "tune", "--quick", "--config", str(path),
                          "--model", str(bundled_model), "--json", str(tmp_path / "tune.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert "why:" in out.stdout and "slots" in out.stdout and f"written to {path}" in out.stdout
    cfg = load(config_file=str(path), environ={})[0]
    assert cfg.port == 8081 and cfg.ubatch_tokens in tune.UBATCHES and cfg.threads >= 1
    assert cfg.kv_type == "f16"  # plenty of memory here
    # The slot count follows the step times measured now, which a busy machine stretches (CI's
    # run beside other work chose 2): the written value is the one the reasons name.
    assert cfg.slots in (1, 2, 4, 8, 16, 24) and f"slots {cfg.slots}: a step of {cfg.slots} streams" in out.stdout
