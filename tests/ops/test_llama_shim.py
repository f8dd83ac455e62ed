"""compat/llama-server-shim.py: llama-server's command line as llama.cpp's server tests build it
(utils.py) mapped onto `appliance serve` options, each option then read by the appliance's own
config loader; the flags it cannot honour refused with the flag named; an API key as a keys file
of one operator key."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from appliance import config
from appliance.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "compat" / "llama-server-shim.py"
# ServerPreset.tinyllama2() as utils.py starts it: every test's flags but its own.
TINYLLAMA2 = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
              "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32", "--no-slots", "--alias",
              "tinyllama-2", "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--no-jinja"]


def load_shim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_server_shim", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shim = load_shim()


def effective(argv: list[str]) -> tuple[config.Config, list[str]]:
    """The appliance's config for these llama-server arguments, as `appliance serve` reads it."""
    serve, notes = shim.command(argv)
    assert serve[:3] == ["-m", "appliance", "serve"]
    args = build_parser().parse_args(serve[2:])
    cli = {k: v for k, v in vars(args).items() if k in config.FIELDS}
    cfg, _ = config.load(cli, config_file=os.devnull, environ={})
    return cfg, notes


def test_the_suites_preset_becomes_the_appliance_it_describes() -> None:
    cfg, notes = effective(TINYLLAMA2)
    assert (cfg.port, cfg.host, cfg.model_name) == (8080, "127.0.0.1", "tinyllama-2")
    assert (cfg.default_temperature, cfg.default_seed) == (0.8, 42)
    # --ctx-size is the whole KV cache, shared equally by the --parallel slots.
    assert (cfg.slots, cfg.kv_tokens, cfg.ctx_per_slot) == (2, 512, 256)
    assert (cfg.batch_tokens, cfg.ubatch_tokens, cfg.prefill_chunk) == (32, 32, 0)
    assert cfg.default_max_tokens == 64
    assert cfg.state_dir == "" and cfg.api_keys_file == ""
    assert Path(cfg.model).name == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    said = "\n".join(notes)
    for flag in ("--offline", "--no-slots", "--no-jinja", "--hf-repo"):
        assert flag in said


def test_a_unified_cache_gives_each_slot_the_whole_context_and_spellings_map() -> None:
    cfg, _ = effective(["-c", "1024", "-np", "4", "-kvu", "-b", "64", "-ub", "16", "-t", "1",
                        "-ctk", "q8_0", "-ctv", "q8_0", "-ngl", "0", "--seed=-1", "-n", "4096", "-v"])
    assert (cfg.slots, cfg.kv_tokens, cfg.ctx_per_slot, cfg.batch_tokens, cfg.ubatch_tokens) == (4, 1024, 1024, 64, 16)
    assert (cfg.threads, cfg.kv_type, cfg.default_seed, cfg.log_level) == (1, "q8_0", -1, "debug")
    assert (cfg.default_max_tokens, cfg.max_tokens_limit) == (4096, 4096)


def test_an_api_key_becomes_a_keys_file_of_one_operator_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SUITE_TMP", str(tmp_path))
    cfg, _ = effective([*TINYLLAMA2, "--api-key", "sk-this-is-the-secret-key"])
    path = Path(cfg.api_keys_file)
    assert path.parent == tmp_path and path.read_text() == "sk-this-is-the-secret-key admin\n"
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only


@pytest.mark.parametrize("extra,named", [
    (["--host", "127.0.0.1,::1"], "--host"),
    (["--alias", "tinyllama-2,fim,code"], "--alias"),
    (["--tags", "chat"], "--tags"),
    (["--no-ui"], "--no-ui"),
    (["--chat-template", "llama3"], "--chat-template"),
    (["--chat-template-file", "x.jinja"], "--chat-template-file"),
    (["--embedding"], "--embedding"),
    (["-ngl", "99"], "--n-gpu-layers"),
    (["-ctk", "q4_0"], "--cache-type-k"),
    (["--cors-origins", "localhost"], "--cors-origins"),
    (["--frobnicate"], "--frobnicate"),
    (["--ctx-size"], "--ctx-size"),
    (["--parallel", "two"], "--parallel"),
])
def test_flags_it_cannot_honour_are_refused_by_name(extra: list[str], named: str) -> None:
    with pytest.raises(shim.Refused, match=named):
        shim.command([*TINYLLAMA2, *extra])


def test_a_refusal_exits_2_naming_the_flag_before_anything_starts(tmp_path: Path) -> None:
    env: dict[str, Any] = {**os.environ, "LLAMA_SUITE_PYTHON": "/nonexistent/python"}
    r = subprocess.run([sys.executable, str(SHIM), *TINYLLAMA2, "--tags", "x"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 2
    assert "refused: --tags" in r.stderr
