#!/usr/bin/env bash
# Issue 7, part 3, at one client: the rewrite workload (the answer mostly copies a given
# paragraph or snippet) against the four servers of spec.sh side by side, 8 requests,
# rounds interleaved.
#
#   bench/speculation/rewrite.sh [OUT] [ROUNDS]       (about 8 minutes on 2 cores for 2 rounds)
set -euo pipefail
WORKLOADS=rewrite ROUNDS=${2:-2} BENCH_ARGS="--requests 8" \
  exec "$(dirname "$0")/spec.sh" "${1:-/tmp/bench-rewrite}" 1
