#!/usr/bin/env bash
# Issue 26's last check (docs/benchmarks/documents-admin.md): does an open /admin page cost the engine
# anything? Starts the appliance at its defaults, then in one run `appliance bench` at 16 clients
# (single-turn chat, 64-token answers, temperature 0, no session ids) ROUNDS times without the
# page and ROUNDS times with /admin open in headless Debian chromium (bench/documents-admin/admin-open.py: the
# page polls /admin/status every 3 s for the whole measurement), interleaved A B B A A B ...
# One warm-up level first, not counted. Leaves in OUT (default bench-results/admin): admin.md
# (the commands, every run's line and the summary), one JSON per run, the logs.
#
#   bench/documents-admin/admin.sh [OUT]          (about 12 minutes on 2 cores at ROUNDS=3, REQUESTS=64)
#   ROUNDS=2 REQUESTS=32 bench/documents-admin/admin.sh /tmp/admin     a shorter look
#
# chromium runs at nice 19: it stands for the operator's browser on another machine, so what is
# measured is the server answering /admin/status, not chromium drawing the page on the engine's
# cores (its own CPU seconds are reported beside). The benchmark takes /tmp/appliance-cpu.lock.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/admin}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-64}
lock=${CPU_LOCK:-/tmp/appliance-cpu.lock}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]
url=http://127.0.0.1:18181
args=(--url "$url" --concurrency 16 --requests "$requests" --max-tokens 64 --temperature 0
      --no-session-id --quiet)

run() {  # NAME: one bench level, the page open when NAME starts with "admin"
  local name=$1 page="" log="$out/$1.page.log"
  if [[ $name == admin* ]]; then
    nice -n 19 "$root/.venv/bin/python" "$root/bench/documents-admin/admin-open.py" "$url" >"$log" 2>&1 &
    page=$!
    for _ in $(seq 1 600); do grep -q . "$log" && break; sleep 0.1; done
    [ "$(head -1 "$log")" = open ] || { echo "the admin page did not open: $(cat "$log")" >&2; return 1; }
  fi
  "$root/.venv/bin/appliance" bench "${args[@]}" --label "$name" --json "$out/$name.json" >"$out/$name.txt"
  if [ -n "$page" ]; then
    kill -TERM "$page"
    wait "$page" || true
    tail -1 "$log" >"$out/$name.page.json"
  fi
  echo "== $name done${page:+, the page: $(cat "$out/$name.page.json")}" | tee -a "$out/admin.md"
}

measure() {
  echo "== appliance bench ${args[*]} --label NAME --json $out/NAME.json; ROUNDS=$rounds, NAME admin-* with /admin open" \
    | tee "$out/admin.md"
  "$root/.venv/bin/appliance" bench "${args[@]}" --requests 16 --label warm-up >/dev/null
  local r
  for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then run "plain-$r"; run "admin-$r"; else run "admin-$r"; run "plain-$r"; fi
  done
  "$root/.venv/bin/python" "$root/bench/documents-admin/admin-summary.py" "$out" | tee -a "$out/admin.md"
}

start_app 18181 "$out/appliance.log"
wait_ok 18181
exec 9>"$lock"
flock 9
measure
flock -u 9
stop_all
echo "report in $out/admin.md"
