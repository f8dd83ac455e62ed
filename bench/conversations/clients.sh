#!/usr/bin/env bash
# Issue 7, part 2: 16 users holding 4-turn conversations without session ids, as most
# OpenAI clients send them, each from its own address. llama-server (-np 16 --kv-unified,
# the better peer in the issue's table) and three appliances run side by side in one bench
# invocation, rounds interleaved: the defaults, --idle-kv-tokens 0 (idle conversations stay
# in the KV cache) and --share-cores off (fixed threads sleeping after 600 spins, the default
# before share_cores).
#
#   bench/conversations/clients.sh [OUT] [ROUNDS]       (about 25 minutes on 2 cores for 3 rounds)
#   SESSION_IDS=1 bench/conversations/clients.sh ...     the same users sending X-Session-Id
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/bench-clients}
rounds=${2:-3}
ids=(--no-session-id)
[ "${SESSION_IDS:-0}" = 1 ] && ids=()
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_peer 18080 "$out/peer.log" -np 16 --kv-unified
start_app 18181 "$out/default.log"
start_app 18182 "$out/idle0.log" --idle-kv-tokens 0
start_app 18183 "$out/fixed.log" --share-cores off
for port in 18080 18181 18182 18183; do wait_ok "$port"; done

"$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label default \
  --compare idle0=http://127.0.0.1:18182 --compare fixed-threads=http://127.0.0.1:18183 \
  --compare llama-server=http://127.0.0.1:18080 \
  --concurrency 16 --turns 4 --think-s 1 --max-tokens 48 --temperature 0 "${ids[@]}" \
  --rounds "$rounds" --json "$out/clients.json" | tee "$out/clients.txt"
for port in 18181 18182 18183; do
  echo "== appliance on $port: RSS $(( $(ps -o rss= -p "$(pgrep -f "port $port" | head -1)") / 1024 )) MiB"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^appliance_(session|parked|cache)" || true
done | tee -a "$out/clients.txt"
echo "== llama-server RSS $(( $(ps -o rss= -p "$(pgrep -f "llama-server -m" | head -1)") / 1024 )) MiB" | tee -a "$out/clients.txt"
