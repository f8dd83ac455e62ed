#!/usr/bin/env bash
# Issue 27's document figures (docs/benchmarks/documents-admin.md), with bench/documents-admin/document.py:
#   first   the appliance (defaults) and llama-server (-np 16 --kv-unified, bench/peers/
#           llama-server.sh on the same model file) each given the same ~3,000-token document
#           and a question, REPS times with a fresh nonce: the first progress note, the first
#           answer token, and a follow-up question's first token (the document cached);
#   budget  a ~6,000-token document on the appliance at ctx_per_slot 4096 (the default: a 400,
#           then the first part the page offers) and at 8192 (the whole), 4 others streaming
#           meanwhile: its TTFT, the others' gaps while it is read, each server's RSS.
# Leaves in OUT (default bench-results/documents): documents.md (the commands and both
# tables), first.json, budget.json and the servers' logs.
#
#   bench/documents-admin/document.sh [OUT]        (about 10 minutes on 2 cores at REPS=3)
#   REPS=1 PARTS=first bench/documents-admin/document.sh /tmp/doc      a shorter look
#
# The measurement takes /tmp/appliance-cpu.lock (flock); the servers wait idle meanwhile.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/documents}
peer_script=${PEER_SCRIPT:-$root/bench/peers/llama-server.sh}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
reps=${REPS:-3}
parts=${PARTS:-first budget}
lock=${CPU_LOCK:-/tmp/appliance-cpu.lock}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

start_app 18181 "$out/appliance.log"
start_peer 18080 "$out/llama-server.log" -np 16 --kv-unified
[[ $parts == *budget* ]] && start_app 18183 "$out/appliance-ctx8192.log" --ctx-per-slot 8192
for port in 18181 18080 18183; do
  [[ $port == 18183 && $parts != *budget* ]] || wait_ok "$port"
done

measure() {
  local part
  : >"$out/documents.md"
  for part in $parts; do
    local servers=(--server appliance=http://127.0.0.1:18181 --server llama-server=http://127.0.0.1:18080)
    [ "$part" = budget ] && servers=(--server ctx4096=http://127.0.0.1:18181 --server ctx8192=http://127.0.0.1:18183)
    local cmd=("$root/.venv/bin/python" "$root/bench/documents-admin/document.py" "$part" "${servers[@]}"
               --reps "$reps" --json "$out/$part.json")
    echo "== ${cmd[*]#"$root/"}" | tee -a "$out/documents.md"
    "${cmd[@]}" | tee -a "$out/documents.md"
  done
}

exec 9>"$lock"
flock 9
measure
flock -u 9
stop_all
echo "report in $out/documents.md"
