#!/usr/bin/env bash
# Issue 25's office run (docs/benchmarks/office.md): starts the appliance at its defaults and
# llama.cpp's llama-server (bench/peers/llama-server.sh) twice on the bundled model,
# `-np 16 --kv-unified` and `-np 8`, then runs `appliance bench --workload office` against all
# three: 20 users, 150 s per server and round, think times of mean 6 s, one conversation in
# nine opening with a ~700-token document, 96-token answers at temperature 0, two interleaved
# rounds. Stops them and leaves in OUT (default bench-results/office): office.md (the command
# and its Markdown report), office.json, office.png and the servers' logs.
#
#   bench/office/office.sh [OUT]     (about 16 minutes: 3 servers x 2 rounds x 150 s, plus drains)
#   DURATION_S=60 ROUNDS=1 bench/office/office.sh /tmp/office     a shorter look
#   SESSION_IDS=1 bench/office/office.sh      clients send X-Session-Id (default: none, as most do)
#
# The benchmark takes /tmp/appliance-cpu.lock (flock), so it runs alone on a machine that
# others share; the servers wait idle meanwhile. Needs the plot extra (matplotlib).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/office}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
duration_s=${DURATION_S:-150}
rounds=${ROUNDS:-2}
lock=${CPU_LOCK:-/tmp/appliance-cpu.lock}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_app 18181 "$out/appliance.log"
start_peer 18080 "$out/llama-server-np16.log" -np 16 --kv-unified
start_peer 18081 "$out/llama-server-np8.log" -np 8
for port in 18181 18080 18081; do wait_ok "$port"; done

session=(--no-session-id)
[ -n "${SESSION_IDS:-}" ] && session=()
args=(--url http://127.0.0.1:18181
      --compare "llama-server-np16=http://127.0.0.1:18080" --compare "llama-server-np8=http://127.0.0.1:18081"
      --workload office --concurrency 20 --duration-s "$duration_s" --think-s 6 --doc-share 1/9
      --doc-tokens 700 --max-tokens 96 --temperature 0 --seed 0 --rounds "$rounds" "${session[@]}"
      --markdown --json "$out/office.json" --plot "$out/office.png")
echo "== appliance bench ${args[*]}" | tee "$out/office.md"
# The exit code is the report's (1: a server answered nothing); keep going to stop the servers.
flock "$lock" "$root/.venv/bin/appliance" bench "${args[@]}" | tee -a "$out/office.md" || true
echo "peak RSS (VmHWM, MiB): appliance $(peak_rss 18181), llama-server-np16 $(peak_rss 18080)," \
     "llama-server-np8 $(peak_rss 18081)" | tee -a "$out/office.md"
stop_all
echo "reports in $out"
