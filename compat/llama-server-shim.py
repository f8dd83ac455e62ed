#!/usr/bin/env python3
"""llama-server's command line, served by the appliance: what compat/llama-suite.sh names as
LLAMA_SERVER_BIN_PATH, so each of llama.cpp's server tests starts its own appliance with the
flags it asked for (a context of 256, an API key, an alias, --seed, -np, --batch-size, ...).

    llama-server-shim.py --port 8080 --ctx-size 256 --parallel 2 --api-key K ...

Each flag the appliance has an equivalent for becomes an `appliance serve` option; a flag it
cannot honour is refused (exit 2, the flag named on stderr), so a test that needs it fails at
its start, not later for a reason that is hard to see. The model is always the bundled one
(MODEL): the tests' own tiny models (stories260K, tinyllama) are downloads, and this machine is
offline. A test harness, not shipped in appliance/: a user pointing a llama-server launcher at
the appliance would want its -m honoured, which this one replaces on purpose.

Standard library only; it execs the appliance's Python (LLAMA_SUITE_PYTHON) from the
repository root, so the pid the test holds is the appliance's own and its SIGTERM reaches it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


class Refused(Exception):
    """A flag the appliance cannot honour: str() says which and why."""


# llama-server's spellings of one option -> its canonical name (the long form the tests use).
SPELLINGS = {"-m": "--model", "-hf": "--hf-repo", "-hfr": "--hf-repo", "-hff": "--hf-file", "-mu": "--model-url",
             "-c": "--ctx-size", "-np": "--parallel", "-b": "--batch-size", "-ub": "--ubatch-size",
             "-t": "--threads", "-n": "--n-predict", "-a": "--alias", "-s": "--seed", "-v": "--verbose",
             "-ctk": "--cache-type-k", "-ctv": "--cache-type-v", "-ngl": "--n-gpu-layers", "--gpu-layers": "--n-gpu-layers",
             "-fa": "--flash-attn", "--no-webui": "--no-ui", "--webui": "--ui", "--predict": "--n-predict",
             "-kvu": "--kv-unified", "-cb": "--cont-batching"}
# Flags without a value whose meaning the appliance already has, so they change nothing.
SAME = {
    "--offline": "the appliance never downloads while serving",
    "--cont-batching": "the appliance always batches continuously",
    "--kv-unified": "the appliance's KV cache is always one unified pool (each slot may use all of --ctx-size)",
    "--jinja": "the appliance renders the GGUF's own chat template with Jinja",
    "--no-jinja": "the GGUF's template and llama-server's built-in one for it (ChatML for the bundled Qwen2.5) agree",
    "--no-slots": "the appliance's /slots shows no prompt, text or session, what --no-slots hides (COMPATIBILITY.md)",
    "--slots": "the appliance's /slots always answers",
    "--ui": "the chat page is always served",
    "--metrics": "the appliance's /metrics always answers (this machine, or an admin key)",
}
# Flags that name a model: replaced by the bundled one (they take a value).
MODEL_FLAGS = {"--model", "--hf-repo", "--hf-file", "--model-url"}
# Flags the appliance cannot honour, and why (the value, if any, is not read).
REFUSED = {
    "--no-ui": "the chat page is always served (docs/COMPATIBILITY.md)",
    "--tags": "the appliance serves one model under one name and takes any `model` value: no tags or aliases",
    "--chat-template": "the GGUF's own template is the one template",
    "--chat-template-file": "the GGUF's own template is the one template",
    "--embedding": "no embeddings", "--embeddings": "no embeddings", "--reranking": "no reranking",
    "--rerank": "no reranking", "--lora": "no LoRA adapters", "--model-draft": "no draft model (its speculation "
    "drafts from the conversation)", "--mmproj": "text only", "--mmproj-url": "text only", "--media-path": "text only",
    "--slot-save-path": "sessions are saved by the appliance's own state_dir", "--context-shift": "no context shift",
    "--api-key-file": "give --api-key", "--models-dir": "one model", "--models-max": "one model",
    "--models-preset": "one model", "--no-models-autoload": "one model", "--sleep-idle-seconds": "no sleep",
    "--ui-mcp-proxy": "no MCP proxy", "--tools": "no built-in tools", "--mcp-servers-config": "no MCP",
    "--mcp-servers-json": "no MCP", "--pooling": "no embeddings", "--grp-attn-n": "no group attention",
    "--grp-attn-w": "no group attention", "--spec-type": "speculation drafts from the conversation",
    "--reasoning-format": "no reasoning parser", "--reasoning": "no reasoning parser",
    "--cache-ram": "parking is the appliance's park_ram_mb", "--no-cache-idle-slots": "idle sessions are the "
    "appliance's to keep", "--backend_sampling": "sampling runs on the CPU", "--cors-origins": "web origins are "
    "the appliance's allowed_origins, other ports of this machine included only when listed (SECURITY.md)",
}


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise Refused(f"{flag} {value!r}: not an integer") from None


def _host(flag: str, value: str) -> list[str]:
    if "," in value:
        raise Refused(f"{flag} {value}: the appliance listens on one address (use :: for every one)")
    return ["--host", value]


def _alias(flag: str, value: str) -> list[str]:
    if "," in value:
        raise Refused(f"{flag} {value}: one model name (the appliance takes any `model` value: no aliases)")
    return ["--model-name", value]


def _kv_type(flag: str, value: str) -> list[str]:
    if value not in ("f16", "q8_0"):
        raise Refused(f"{flag} {value}: the KV cache is f16 or q8_0 (both halves alike)")
    return ["--kv-type", value]


def _seed(flag: str, value: str) -> list[str]:
    seed = _int(flag, value)
    # llama-server's -1 and LLAMA_DEFAULT_SEED (0xFFFFFFFF) are "a fresh seed each request".
    return ["--default-seed", "-1" if seed < 0 or seed == 0xFFFFFFFF else str(seed)]


def _gpu(flag: str, value: str) -> list[str]:
    if value != "0":
        raise Refused(f"{flag} {value}: the appliance runs on the CPU")
    return []


def _flash(flag: str, value: str) -> list[str]:
    if value not in ("auto", "off"):
        raise Refused(f"{flag} {value}: llama.cpp's default attention is the one the appliance runs")
    return []


# Flags with a value: how each becomes appliance options (the settings below need the whole
# command line: the context and the batch).
VALUED: dict[str, Callable[[str, str], list[str]]] = {
    "--port": lambda f, v: ["--port", str(_int(f, v))],
    "--host": _host,
    "--temp": lambda f, v: ["--default-temperature", v],
    "--seed": _seed,
    "--threads": lambda f, v: ["--threads", str(_int(f, v))],
    "--alias": _alias,
    "--cache-type-k": _kv_type,
    "--cache-type-v": _kv_type,
    "--n-gpu-layers": _gpu,
    "--flash-attn": _flash,
}
SETTINGS = ("--ctx-size", "--parallel", "--batch-size", "--ubatch-size", "--n-predict", "--api-key")



def read(argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """llama-server's arguments -> (appliance options mapped one by one, the settings read
    whole, notes on what changes nothing); Refused for a flag the appliance cannot honour."""
    out: list[str] = []
    settings: dict[str, str] = {}
    notes: list[str] = []
    args = iter(argv)
    for arg in args:
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag = SPELLINGS.get(flag, flag)
        if flag in SAME:
            notes.append(f"{flag}: {SAME[flag]}")
        elif flag == "--verbose":
            out += ["--log-level", "debug"]
        elif flag in REFUSED:
            raise Refused(f"{flag}: {REFUSED[flag]}")
        elif flag in VALUED or flag in SETTINGS or flag in MODEL_FLAGS:
            value = inline if eq else next(args, None)
            if value is None:
                raise Refused(f"{flag} needs a value")
            if flag in MODEL_FLAGS:
                notes.append(f"{flag} {value}: the bundled model is served instead (offline; docs/COMPATIBILITY.md)")
            elif flag in SETTINGS:
                settings[flag] = value
            else:
                out += VALUED[flag](flag, value)
        else:
            raise Refused(f"{arg}: not a llama-server flag this launcher maps onto the appliance")
    return out, settings, notes


def sized(settings: dict[str, str], unified: bool) -> list[str]:
    """The context, slots, batch and answer length: llama-server's --ctx-size is the whole KV
    cache, each of --parallel slots getting an equal share unless the cache is unified."""
    out: list[str] = []
    slots = _int("--parallel", settings["--parallel"]) if "--parallel" in settings else 0
    if slots > 0:
        out += ["--slots", str(slots)]
    ctx = _int("--ctx-size", settings["--ctx-size"]) if "--ctx-size" in settings else 0
    if ctx > 0:
        per_slot = ctx if unified or slots <= 0 else ctx // slots
        out += ["--kv-tokens", str(ctx), "--ctx-per-slot", str(per_slot)]
    if "--batch-size" in settings:
        # Whole batches, as llama-server reads a prompt: one progress report per --batch-size.
        out += ["--batch-tokens", str(_int("--batch-size", settings["--batch-size"])), "--prefill-chunk", "0"]
    if "--ubatch-size" in settings:
        out += ["--ubatch-tokens", str(_int("--ubatch-size", settings["--ubatch-size"]))]
    n_predict = _int("--n-predict", settings["--n-predict"]) if "--n-predict" in settings else -1
    if n_predict > 0:
        out += ["--default-max-tokens", str(n_predict), "--max-tokens-limit", str(max(n_predict, 2048))]
    return out


def keys_file(key: str) -> str:
    """--api-key as a keys file of one operator key (llama-server's one key may do anything),
    in LLAMA_SUITE_TMP, which llama-suite.sh removes when the run ends."""
    fd, path = tempfile.mkstemp(prefix="keys-", dir=os.environ.get("LLAMA_SUITE_TMP") or None)
    with os.fdopen(fd, "w") as f:
        f.write(f"{key} admin\n")
    return path


def command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`appliance serve` and its options for llama-server's arguments, and the notes."""
    out, settings, notes = read(argv)
    model = os.environ.get("MODEL") or str(BUNDLED)
    serve = ["-m", "appliance", "serve", "--model", model, "--state-dir", "", "--log-level", "warning",
             "--grace-s", "1", "--save-timeout-s", "0",
             "--tls", "off",  # llama-server speaks plain http, with --api-key too (the appliance's https is its own CA's)
             *sized(settings, any(SPELLINGS.get(a, a) == "--kv-unified" for a in argv)), *out]
    if "--api-key" in settings:
        serve += ["--api-keys-file", keys_file(settings["--api-key"])]
    return serve, notes


def main() -> int:
    try:
        serve, notes = command(sys.argv[1:])
    except Refused as e:
        print(f"llama-server-shim: refused: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"llama-server-shim: accepted, {note}", file=sys.stderr)
    python = os.environ.get("LLAMA_SUITE_PYTHON") or str(ROOT / ".venv" / "bin" / "python")
    print(f"llama-server-shim: {python} {' '.join(serve)}", file=sys.stderr, flush=True)
    os.chdir(ROOT)  # `python -m appliance` runs this checkout's code
    os.execv(python, [python, *serve])


if __name__ == "__main__":
    sys.exit(main())
