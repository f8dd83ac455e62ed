#!/usr/bin/env bash
# Which of llama-server's n-gram speculation types is best here? Runs the rewrite workload at
# one client against llama-server with each type, one at a time, and prints tokens/s.
# bench/conversations/all.sh compares the appliance with the winner (PEER_SPEC="--spec-type TYPE").
#
#   bench/speculation/spec-pick.sh [OUT]         (about 5 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
for type in none ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache; do
  args=()
  [ "$type" = none ] || args=(--spec-type "$type")
  "$peer_script" "$model" -c 16384 --no-repack --port 18080 -np 16 --kv-unified "${args[@]}" \
    >"$out/peer-$type.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf http://127.0.0.1:18080/health >/dev/null 2>&1 && break; sleep 0.5; done
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18080 --label "llama-server-$type" \
    --workload rewrite --concurrency 1 --requests 8 --max-tokens 160 --no-session-id \
    --json "$out/spec-pick-$type.json" | grep -E "^\s*1\s" | sed "s/^/$type: /" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
