#!/usr/bin/env bash
# The ubatch_tokens table of docs/benchmarks/memory.md in one go: for n_ubatch 64/128/256/512, the
# appliance (--ubatch-tokens N, otherwise its defaults) beside llama-server (-ub N, -np 16
# --kv-unified -c 16384), resident memory of both at idle and at their peak (VmHWM) after
# `appliance bench --compare` at 1 and 8 clients with ~200-token documents in the prompts (so
# prompt processing, which the micro-batch size changes, is part of every request). First,
# `appliance tune --dry-run --json` records the prompt speed and RSS per size in-process.
#
#   bench/memory/ubatch-table.sh [OUT]     (about 10 minutes on 2 cores; flock it on a shared machine)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:-$root/ubatch-results}")
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
app="$root/.venv/bin/appliance"
mkdir -p "$out"
"$app" tune --dry-run --model "$model" --json "$out/tune.json" | tee "$out/tune.txt"

# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]
mib() { awk -v k="$2:" '$1 == k {print int($2/1024)}' "/proc/$1/status"; }

for ub in 64 128 256 512; do
  "$peer_script" "$model" -np 16 -c 16384 --kv-unified --no-repack -ub "$ub" --port 18080 >"$out/peer-$ub.log" 2>&1 &
  pids+=($!)
  "$app" serve --host 127.0.0.1 --port 18181 --state-dir "" --log-level warning --model "$model" \
    --ubatch-tokens "$ub" >"$out/appliance-$ub.log" 2>&1 &
  pids+=($!)
  wait_ok 18080; wait_ok 18181; sleep 2
  peer=${pids[0]} me=${pids[1]}  # the peer script execs llama-server: its pid is the server's
  idle="idle RSS MiB: appliance $(mib "$me" VmRSS), llama-server $(mib "$peer" VmRSS)"
  echo "== ubatch $ub: $idle" | tee "$out/ub$ub.txt"
  "$app" bench --url http://127.0.0.1:18181 --compare http://127.0.0.1:18080 --compare-label "llama-server-ub$ub" \
    --concurrency 1,8 --max-tokens 32 --prompt-mix 200 --no-session-id --json "$out/ub$ub.json" | tee -a "$out/ub$ub.txt"
  echo "peak RSS MiB: appliance $(mib "$me" VmHWM), llama-server $(mib "$peer" VmHWM)" | tee -a "$out/ub$ub.txt"
  stop_all
done
