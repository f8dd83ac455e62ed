#!/usr/bin/env bash
# People mode against open mode, side by side in one run (issue 36): two appliances at the
# default settings on the bundled model, one with auth = "people" (its bench users signed in,
# each with their own session cookie and CSRF token, through /admin/people and the invite),
# one open; `appliance bench` chat at 16 clients, level by level on both.
#   bench/people/people.sh OUT_DIR [CONCURRENCY]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: bench/people/people.sh OUT_DIR [CONCURRENCY]}
levels=${2:-16}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
source "$root/bench/common/servers.sh"

start_app 18301 "$out/open.log"
start_app 18302 "$out/people.log" --auth people --state-dir "$out/state"
wait_ok 18301 && wait_ok 18302
"$root/.venv/bin/appliance" bench --url http://127.0.0.1:18302 --label people \
  --compare open=http://127.0.0.1:18301 --concurrency "$levels" --workload chat \
  --json "$out/people-vs-open.json" --markdown | tee "$out/people-vs-open.md"
