#!/usr/bin/env bash
# A/B of idle_kv_tokens (docs/benchmarks/speculation.md, issue 7): two appliances side by side, one at the
# default (idle conversations beyond a quarter of the KV cache are parked in RAM), one with
# --idle-kv-tokens 0 (no limit). Rewriting at 16 clients (new conversations pile up), then
# 16 users x 4 turns without session ids (each user's conversation idles between turns);
# then each server's session counters.
#
#   bench/speculation/idle-kv-ab.sh [OUT]        (about 30 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/idle-kv-ab}
mkdir -p "$out"
"$root/.venv/bin/appliance" serve --port 18501 --state-dir "" --log-level warning >"$out/cap.log" 2>&1 &
a=$!
"$root/.venv/bin/appliance" serve --port 18502 --state-dir "" --idle-kv-tokens 0 --log-level warning >"$out/nocap.log" 2>&1 &
b=$!
trap 'kill $a $b 2>/dev/null || true; wait' EXIT
for port in 18501 18502; do
  for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
done
bench=("$root/.venv/bin/appliance" bench --url http://127.0.0.1:18501 --label cap4096
       --compare http://127.0.0.1:18502 --compare-label nocap --no-session-id --quiet)
"${bench[@]}" --workload rewrite --concurrency 16 --requests 64 --max-tokens 160 --temperature 0 --rounds 2
"${bench[@]}" --workload chat --concurrency 16 --turns 4 --think-s 1 --max-tokens 48 --temperature 0 --rounds 2
for port in 18501 18502; do
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^appliance_(session|parked)" || true
done
