#!/usr/bin/env bash
# The quantization table of docs/benchmarks/memory.md, through the appliance itself, in one go:
# requantize the bundled file to Q8_0, IQ4_NL and Q4_0 (llama-quantize --allow-requantize),
# measure size, prompt speed, perplexity and greedy agreement (bench/memory/quant-quality.py), then
# serve each file in turn with the appliance's defaults and run `appliance bench` at 1, 8 and 16
# clients, recording resident memory at idle and its peak (VmHWM) after the run.
#
#   bench/memory/quant-table.sh [OUT]          (about 15 minutes on 2 cores)
#   bench/memory/quant-table.sh --tools-only   (just build llama-quantize and llama-perplexity)
#
# The tools are built (once) in the peer build of bench/peers/llama-server.sh: llama.cpp
# from the llama-cpp-python sdist, the commit the appliance runs. On a shared machine wrap it
# in `flock /tmp/appliance-cpu.lock`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/appliance-peers}
src="$PEERS_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
bin="$src/build/bin"
if [ ! -x "$bin/llama-quantize" ] || [ ! -x "$bin/llama-perplexity" ]; then
  if [ ! -d "$src" ]; then
    mkdir -p "$PEERS_DIR"
    "$root/.venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: -d "$PEERS_DIR" "llama-cpp-python==$VERSION"
    tar xzf "$PEERS_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS_DIR"
  fi
  [ -f "$src/build/CMakeCache.txt" ] || cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$src/build" -j"$(nproc)" --target llama-quantize llama-perplexity >/dev/null
fi
[ "${1:-}" = "--tools-only" ] && { echo "$bin/llama-quantize"; echo "$bin/llama-perplexity"; exit 0; }

out=$(realpath -m "${1:-$root/quant-results}")
bundled=$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
mkdir -p "$out/models"
files=("$bundled")
for q in Q8_0 IQ4_NL Q4_0; do
  f="$out/models/bundled-to-${q,,}.gguf"
  # Into a temporary name first: a run stopped half-way must not leave a truncated file behind
  # that the next run would take as done.
  [ -f "$f" ] || { "$bin/llama-quantize" --allow-requantize "$bundled" "$f.part" "$q" "$(nproc)" \
      >"$out/quantize-$q.log" 2>&1 && mv "$f.part" "$f"; }
  files+=("$f")
done

echo "== quality and prompt speed"
"$root/.venv/bin/python" "$root/bench/memory/quant-quality.py" "${files[@]}" --json "$out/quality.json"

pid=
stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; pid=; }
trap stop EXIT
for f in "${files[@]}"; do
  name=$(basename "$f" .gguf)
  "$root/.venv/bin/appliance" serve --host 127.0.0.1 --port 18181 --state-dir "" --log-level warning \
    --model "$f" >"$out/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf http://127.0.0.1:18181/health >/dev/null 2>&1 && break; sleep 0.5; done
  sleep 2
  idle=$(awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status")
  echo "== $name: appliance bench --concurrency 1,8,16 --max-tokens 64 --no-session-id" | tee "$out/$name.txt"
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label "$name" --concurrency 1,8,16 \
    --max-tokens 64 --no-session-id --json "$out/$name.json" | tee -a "$out/$name.txt"
  peak=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$pid/status")
  echo "RSS MiB: idle $idle, peak $peak" | tee -a "$out/$name.txt"
  stop
done
