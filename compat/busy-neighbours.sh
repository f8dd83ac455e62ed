#!/usr/bin/env bash
# The whole suite from a fresh clone while a CPU-bound loop runs on every core (issue 34):
# no test may depend on a quiet machine. Usage: compat/busy-neighbours.sh [DIR] [pytest args]
# DIR (default /tmp/busy-clone) is replaced by a fresh clone of this repository's HEAD.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/tmp/busy-clone}; shift || true
rm -rf "$dir" && git clone -q "$src" "$dir" && cd "$dir" || exit 1
git log --oneline -1
pids=()
for _ in $(seq "$(nproc)"); do sh -c 'while :; do :; done' & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
start=$(date +%s)
./scripts/test.sh "$@"
rc=$?
echo "rc=$rc elapsed_s=$(( $(date +%s) - start )) neighbours=${#pids[@]}"
exit $rc
