#!/usr/bin/env bash
# The multi-turn table's workload (16 users x 4 turns, think 1 s, 48-token answers) side by
# side at the defaults: the appliance from this tree, the appliance at an earlier commit and
# llama-server (-np 16 --kv-unified), one `appliance bench` run with rounds interleaved.
#
#   scripts/bench-turns-ab.sh OUT COMMIT [ROUNDS]       users sending X-Session-Id
#   NO_IDS=1 scripts/bench-turns-ab.sh OUT COMMIT ...   users sending none, as most clients
#   (about 10 minutes on 2 cores for 3 rounds)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench-turns-ab.sh OUT COMMIT [ROUNDS]}
commit=${2:?usage: bench-turns-ab.sh OUT COMMIT [ROUNDS]}
rounds=${3:-3}
ids=()
[ "${NO_IDS:-0}" = 1 ] && ids=(--no-session-id)
# shellcheck disable=SC2034  # both read by servers.sh
peer_script=${PEER_SCRIPT:-$root/../shared/peers/llama-server.sh}
# shellcheck disable=SC2034
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
# shellcheck source=scripts/servers.sh
. "$root/scripts/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

# The earlier commit in a git worktree, imported first through PYTHONPATH (same venv).
[ -d "$out/tree" ] || git -C "$root" worktree add --detach "$out/tree" "$commit" >/dev/null
start_peer 18080 "$out/peer.log" -np 16 --kv-unified
start_app 18181 "$out/this.log"
PYTHONPATH=$out/tree start_app 18182 "$out/old.log"
for port in 18080 18181 18182; do wait_ok "$port"; done
"$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label this \
  --compare "$commit=http://127.0.0.1:18182" --compare llama-server=http://127.0.0.1:18080 \
  --concurrency 16 --turns 4 --think-s 1 --max-tokens 48 --temperature 0 "${ids[@]}" \
  --rounds "$rounds" --quiet --json "$out/turns.json" | tee -a "$out/turns.txt"
