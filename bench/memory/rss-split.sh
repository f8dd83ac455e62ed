#!/usr/bin/env bash
# Resident memory of the appliance split into anonymous and file-backed pages, per model file,
# with llama.cpp's weight repacking on and off: `appliance serve` at its defaults, one short
# request, then /proc/PID/status. File-backed pages (the mmapped GGUF) are reclaimable; the
# anonymous ones (KV cache, compute buffer, repacked weights, Python) are not.
#
#   bench/memory/rss-split.sh MODEL.gguf [MODEL2.gguf ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
port=${PORT:-18301}
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
for m in "$@"; do
  for rp in on off; do
    "$root/.venv/bin/appliance" serve --model "$m" --port "$port" --repack "$rp" --state-dir "$state" \
      >"$state/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
    curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d '{"messages":[{"role":"user","content":"Say hi"}],"max_tokens":8}' >/dev/null
    kb() { awk -v k="$1:" '$1 == k {print int($2 / 1024)}' "/proc/$pid/status"; }
    echo "$(basename "$m") repack=$rp: RSS $(kb VmRSS) MiB = anonymous $(kb RssAnon) + file $(kb RssFile)"
    kill "$pid"; wait "$pid" || true
  done
done
