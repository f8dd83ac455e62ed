#!/usr/bin/env bash
# Issue 28: llama.cpp's own server test suite (tools/server/tests/unit, assertions unchanged)
# run against the appliance on the bundled model, as a client of llama-server would see it.
#
#   flock /tmp/appliance-cpu.lock nice -n 19 compat/llama-suite.sh [OUT] [pytest args...]
#   e.g. ... compat/llama-suite.sh /tmp/llama-suite -k "logit_bias or n_probs"
#
# Each test starts its own appliance with the flags it asked for: the suite's utils.py runs
# LLAMA_SERVER_BIN_PATH, here compat/llama-server-shim.py, which maps llama-server's flags
# onto `appliance serve` (a context of 256, -np, --api-key, --alias, --seed, --batch-size, ...),
# always on the bundled model, and refuses the flags it cannot honour. About 3 s of start-up a
# test; EXTERNAL=1 runs the older, quicker mode instead: one appliance for every test
# (DEBUG_EXTERNAL, PORT), where a test's own flags are not applied (those tests then fail by
# setup, marked NEW: docs/COMPATIBILITY.md's table is for the default mode).
#
# Writes OUT/run.txt (pytest's output), OUT/junit.xml and OUT/summary.txt: the pass counts and
# each failure with its first error line, marked NEW when docs/COMPATIBILITY.md does not list
# its test with a reason. The suite's source comes from the llama-cpp-python sdist (the
# llama.cpp commit the appliance runs), its requirements into a venv of its own. PYTHON names
# the appliance's Python (default: the checkout's .venv).
#
# Selection rule: the test files a client of a chat server on one model exercises. Left out,
# as features the appliance does not have: embeddings and
# rerank (test_embedding, test_rerank), LoRA (test_lora), speculative decoding with a draft
# model (test_speculative), multimodal (test_vision_api), the router and multi-model and model
# reload (test_router, test_stream, test_sleep), the Vertex API
# (test_compat_gcp), MCP, proxy and built-in tools (test_mcp_servers,
# test_proxy, test_tools_builtin), other models' chat templates (test_template, test_tool_call:
# each loads another template or model), the tests marked slow (each downloads another model),
# and server-flag features with our own counterparts (test_ctx_shift, test_slot_save,
# test_kv_keep_only_active, test_metrics). In EXTERNAL mode the one server takes the suite's
# presets' answer length (n_predict 64) as its default max_tokens.
set -euo pipefail

# One function, read whole before it runs: bash reads a script as it goes, and this one runs
# for minutes (an edit meanwhile would change what it runs).
main() {
  root=$(cd "$(dirname "$0")/.." && pwd)
  out=${1:-/tmp/llama-suite}
  [ $# -gt 0 ] && shift
  local version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
  local peers=${PEERS_DIR:-$HOME/.cache/appliance-peers}
  local port=${PORT:-18290}
  local model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
  local files=(test_basic test_chat_completion test_completion test_compat_oai_responses test_compat_anthropic test_infill
               test_security test_tokenize test_ignore_eos)

  local src="$peers/llama_cpp_python-$version/vendor/llama.cpp/tools/server/tests"
  if [ ! -d "$src" ]; then
    mkdir -p "$peers"
    pip download --quiet --no-deps --no-binary :all: -d "$peers" "llama-cpp-python==$version"
    tar xzf "$peers/llama_cpp_python-$version.tar.gz" -C "$peers"
  fi
  local venv="$peers/llama-suite-venv"
  if [ ! -x "$venv/bin/pytest" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$src/requirements.txt"
  fi

  mkdir -p "$out"
  local python=${PYTHON:-$root/.venv/bin/python}
  local mode=()
  # shellcheck source=bench/common/servers.sh
  . "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]
  if [ -n "${EXTERNAL:-}" ]; then
    # As start_app, but `python -m` from $root: a worktree runs its own code, not the venv's editable install.
    (cd "$root" && exec "$python" -m appliance serve --host 127.0.0.1 --port "$port" \
      --log-level warning --state-dir "" --model "$model" --slots 4 --default-max-tokens 64) >"$out/server.log" 2>&1 &
    pids+=($!)
    wait_ok "$port"
    mode=(env DEBUG_EXTERNAL=1)
  else
    # A fresh temporary folder for the keys files the shim writes (--api-key), removed at the end.
    rm -rf "$out/tmp" && mkdir -m 700 "$out/tmp"
    mode=(env LLAMA_SERVER_BIN_PATH="$root/compat/llama-server-shim.py" LLAMA_SUITE_PYTHON="$python"
          LLAMA_SUITE_TMP="$out/tmp" MODEL="$model")
  fi

  local tests=() status=0
  for f in "${files[@]}"; do tests+=("unit/$f.py"); done
  (cd "$src" && "${mode[@]}" PORT="$port" PYTHONPATH="$root/compat" "$venv/bin/python" -m pytest \
    -p no:cacheprovider -p llama_suite_plugin -q -rfE -m "not slow" --junitxml="$out/junit.xml" "${tests[@]}" "$@") \
    >"$out/run.txt" 2>&1 || status=$?
  rm -rf "$out/tmp"

  "$venv/bin/python" - "$out/junit.xml" "$root/docs/COMPATIBILITY.md" >"$out/summary.txt" <<'PY'
import re
import sys
import xml.etree.ElementTree as ET

# The tests docs/COMPATIBILITY.md gives a reason for: its table rows "| `file::test` | ...".
known = set(re.findall(r"^\| `([a-z_]+::[a-z_0-9]+)", open(sys.argv[2]).read(), re.M))
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
failed = []
for case in cases:
    bad = case.find("failure")
    if bad is None:
        bad = case.find("error")
    if bad is not None:
        first = (bad.get("message") or "").strip().splitlines()[:1]
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        mark = "" if test.split("[")[0] in known else "NEW "
        failed.append(f"{mark}{test}  {first[0][:160] if first else ''}")
skipped = sum(case.find("skipped") is not None for case in cases)
print(f"{len(cases) - len(failed) - skipped} passed, {len(failed)} failed, {skipped} skipped of {len(cases)}")
print(f"{sum(f.startswith('NEW ') for f in failed)} failures not explained in docs/COMPATIBILITY.md")
print("\n".join(failed))
PY
  head -2 "$out/summary.txt"
  return "$status"
}

main "$@"
