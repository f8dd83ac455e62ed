#!/usr/bin/env bash
# The runs of "Bursts, soak and a third peer (issue 12)" in docs/benchmarks/bursts-soak.md, in one go:
# starts the appliance at its defaults, llama.cpp's llama-server (bench/peers/llama-server.sh)
# and llama-cpp-python's own server (bench/peers/llama-cpp-python.sh) on the bundled model,
# then runs `appliance bench` against all three: a burst of 20, a chat run at 1/4/8 users with
# a plot, and a soak at 8 users with the servers' RSS. Stops them and leaves the reports
# (NAME.md: the command and its Markdown report; NAME.json, runs.jsonl, chat.png) in OUT (default bench-results/bursts-soak).
#
#   bench/bursts-soak/burst-chat-soak.sh [OUT]        (about 25 minutes on 2 cores; SOAK_S=180 per server)
#   RUNS="burst chat" bench/bursts-soak/burst-chat-soak.sh [OUT]     only some of the runs (default: burst chat soak)
#
# Each benchmark takes /tmp/appliance-cpu.lock (flock), so it runs alone on a machine that
# others share; the servers wait idle meanwhile. Needs the plot extra (matplotlib).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/bursts-soak}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
soak_s=${SOAK_S:-180}
lock=${CPU_LOCK:-/tmp/appliance-cpu.lock}
mkdir -p "$out"
rm -f "$out/runs.jsonl"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]


app=http://127.0.0.1:18181 llama_server=http://127.0.0.1:18080 lcp=http://127.0.0.1:18282
start_app 18181 "$out/appliance.log"
start_peer 18080 "$out/llama-server.log" -np 16 --kv-unified
"$root/bench/peers/llama-cpp-python.sh" "$model" --port 18282 >"$out/llama-cpp-python.log" 2>&1 &
pids+=($!)
wait_ok 18181 /health
wait_ok 18080 /health
wait_ok 18282 /v1/models  # llama_cpp.server has no /health

runs=" ${RUNS:-burst chat soak} "
bench() {  # NAME, then bench flags; all three servers, clients without session ids
  local name=$1; shift
  [[ $runs == *" $name "* ]] || return 0
  local args=(--url "$app" --compare "llama-server=$llama_server" --compare "llama-cpp-python=$lcp"
              --no-session-id --markdown --jsonl "$out/runs.jsonl" --tag "$name" --json "$out/$name.json" "$@")
  echo "== $name: appliance bench ${args[*]}" | tee "$out/$name.md"
  # The exit code is the report's (1: an answer of the burst missing); keep going to the end.
  flock "$lock" "$root/.venv/bin/appliance" bench "${args[@]}" | tee -a "$out/$name.md" || true
  rss | tee -a "$out/$name.md"
}

rss() {  # RSS of the three servers, MiB
  local line="RSS MiB:" port pid
  for port in 18181 18080 18282; do
    pid=$("$root/.venv/bin/python" -c "from appliance.bench import listening_pid; print(listening_pid($port) or '')")
    line+=" :$port $([ -n "$pid" ] && echo $(( $(ps -o rss= -p "$pid") / 1024 )) || echo -)"
  done
  echo "$line"
}

# A burst: 20 product descriptions let go at once from one address; all 20 must come back.
bench burst --workload burst --concurrency 20 --max-tokens 64 --temperature 0
# Chat: users holding 3-turn conversations (think time 1 s, history resent), 1/4/8 users.
bench chat --workload chat --concurrency 1,4,8 --turns 3 --think-s 1 --max-tokens 48 --temperature 0 \
  --plot "$out/chat.png"
# Soak: 8 users in steady chat for SOAK_S seconds per server, RSS every 5 s.
bench soak --workload soak --concurrency 8 --turns 3 --think-s 1 --max-tokens 48 --temperature 0 \
  --duration-s "$soak_s" --warmup-s 30 --rss-every-s 5
stop_all
echo "reports in $out"
