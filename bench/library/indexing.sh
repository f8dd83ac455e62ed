#!/usr/bin/env bash
# Indexing a 100-page PDF while 8 clients chat (issue 38): one appliance at the default
# settings; `appliance bench` chat at 8 clients (no session ids, as most clients send none)
# with the library quiet, then again while bench/library/indexing.py adds the PDF to
# /admin/library and replaces it each time it is indexed, so indexing runs all along.
#   bench/library/indexing.sh OUT_DIR [REQUESTS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: bench/library/indexing.sh OUT_DIR [REQUESTS]}
requests=${2:-160}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
source "$root/bench/common/servers.sh"
py="$root/.venv/bin/python"

"$py" "$root/bench/library/indexing.py" pdf "$out/handbook-100.pdf"
start_app 18401 "$out/app.log" --state-dir "$out/state"
wait_ok 18401
run() {  # LABEL
  "$root/.venv/bin/appliance" bench --url http://127.0.0.1:18401 --label "$1" --concurrency 8 \
    --requests "$requests" --workload chat --no-session-id --json "$out/$1.json" --markdown | tee "$out/$1.md"
}
run quiet
echo "indexing alone (pages a minute, nothing else running):"
"$py" "$root/bench/library/indexing.py" loop http://127.0.0.1:18401 "$out/handbook-100.pdf" 1 | tee "$out/alone.jsonl"
"$py" "$root/bench/library/indexing.py" loop http://127.0.0.1:18401 "$out/handbook-100.pdf" >"$out/rounds.jsonl" &
loop=$!
run indexing
kill "$loop"; wait "$loop" || true
echo "indexing rounds beside the chats (the last one cut short when they ended):"; cat "$out/rounds.jsonl"
echo "RSS peak of the appliance: $(peak_rss 18401) MiB"
