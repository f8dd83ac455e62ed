#!/usr/bin/env bash
# A change anywhere, side by side at the defaults: llama-server (-np 16 --kv-unified), the
# appliance from this tree and the appliance at an earlier commit, one `appliance bench` run
# with rounds interleaved, chat at 1, 8 and 16 clients, without and with X-Session-Id.
#
#   bench/summary/before-after.sh OUT COMMIT [LEVELS] [ROUNDS]   (about 20 minutes on 2 cores for 2 rounds)
#   TURNS=4 bench/summary/before-after.sh OUT COMMIT 16 3        the multi-turn table's workload: 4-turn
#       conversations, think 1 s, 48-token answers (about 20 minutes for 3 rounds)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: before-after.sh OUT COMMIT [LEVELS] [ROUNDS]}
commit=${2:?usage: before-after.sh OUT COMMIT [LEVELS] [ROUNDS]}
levels=${3:-1,8,16}
rounds=${4:-2}
workload=(--max-tokens 64)
[ -n "${TURNS:-}" ] && workload=(--turns "$TURNS" --think-s 1 --max-tokens 48)
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

# The earlier commit in a git worktree, imported first through PYTHONPATH (same venv).
[ -d "$out/tree" ] || git -C "$root" worktree add --detach "$out/tree" "$commit" >/dev/null
start_peer 18080 "$out/peer.log" -np 16 --kv-unified
start_app 18181 "$out/appliance.log"
PYTHONPATH=$out/tree start_app 18182 "$out/appliance-$commit.log"
for port in 18080 18181 18182; do wait_ok "$port"; done

bench() {  # NAME [bench flags]
  local name=$1; shift
  echo "== $name: --concurrency $levels ${workload[*]} --rounds $rounds $*" | tee -a "$out/all.txt"
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label this \
    --compare "$commit=http://127.0.0.1:18182" --compare llama-server=http://127.0.0.1:18080 \
    --concurrency "$levels" "${workload[@]}" --temperature 0 --rounds "$rounds" "$@" \
    --json "$out/$name.json" | tee -a "$out/all.txt"
}
bench no-ids --no-session-id
bench ids
{
  echo "== RSS MiB: this $(( $(ps -o rss= -p "$(pgrep -f "port 18181" | head -1)") / 1024 )),"\
       "$commit $(( $(ps -o rss= -p "$(pgrep -f "port 18182" | head -1)") / 1024 )),"\
       "llama-server $(( $(ps -o rss= -p "$(pgrep -f "port 18080" | head -1)") / 1024 ))"
} | tee -a "$out/all.txt"
