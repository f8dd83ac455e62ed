"""Requantize a GGUF offline with llama.cpp's llama-quantize (found by find_tool)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from appliance.model.gguf import ModelFileError, check_gguf, writable_dir

log = logging.getLogger(__name__)

# What `appliance requantize` can make offline from a file at hand (llama-quantize types).
REQUANT_TYPES = ("q4_0", "iq4_nl", "q8_0", "q5_0", "q4_k_m")


def find_tool(name: str, given: str = "") -> Path:
    """A llama.cpp tool (llama-quantize, llama-perplexity): given, $LLAMA_TOOLS_DIR, PATH, or the
    peer build under $PEERS_DIR (bench/peers/llama-server.sh and bench/memory/quant-table.sh make one)."""
    candidates = [Path(given)] if given else []
    if os.environ.get("LLAMA_TOOLS_DIR"):
        candidates.append(Path(os.environ["LLAMA_TOOLS_DIR"]) / name)
    if (found := shutil.which(name)) is not None:
        candidates.append(Path(found))
    peers = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "appliance-peers"))
    candidates += sorted(peers.glob(f"llama_cpp_python-*/vendor/llama.cpp/build/bin/{name}"), reverse=True)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ModelFileError(f"{name} not found: build it from llama.cpp's source, the llama-cpp-python sdist's "
                         f"vendor/llama.cpp (the commit the appliance runs): `cmake -B build && "
                         f"cmake --build build --target {name}`; then put it on PATH or in $LLAMA_TOOLS_DIR, "
                         f"or give its path")


def requantize(src: Path, quant: str, models_dir: Path, tool: str = "", threads: int = 0) -> Path:
    """llama-quantize --allow-requantize src into models_dir/<src stem>-to-<quant>.gguf (a
    temporary file renamed into place). Quality is lost twice: once in src, once here."""
    if quant not in REQUANT_TYPES:
        raise ModelFileError(f"cannot requantize to {quant!r}: choose one of {', '.join(REQUANT_TYPES)}")
    check_gguf(src)
    exe = find_tool("llama-quantize", tool)
    writable_dir(models_dir)
    dst = models_dir / f"{src.stem}-to-{quant}.gguf"
    tmp = models_dir / f".{dst.name}.partial-{os.getpid()}"
    cmd = [str(exe), "--allow-requantize", str(src), str(tmp), quant.upper(), str(threads or os.cpu_count() or 1)]
    log.info("requantizing: %s", " ".join(cmd))
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if r.returncode != 0:
            tail = [ln for ln in r.stdout.splitlines() if ln.strip()][-1:] or [f"exit {r.returncode}"]
            raise ModelFileError(f"llama-quantize failed: {tail[0]}")
        check_gguf(tmp)
        os.replace(tmp, dst)
    except OSError as e:
        raise ModelFileError(f"cannot requantize {src} into {dst}: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dst
