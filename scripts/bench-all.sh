#!/usr/bin/env bash
# Every side-by-side run in docs/BENCHMARKS.md, in one go: starts llama.cpp's llama-server
# (../shared/peers/llama-server.sh) and the appliance with each configuration, runs
# `appliance bench --compare`, stops both, and leaves the reports in OUT (default
# bench-results/). Only the two servers being compared run at any time.
#
#   scripts/bench-all.sh [OUT]        (about 20 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bench-results}
peer_script=${PEER_SCRIPT:-$root/../shared/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
bench="$root/.venv/bin/appliance bench"
mkdir -p "$out"
pids=()

stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

wait_ok() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

# start PEER_ARGS... -- APPLIANCE_ARGS...
start() {
  local peer_args=() app_args=() seen=0
  for a in "$@"; do
    if [ "$a" = "--" ]; then seen=1; continue; fi
    if [ $seen = 0 ]; then peer_args+=("$a"); else app_args+=("$a"); fi
  done
  # --no-repack: this VM advertises Intel AMX that its kernel does not enable, and
  # llama.cpp's AMX path then crashes on the first prompt (see docs/BENCHMARKS.md).
  "$peer_script" "$model" -c 16384 --no-repack --port 18080 "${peer_args[@]}" >"$out/peer.log" 2>&1 &
  pids+=($!)
  "$root/.venv/bin/appliance" serve --host 127.0.0.1 --port 18181 --log-level warning --state-dir "" \
    "${app_args[@]}" >"$out/appliance.log" 2>&1 &
  pids+=($!)
  wait_ok 18080
  wait_ok 18181
}

rss() {  # RSS of both servers, MiB
  local app peer
  app=$(pgrep -f "appliance serve --host 127.0.0.1 --port 18181" | head -1)
  peer=$(pgrep -f "llama-server -m" | head -1)
  echo "RSS MiB: appliance $(( $(ps -o rss= -p "$app") / 1024 )), llama-server $(( $(ps -o rss= -p "$peer") / 1024 ))"
}

run() {  # NAME, then bench flags
  local name=$1; shift
  echo "== $name: appliance bench $*" | tee "$out/$name.txt"
  $bench --url http://127.0.0.1:18181 --compare http://127.0.0.1:18080 --json "$out/$name.json" "$@" \
    | tee -a "$out/$name.txt"
  rss | tee -a "$out/$name.txt"
}

# Issue 2: defaults (8 slots) against llama-server -np 8.
start -np 8 --
run foundation --compare-label llama-server-np8 --concurrency 1,4,8,16 --max-tokens 64
stop_all

# Issue 3: 16 slots against -np 8, then against -np 16 --kv-unified; cold shared prompts
# and a long paste.
start -np 8 -- --slots 16
run burst-np8 --label appliance-16 --compare-label llama-server-np8 --concurrency 8,16 --max-tokens 64 --fresh-system
stop_all
start -np 16 --kv-unified -- --slots 16
run burst-np16kvu --label appliance-16 --compare-label llama-server-np16-kvu --concurrency 8,16 --max-tokens 64 --fresh-system
run paste-np16kvu --label appliance-16 --compare-label llama-server-np16-kvu --concurrency 4 --requests 8 \
  --max-tokens 128 --long-prompt-tokens 3000
stop_all

# Issue 4: 16 users x 4 turns against -np 8, with 8 and with 16 slots.
start -np 8 --
run turns-8slots --compare-label llama-server-np8 --concurrency 16 --turns 4 --think-s 1 --max-tokens 64 --fresh-system
stop_all
start -np 8 -- --slots 16
run turns-16slots --label appliance-16 --compare-label llama-server-np8 --concurrency 16 --turns 4 --think-s 1 \
  --max-tokens 64 --fresh-system
stop_all
echo "reports in $out"
