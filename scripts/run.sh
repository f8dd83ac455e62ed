#!/usr/bin/env bash
# Set up (idempotently) and start the appliance on the bundled model.
# Extra arguments go to `appliance serve`; APPLIANCE_* environment variables apply too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" bundled-model
cd "$root"
exec "$root/.venv/bin/appliance" serve "$@"
