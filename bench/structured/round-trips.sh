#!/usr/bin/env bash
# Issue 37's tool round trips (docs/benchmarks/structured.md): tool-round-trips.py against the
# appliance from this tree and from an earlier commit (before the repeated-call guard), one
# after the other, each at its defaults.
#
#   bench/structured/round-trips.sh OUT COMMIT       (about 5 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: round-trips.sh OUT COMMIT}
commit=${2:?usage: round-trips.sh OUT COMMIT}
mkdir -p "$out"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

[ -d "$out/tree" ] || git -C "$root" worktree add --detach "$out/tree" "$commit" >/dev/null
PYTHONPATH=$out/tree start_app 18182 "$out/appliance-$commit.log"
start_app 18181 "$out/appliance.log"
for port in 18181 18182; do wait_ok "$port"; done
for run in "$commit 18182" "this 18181"; do
  read -r label port <<<"$run"
  echo "== $label: bench/structured/tool-round-trips.py --url http://127.0.0.1:$port" | tee -a "$out/all.txt"
  "$root/.venv/bin/python" "$root/bench/structured/tool-round-trips.py" --url "http://127.0.0.1:$port" \
    --json "$out/$label.json" | tee -a "$out/all.txt"
done
