# Sourced by the benchmark scripts under bench/ that start servers of their own (conversations/all.sh,
# summary/before-after.sh, office/office.sh, speculation/spec.sh, memory/ubatch-table.sh, ...): add each server's
# PID to `pids`; all are stopped on exit.
# shellcheck shell=bash
pids=()

stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

wait_ok() {  # PORT [PATH]: until the server on 127.0.0.1:PORT answers PATH (default /health)
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1${2:-/health}" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

# Weight repacking as the appliance's repack = "auto" does it: off only where the CPU
# advertises Intel AMX, which some VMs' kernels do not enable (SIGILL; docs/benchmarks/setup.md, "AMX").
repack_flag() {
  if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then echo --no-repack; fi
}

# The next two use the caller's $root, $peer_script and $model.
# shellcheck disable=SC2154
start_peer() {  # PORT LOG [llama-server flags]: llama-server on $model in the background
  local port=$1 log=$2; shift 2
  local repack=()
  read -ra repack <<<"$(repack_flag)"
  "$peer_script" "$model" -c 16384 "${repack[@]}" --port "$port" "$@" >"$log" 2>&1 &
  pids+=($!)
}

# shellcheck disable=SC2154
start_app() {  # PORT LOG [appliance serve flags]: the appliance in the background, no saved sessions, plain http
  local port=$1 log=$2; shift 2
  "$root/.venv/bin/appliance" serve --host 127.0.0.1 --port "$port" --log-level warning --state-dir "" --tls off "$@" \
    >"$log" 2>&1 &
  pids+=($!)
}

peak_rss() {  # PORT: the peak resident memory (VmHWM, MiB) of the process listening on 127.0.0.1:PORT
  local pid
  pid=$(ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  if [ -n "$pid" ]; then awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status"; else echo "?"; fi
}
