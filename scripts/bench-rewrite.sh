#!/usr/bin/env bash
# Issue 7, part 3, at one client: the rewrite workload (the answer mostly copies a given
# paragraph or snippet) against four servers side by side in one bench invocation, rounds
# interleaved: the appliance with speculation (the default) and without (--spec-budget 0),
# llama-server without speculation and with its best n-gram type (scripts/spec-pick.sh
# picked ngram-simple here; PEER_SPEC overrides).
#
#   scripts/bench-rewrite.sh [OUT] [ROUNDS]       (about 8 minutes on 2 cores for 2 rounds)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/bench-rewrite}
rounds=${2:-2}
peer_spec=${PEER_SPEC:---spec-type ngram-simple}
peer_script=${PEER_SCRIPT:-$root/../shared/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
# shellcheck source=scripts/servers.sh
. "$root/scripts/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_peer 18080 "$out/peer.log" -np 16 --kv-unified
# shellcheck disable=SC2086 # PEER_SPEC is several words
start_peer 18081 "$out/peer-spec.log" -np 16 --kv-unified $peer_spec
start_app 18181 "$out/appliance-spec.log"
start_app 18182 "$out/appliance-no-spec.log" --spec-budget 0
for port in 18080 18081 18181 18182; do wait_ok "$port"; done

"$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label spec \
  --compare no-spec=http://127.0.0.1:18182 --compare llama-server=http://127.0.0.1:18080 \
  --compare llama-server-spec=http://127.0.0.1:18081 \
  --workload rewrite --concurrency 1 --requests 8 --max-tokens 160 --temperature 0 --no-session-id \
  --rounds "$rounds" --json "$out/rewrite.json" | tee "$out/rewrite.txt"
