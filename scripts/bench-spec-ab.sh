#!/usr/bin/env bash
# A change to speculation at one client, side by side: this tree's appliance (speculation
# on, the default), the same appliance at an earlier commit (a git worktree, imported first
# via PYTHONPATH), this tree with --spec-budget 0, and llama-server without and with its
# n-gram drafts; one bench invocation per workload, rounds interleaved.
#
#   scripts/bench-spec-ab.sh OUT COMMIT [ROUNDS]    (about 15 minutes on 2 cores for 3 rounds)
#   WORKLOADS="followups" ...                       rewrite, chat, followups (default: rewrite chat)
#   TEMPERATURE=0.7 ...                             sampled (default 0: greedy)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench-spec-ab.sh OUT COMMIT [ROUNDS]}
commit=${2:?usage: bench-spec-ab.sh OUT COMMIT [ROUNDS]}
rounds=${3:-3}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
peer_script=${PEER_SCRIPT:-$root/../shared/peers/llama-server.sh}
old="$out/tree"
mkdir -p "$out"
[ -d "$old" ] || git -C "$root" worktree add --detach "$old" "$commit" >/dev/null
# shellcheck source=scripts/servers.sh
. "$root/scripts/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_peer 18080 "$out/peer.log" -np 16 --kv-unified
start_peer 18081 "$out/peer-spec.log" -np 16 --kv-unified --spec-type ngram-simple
start_app 18181 "$out/appliance.log"
start_app 18182 "$out/appliance-no-spec.log" --spec-budget 0
PYTHONPATH=$old start_app 18183 "$out/appliance-$commit.log"
for port in 18080 18081 18181 18182 18183; do wait_ok "$port"; done

bench() {  # NAME [bench flags]
  local name=$1; shift
  echo "== $name: --rounds $rounds $*" | tee -a "$out/all.txt"
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label spec \
    --compare "$commit=http://127.0.0.1:18183" --compare no-spec=http://127.0.0.1:18182 \
    --compare llama-server=http://127.0.0.1:18080 --compare llama-server-spec=http://127.0.0.1:18081 \
    --concurrency 1 --temperature "${TEMPERATURE:-0}" --no-session-id --rounds "$rounds" --requests 8 "$@" \
    --json "$out/$name.json" | tee -a "$out/all.txt"
}
for w in ${WORKLOADS:-rewrite chat}; do
  case $w in
    chat) bench chat --max-tokens 64 ;;
    rewrite) bench rewrite --workload rewrite --max-tokens 160 ;;
    followups) bench followups --workload rewrite --turns 3 --think-s 0.5 --max-tokens 160 ;;
    *) echo "unknown workload $w (chat, rewrite, followups)" >&2; exit 2 ;;
  esac
done
