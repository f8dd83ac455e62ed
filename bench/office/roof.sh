#!/usr/bin/env bash
# The roof of issue 25's office workload on this machine (docs/benchmarks/office.md, "Where
# the time goes"): llama.cpp's own llama-batched-bench on the bundled model, with the
# appliance's batch sizes (-b 512 -ub 256, 2 threads), at the depths and widths the office
# decodes at: prompt processing of 16-20 prompts at once, and generation of 96 tokens by
# 16/20 sequences that already hold 512 or 1024 tokens. Writes OUT (default
# bench-results/office-roof.txt). Takes the CPU lock; about 5 minutes on 2 cores.
#
#   bench/office/roof.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/bench-results/office-roof.txt}
peers=${PEERS_DIR:-$HOME/.cache/appliance-peers}
bin=${BATCHED_BENCH:-$peers/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION:-0.3.36}/vendor/llama.cpp/build/bin/llama-batched-bench}
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
lock=${CPU_LOCK:-/tmp/appliance-cpu.lock}
threads=$(nproc)
[ -x "$bin" ] || { echo "no llama-batched-bench at $bin: bench/peers/llama-server.sh builds it" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # repack_flag: no weight repacking where AMX is advertised
repack=()
read -ra repack <<<"$(repack_flag)"
run() { echo "== llama-batched-bench $*" | tee -a "$out"; flock "$lock" "$bin" -m "$model" -t "$threads" -tb "$threads" \
        -b 512 -ub 256 -kvu "${repack[@]}" "$@" 2>/dev/null | grep -E '^\|' | tee -a "$out"; }
: > "$out"
run -c 32768 -npp 128,512,1024 -ntg 96 -npl 1,8,16,20
