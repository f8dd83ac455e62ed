#!/usr/bin/env bash
# Every side-by-side run in docs/BENCHMARKS.md, in one go: starts llama.cpp's llama-server
# (bench/peers/llama-server.sh) and the appliance with each configuration, runs
# `appliance bench --compare`, stops both, and leaves the reports in OUT (default
# bench-results/). Only the two servers being compared run at any time.
#
#   bench/conversations/all.sh [OUT]        (about an hour on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
bench="$root/.venv/bin/appliance bench"
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]


# start PEER_ARGS... -- APPLIANCE_ARGS...
start() {
  local peer_args=() app_args=() seen=0
  for a in "$@"; do
    if [ "$a" = "--" ]; then seen=1; continue; fi
    if [ $seen = 0 ]; then peer_args+=("$a"); else app_args+=("$a"); fi
  done
  start_peer 18080 "$out/peer.log" "${peer_args[@]}"
  start_app 18181 "$out/appliance.log" "${app_args[@]}"
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

# Every run uses the appliance's default settings unless its label says otherwise, and
# clients as they really are: no X-Session-Id, each simulated user on its own address.

# Clients without session ids: 16 users x 4 turns, 48-token answers, median of 3 rounds.
turns=(--concurrency 16 --turns 4 --think-s 1 --max-tokens 48 --temperature 0 --no-session-id --rounds 3)
start -np 8 --
run clients-np8 --compare-label llama-server-np8 "${turns[@]}"
stop_all
start -np 16 --kv-unified --
run clients-np16kvu --compare-label llama-server-np16-kvu "${turns[@]}"
# The same with X-Session-Id, for comparison.
run clients-named-np16kvu --compare-label llama-server-np16-kvu "${turns[@]/--no-session-id/--fresh-system}"
stop_all

# First tokens sooner: 8 users arriving together with prompts of mixed lengths.
mixed=(--concurrency 8 --requests 8 --arrival together --prompt-mix 20,60,150,300,600,40,100,200
       --max-tokens 32 --no-session-id --fresh-system --rounds 3)
start -np 8 --
run mixed-np8 --compare-label llama-server-np8 "${mixed[@]}"
stop_all
start -np 16 --kv-unified --
run mixed-np16kvu --compare-label llama-server-np16-kvu "${mixed[@]}"
stop_all
start -np 16 --kv-unified -- --prefill-group 0
run mixed-group0 --label appliance-group0 --compare-label llama-server-np16-kvu "${mixed[@]}"
stop_all

# Speculative decoding: three workloads at 1, 4, 8 and 16 clients, the appliance with
# speculation (default) against llama-server without, then the appliance without against
# llama-server with its best n-gram speculation ($PEER_SPEC, chosen by bench/speculation/spec-pick.sh).
chat=(--concurrency 1,4,8,16 --max-tokens 64 --no-session-id)
rewrite=(--workload rewrite --concurrency 1,4,8,16 --max-tokens 160 --no-session-id)
followups=(--workload rewrite --turns 3 --think-s 0.5 --concurrency 1,4,8,16 --max-tokens 160 --no-session-id)
peer_spec=(${PEER_SPEC:---spec-type ngram-simple})
start -np 16 --kv-unified --
run spec-chat --label appliance-spec --compare-label llama-server "${chat[@]}"
run spec-rewrite --label appliance-spec --compare-label llama-server "${rewrite[@]}"
run spec-followups --label appliance-spec --compare-label llama-server "${followups[@]}"
stop_all
start -np 16 --kv-unified "${peer_spec[@]}" -- --spec-budget 0
run nospec-chat --label appliance-nospec --compare-label llama-server-spec "${chat[@]}"
run nospec-rewrite --label appliance-nospec --compare-label llama-server-spec "${rewrite[@]}"
run nospec-followups --label appliance-nospec --compare-label llama-server-spec "${followups[@]}"
stop_all
echo "reports in $out"
