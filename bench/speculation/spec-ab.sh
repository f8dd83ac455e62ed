#!/usr/bin/env bash
# A change to speculation at one client, side by side: spec.sh's four servers (this
# tree with and without speculation, llama-server without and with its n-gram drafts) and
# the appliance at an earlier commit, 8 requests per workload, rounds interleaved.
#
#   bench/speculation/spec-ab.sh OUT COMMIT [ROUNDS]    (about 15 minutes on 2 cores for 3 rounds)
#   WORKLOADS="followups" ...                       rewrite, chat, followups (default: rewrite chat)
#   TEMPERATURE=0.7 ...                             sampled (default 0: greedy)
set -euo pipefail
AB_COMMIT=${2:?usage: spec-ab.sh OUT COMMIT [ROUNDS]} ROUNDS=${3:-3} \
  WORKLOADS=${WORKLOADS:-rewrite chat} BENCH_ARGS="--requests 8" \
  exec "$(dirname "$0")/spec.sh" "${1:?usage: spec-ab.sh OUT COMMIT [ROUNDS]}" 1
