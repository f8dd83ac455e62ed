#!/usr/bin/env bash
# A 1 GiB, one-core board, simulated: the appliance inside a 1 GiB memory cgroup (v2, else v1,
# whichever is writable; a child of this shell's own cgroup, so no systemd is needed), pinned to
# one core with taskset, with the settings `appliance tune` picks in there; then `appliance
# bench` at 1 and 4 clients (the client on another core, as it would be on another PC), and the
# cgroup's peak memory (target: under 900 MiB) and OOM kills. Where no cgroup is writable it
# falls back to taskset plus the process's peak RSS (VmHWM) and says so. Not run in CI.
#
#   sudo compat/small-board.sh [OUT]       (about 5 minutes on 2 x86-64 cores)
#
# The model is copied from inside the cgroup first, so its page cache is charged to the board
# as it would be on a real one. On a shared machine wrap it in `flock /tmp/appliance-cpu.lock`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/small-board-results}")
model=${MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
limit=$((1024 * 1024 * 1024))
core=${BOARD_CPU:-0}
client_core=${CLIENT_CPU:-1}
port=${PORT:-18191}
app="$root/.venv/bin/appliance"
mkdir -p "$out"
t_start=$(date +%s)
say() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$out/summary.txt"; }
: >"$out/summary.txt"

# -- a memory cgroup of our own -------------------------------------------------------------
cg='' kind=none
v2_own=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
v1_own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
for base in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  d="$base${v2_own%/}/appliance-board-$$"
  if [ -n "$v2_own" ] && grep -qw memory "$base${v2_own%/}/cgroup.subtree_control" 2>/dev/null && mkdir "$d" 2>/dev/null; then
    echo $limit >"$d/memory.max"; echo 0 >"$d/memory.swap.max" 2>/dev/null || true
    cg=$d kind=v2; break
  fi
done
if [ $kind = none ] && [ -n "$v1_own" ] && mkdir "/sys/fs/cgroup/memory${v1_own%/}/appliance-board-$$" 2>/dev/null; then
  cg="/sys/fs/cgroup/memory${v1_own%/}/appliance-board-$$"
  echo $limit >"$cg/memory.limit_in_bytes"
  echo $limit >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true  # no swap either
  kind=v1
fi
peak() {  # bytes
  case $kind in
    v2) cat "$cg/memory.peak" ;;
    v1) cat "$cg/memory.max_usage_in_bytes" ;;
  esac
}
reset_peak() {
  case $kind in
    v2) echo reset >"$cg/memory.peak" 2>/dev/null || true ;;  # Linux 6.12+
    v1) echo 0 >"$cg/memory.max_usage_in_bytes" ;;
  esac
}
ooms() {
  case $kind in
    v2) awk '$1 == "oom_kill" {print $2}' "$cg/memory.events" ;;
    v1) awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control" ;;
    *) echo "?" ;;
  esac
}
# Runs "$@" inside the board: in the cgroup (this subshell moves itself there) on one core.
board() { ( [ $kind = none ] || echo $BASHPID >"$cg/cgroup.procs"; exec taskset -c "$core" "$@" ); }

pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  [ -n "$cg" ] && { sleep 0.5; rmdir "$cg" 2>/dev/null || true; }
}
trap cleanup EXIT
if [ $kind = none ]; then
  say "no writable memory cgroup here: taskset to CPU $core plus the server's peak RSS (VmHWM) instead"
else
  say "memory cgroup $kind at $cg, limit $((limit / 1048576)) MiB, no swap; taskset to CPU $core"
fi

# The model's pages are charged to whoever reads them first: copy it from inside the board.
board cp "$model" "$out/model.gguf"
say "model copied into the board: $(( $(stat -c %s "$out/model.gguf") / 1048576 )) MiB"

rm -f "$out/board.toml"
reset_peak
t0=$(date +%s)
board "$app" tune --config "$out/board.toml" --model "$out/model.gguf" --json "$out/tune.json" | tee "$out/tune.txt"
say "appliance tune in the board: $(( $(date +%s) - t0 )) s, peak $(( $(peak) / 1048576 )) MiB; wrote $(grep -v '^#' "$out/board.toml" | tr '\n' ' ')"

reset_peak
( [ $kind = none ] || echo $BASHPID >"$cg/cgroup.procs"
  exec taskset -c "$core" "$app" serve --config "$out/board.toml" --model "$out/model.gguf" --host 127.0.0.1 \
    --port "$port" --state-dir "" --log-level warning ) >"$out/serve.log" 2>&1 &
pid=$!  # the server itself: the subshell execs taskset, which execs the appliance
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.5; done
sleep 2
idle_rss=$(awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status")
say "serving: idle RSS $idle_rss MiB, cgroup peak so far $( [ $kind = none ] && echo - || echo $(( $(peak) / 1048576 )) ) MiB"

taskset -c "$client_core" "$app" bench --url "http://127.0.0.1:$port" --label board --concurrency 1,4 \
  --max-tokens 64 --no-session-id --json "$out/bench.json" | tee "$out/bench.txt"
hwm=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$pid/status")
alive=$(kill -0 "$pid" 2>/dev/null && echo "still running" || echo "DEAD")
if [ $kind = none ]; then
  say "bench done: server peak RSS (VmHWM) $hwm MiB; server $alive"
  ok=$([ "$hwm" -lt 900 ] && echo yes || echo no)
else
  p=$(( $(peak) / 1048576 ))
  say "bench done: cgroup peak $p MiB (server VmHWM $hwm MiB), OOM kills $(ooms); server $alive"
  ok=$([ "$p" -lt 900 ] && [ "$(ooms)" = 0 ] && echo yes || echo no)
fi
say "under 900 MiB and nothing OOM-killed: $ok"
[ "$ok" = yes ] && [ "$alive" = "still running" ]
