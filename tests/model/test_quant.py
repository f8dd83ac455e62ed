"""Choosing the quantization: `appliance pull --quant` offline against a fake Hugging Face
cache, `appliance requantize` with a stand-in llama-quantize, and which file is served."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.model import bundled, hub, requant
from appliance.model import files as mf
from appliance.model.gguf import ModelFileError
from appliance.ops import quality

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def gguf(size: int = 256) -> bytes:
    return b"GGUF" + (3).to_bytes(4, "little") + bytes(size - 8)


def fake_hub(tmp_path: Path, files: dict[str, bytes]) -> None:
    """huggingface_hub's cache layout: refs/main -> commit, snapshots/<commit>/<file> -> blob."""
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snap / name).symlink_to(os.path.relpath(blob, snap))


def appliance(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "APPLIANCE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run([sys.executable, "-m", "appliance", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_pull_quant_takes_the_official_file_of_that_type(tmp_path: Path) -> None:
    q4_0, q8_0 = gguf(300), gguf(400)
    fake_hub(tmp_path, {"qwen2.5-0.5b-instruct-q4_0.gguf": q4_0, "qwen2.5-0.5b-instruct-q8_0.gguf": q8_0})
    models = tmp_path / "models"
    out = appliance(tmp_path, "pull", "--quant", "q4_0", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    dst = models / "qwen2.5-0.5b-instruct-q4_0.gguf"
    assert f"downloaded {dst}" in out.stdout and "q4_0: ~1.4x faster decode for 1 user" in out.stdout
    assert "perplexity +43% requantized" in out.stdout
    assert dst.read_bytes() == q4_0 and os.listdir(models) == [dst.name]
    # Pulled and official, it is served before the third-party bundled file.
    (models / bundled.BUNDLED_FILE).write_bytes(gguf())
    assert mf.find_local(models) == dst
    (models / hub.OFFICIAL_FILE).write_bytes(gguf())
    assert mf.find_local(models) == models / hub.OFFICIAL_FILE


def test_pull_quant_not_in_the_cache_says_so(tmp_path: Path) -> None:
    fake_hub(tmp_path, {"qwen2.5-0.5b-instruct-q4_0.gguf": gguf()})
    out = appliance(tmp_path, "pull", "--quant", "q8_0", "--models-dir", str(tmp_path / "models"))
    assert out.returncode == 1
    assert "qwen2.5-0.5b-instruct-q8_0.gguf is not in the cache" in out.stderr and "bundled-model" in out.stderr


def test_pull_quant_rejects_an_unknown_type(tmp_path: Path) -> None:
    out = appliance(tmp_path, "pull", "--quant", "q4_x")
    assert out.returncode == 2 and "invalid choice: 'q4_x'" in out.stderr
    with pytest.raises(ModelFileError, match="choose one of q4_k_m, q4_0"):
        hub.official_file("q4_x")


def fake_quantize(tmp_path: Path, fail: bool = False) -> Path:
    """A stand-in for llama-quantize: records its arguments and writes a small GGUF."""
    tool = tmp_path / "bin" / "llama-quantize"
    tool.parent.mkdir(parents=True, exist_ok=True)
    body = ("echo 'main: invalid quantization type' >&2; exit 1" if fail else
            'printf "%s\\n" "$@" > "$(dirname "$0")/args"; head -c 64 "$2" > "$3"')
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def test_requantize_runs_llama_quantize_allowing_requantization(tmp_path: Path) -> None:
    src = tmp_path / "models" / "bundled.gguf"
    src.parent.mkdir()
    src.write_bytes(gguf(1024))
    tool = fake_quantize(tmp_path)
    dst = requant.requantize(src, "q4_0", src.parent, tool=str(tool), threads=2)
    assert dst == src.parent / "bundled-to-q4_0.gguf" and dst.read_bytes() == gguf(1024)[:64]
    args = (tool.parent / "args").read_text().split("\n")
    assert args[0] == "--allow-requantize" and args[1] == str(src) and args[3:5] == ["Q4_0", "2"]
    assert sorted(os.listdir(src.parent)) == ["bundled-to-q4_0.gguf", "bundled.gguf"]


def test_requantize_failure_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "bundled.gguf"
    src.write_bytes(gguf())
    with pytest.raises(ModelFileError, match="llama-quantize failed: main: invalid quantization type"):
        requant.requantize(src, "iq4_nl", tmp_path / "models", tool=str(fake_quantize(tmp_path, fail=True)))
    assert os.listdir(tmp_path / "models") == []
    with pytest.raises(ModelFileError, match="cannot requantize to 'q2_k'"):
        requant.requantize(src, "q2_k", tmp_path / "models")


def test_find_tool_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PEERS_DIR", str(tmp_path / "peers"))
    monkeypatch.delenv("LLAMA_TOOLS_DIR", raising=False)
    with pytest.raises(ModelFileError, match="cmake --build build --target llama-quantize"):
        requant.find_tool("llama-quantize")
    peer = tmp_path / "peers" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"
    peer.mkdir(parents=True)
    fake_quantize(peer.parent.parent.parent.parent.parent).rename(peer / "llama-quantize")
    assert requant.find_tool("llama-quantize") == peer / "llama-quantize"
    own = fake_quantize(tmp_path)
    monkeypatch.setenv("LLAMA_TOOLS_DIR", str(own.parent))
    assert requant.find_tool("llama-quantize") == own


@pytest.mark.integration
def test_perplexity_through_the_appliance(bundled_model: Path) -> None:
    """One 512-token chunk of Debian's GPL-3 (as llama-perplexity -c 512 scores it): the
    bundled model's perplexity is low on licence text, and agreement with itself is total."""
    q = quality.perplexity(bundled_model, Path(quality.PPL_TEXT), chunks=1, threads=2, repack=False)
    assert 2 < q.ppl < 10 and len(q.top) == quality.PPL_CTX // 2
    assert quality.agreement(q, q) == 1.0
    assert json.dumps(round(q.ppl, 1))
