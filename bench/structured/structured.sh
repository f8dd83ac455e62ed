#!/usr/bin/env bash
# The structured-output and n runs of docs/benchmarks/structured.md: starts llama-server
# (bench/peers/llama-server.sh, -np 8 --kv-unified) and the appliance at its defaults,
# then runs bench/structured/structured.py against both. Output in $OUT (default /tmp/bench-structured).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/bench-structured}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait
}
trap stop_all EXIT
# --no-repack: this VM advertises AMX its kernel does not enable (see docs/benchmarks/setup.md).
"$peer_script" "$model" -c 16384 -np 8 --kv-unified --no-repack --port 18080 >"$out/peer.log" 2>&1 &
pids+=($!)
"$root/.venv/bin/appliance" serve --host 127.0.0.1 --port 18181 --log-level warning --state-dir "" \
  >"$out/appliance.log" 2>&1 &
pids+=($!)
for port in 18080 18181; do
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.5; done
done
"$root/.venv/bin/python" "$root/bench/structured/structured.py" --appliance http://127.0.0.1:18181 \
  --peer http://127.0.0.1:18080 --json "$out/structured.json" | tee "$out/structured.txt"
app=$(pgrep -f "appliance serve --host 127.0.0.1 --port 18181" | head -1)
peer=$(pgrep -f "llama-server -m" | head -1)
echo "RSS MiB: appliance $(( $(ps -o rss= -p "$app") / 1024 )), llama-server $(( $(ps -o rss= -p "$peer") / 1024 ))" \
  | tee -a "$out/structured.txt"
