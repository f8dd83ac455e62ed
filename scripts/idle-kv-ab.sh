#!/bin/bash
# A/B: idle_kv_tokens default (4096) vs 0 (no limit): rewrite at 16 clients (new conversations
# pile up) and 16 users x 4 turns without session ids (each user's conversation idles between turns).
cd "$(dirname "$0")/.."
env ${OMPENV:-} .venv/bin/appliance serve --port 18501 --state-dir "" --log-level warning > ${OUT:-/tmp}/idleab-a.log 2>&1 & a=$!
env ${OMPENV:-} .venv/bin/appliance serve --port 18502 --state-dir "" --idle-kv-tokens 0 --log-level warning > ${OUT:-/tmp}/idleab-b.log 2>&1 & b=$!
for p in 18501 18502; do for i in $(seq 180); do curl -sf http://127.0.0.1:$p/health >/dev/null && break; sleep 1; done; done
B=".venv/bin/appliance bench --url http://127.0.0.1:18501 --label cap4096 --compare http://127.0.0.1:18502 --compare-label nocap --no-session-id --quiet"
$B --workload rewrite --concurrency 16 --requests 64 --max-tokens 160 --temperature 0 --rounds 2
$B --workload chat --concurrency 16 --turns 4 --think-s 1 --max-tokens 48 --temperature 0 --rounds 2
for p in 18501 18502; do curl -s http://127.0.0.1:$p/metrics | grep -E "^appliance_(cache|session|park|kv)" | head -20; done
kill $a $b; wait
