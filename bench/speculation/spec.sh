#!/usr/bin/env bash
# Issue 7, part 3, the whole grid: three workloads (chat, rewrite, follow-ups) at 1, 4, 8
# and 16 clients against four servers running side by side, one bench invocation per
# workload with the servers interleaved level by level: the appliance with speculation (the
# default) and without (--spec-budget 0), llama-server without speculation and with its best
# n-gram type (bench/speculation/spec-pick.sh picked ngram-simple here; PEER_SPEC overrides).
#
#   bench/speculation/spec.sh [OUT] [LEVELS]     (about an hour on 2 cores; LEVELS default 1,4,8,16)
#   WORKLOADS="rewrite" ROUNDS=2 BENCH_ARGS="--requests 8" ...   a part of it (rewrite.sh)
#   AB_COMMIT=ce4b4f9 ...   a fifth server: the appliance at that commit (spec-ab.sh)
#   TEMPERATURE=0.7 ...     sampled (default 0: greedy)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/bench-spec}
levels=${2:-1,4,8,16}
workloads=${WORKLOADS:-chat rewrite followups}
read -r -a extra <<<"${BENCH_ARGS:-}"
peer_spec=${PEER_SPEC:---spec-type ngram-simple}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_peer 18080 "$out/peer.log" -np 16 --kv-unified
# shellcheck disable=SC2086 # PEER_SPEC is several words
start_peer 18081 "$out/peer-spec.log" -np 16 --kv-unified $peer_spec
start_app 18181 "$out/appliance-spec.log"
start_app 18182 "$out/appliance-no-spec.log" --spec-budget 0
ports=(18080 18081 18181 18182)
ab=()
if [ -n "${AB_COMMIT:-}" ]; then  # a git worktree at that commit, imported first via PYTHONPATH
  [ -d "$out/tree" ] || git -C "$root" worktree add --detach "$out/tree" "$AB_COMMIT" >/dev/null
  PYTHONPATH=$out/tree start_app 18183 "$out/appliance-$AB_COMMIT.log"
  ports+=(18183)
  ab=(--compare "$AB_COMMIT=http://127.0.0.1:18183")
fi
for port in "${ports[@]}"; do wait_ok "$port"; done

bench() {  # NAME [bench flags]
  local name=$1; shift
  echo "== $name: --rounds ${ROUNDS:-1} ${extra[*]} $*" | tee -a "$out/all.txt"
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18181 --label spec \
    --compare no-spec=http://127.0.0.1:18182 --compare llama-server=http://127.0.0.1:18080 \
    --compare llama-server-spec=http://127.0.0.1:18081 "${ab[@]}" \
    --concurrency "$levels" --temperature "${TEMPERATURE:-0}" --no-session-id --rounds "${ROUNDS:-1}" "${extra[@]}" "$@" \
    --json "$out/$name.json" | tee -a "$out/all.txt"
}
for w in $workloads; do
  case $w in
    chat) bench chat --max-tokens 64 ;;
    rewrite) bench rewrite --workload rewrite --max-tokens 160 ;;
    followups) bench followups --workload rewrite --turns 3 --think-s 0.5 --max-tokens 160 ;;
    *) echo "unknown workload $w (chat, rewrite, followups)" >&2; exit 2 ;;
  esac
done
