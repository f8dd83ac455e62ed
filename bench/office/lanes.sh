#!/usr/bin/env bash
# Issue 37's lanes (docs/BENCHMARKS.md, "Background work and lanes"): the appliance at its
# defaults, the office workload (20 users, think times of mean 6 s, one conversation in nine
# opening with a ~700-token document, 96-token answers, temperature 0, no X-Session-Id) three
# times, a fresh server each: without a front-end's background requests; with Open WebUI's title and
# tags requests after every answer as Open WebUI sends them (the appliance runs them as
# background work); and with the same requests marked `X-Priority: people` (no lanes).
# Leaves in OUT (default bench-results/lanes): none.md, lanes.md, people.md (each the command
# and its report) and the JSON beside them.
#
#   bench/office/lanes.sh [OUT]       (about 9 minutes: 3 x 150 s, plus drains)
#   DURATION_S=60 bench/office/lanes.sh /tmp/lanes     a shorter look
#   USERS=12 bench/office/lanes.sh /tmp/lanes          an office the machine carries (2-core VM)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/lanes}
duration_s=${DURATION_S:-150}
users=${USERS:-20}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

for tasks in none lanes people; do
  # A fresh server a phase: the phases send the same conversations (one seed), and a
  # server kept across them answered the second phase's first turns from the first's cache
  # (people's TTFT p50 0.67 s with background work against 3.3 s without, 12 users).
  start_app 18181 "$out/appliance-$tasks.log"
  wait_ok 18181
  extra=()
  [ "$tasks" != none ] && extra=(--front-end-tasks "$tasks")
  args=(--url http://127.0.0.1:18181 --label "$tasks" --workload office --concurrency "$users"
        --duration-s "$duration_s" --think-s 6 --doc-share 1/9 --doc-tokens 700 --max-tokens 96
        --temperature 0 --seed 0 --no-session-id "${extra[@]}" --markdown --json "$out/$tasks.json")
  echo "== appliance bench ${args[*]}" | tee "$out/$tasks.md"
  "$root/.venv/bin/appliance" bench "${args[@]}" --quiet | tee -a "$out/$tasks.md"
  stop_all
done
