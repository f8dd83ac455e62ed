#!/usr/bin/env bash
# Open WebUI 0.12.4 from PyPI, offline, unchanged and at its defaults (its built-in tools on),
# in front of the appliance at its defaults (issue 37): once through its Ollama connection,
# once through its OpenAI one, three people each, driven in chromium (compat/open-webui/chat.py).
# Checks: every chat answers; once each tools set (admins', users') was read, a new chat's first text within 5 s;
# the three people Open WebUI forwards (ENABLE_FORWARD_USER_INFO_HEADERS) are three people in /admin.
#
#   compat/open-webui/run.sh [OUT]        OUT default /tmp/open-webui-check
#   CONNECTIONS=ollama compat/open-webui/run.sh OUT     one connection only
#
# Cost: Open WebUI's install is ~7.4 GB (torch among its dependencies), made once in
# $OWUI_VENV (default ~/.cache/appliance/open-webui); then ~4 minutes a connection on 2 cores,
# most of it the first chat reading the 6,626-token tools block.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/open-webui-check}
venv=${OWUI_VENV:-$HOME/.cache/appliance/open-webui}
mkdir -p "$out"
if [ ! -x "$venv/bin/open-webui" ]; then
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install -q "open-webui==0.12.4"
fi
# shellcheck source=bench/common/servers.sh
. "$root/bench/common/servers.sh"  # pids, stop_all on exit, wait_ok PORT [PATH]

rc=0
for conn in ${CONNECTIONS:-ollama openai}; do
  rm -rf "${out:?}/$conn" && mkdir -p "$out/$conn"
  start_app 18282 "$out/$conn/appliance.log" --log-level info --trusted-proxies 127.0.0.1
  wait_ok 18282
  ollama=false; openai=false
  [ "$conn" = ollama ] && ollama=true
  [ "$conn" = openai ] && openai=true
  # Offline: no model downloads, no update checks; the connection under test only. Open WebUI
  # shows a model to its admin only until the admin grants access: BYPASS_MODEL_ACCESS_CONTROL
  # is that grant for everyone (without it the second person's page says "Select a model").
  DATA_DIR="$out/$conn/data" WEBUI_SECRET_KEY=open-webui-check OFFLINE_MODE=true HF_HUB_OFFLINE=1 \
    ENABLE_OLLAMA_API=$ollama OLLAMA_BASE_URL=http://127.0.0.1:18282 \
    ENABLE_OPENAI_API=$openai OPENAI_API_BASE_URL=http://127.0.0.1:18282/v1 OPENAI_API_KEY=none \
    ENABLE_FORWARD_USER_INFO_HEADERS=true ENABLE_VERSION_UPDATE_CHECK=false BYPASS_MODEL_ACCESS_CONTROL=true \
    "$venv/bin/open-webui" serve --host 127.0.0.1 --port 18283 >"$out/$conn/open-webui.log" 2>&1 &
  pids+=($!)
  wait_ok 18283 /health
  "$root/.venv/bin/python" "$root/compat/open-webui/chat.py" --url http://127.0.0.1:18283 \
    --appliance http://127.0.0.1:18282 --label "$conn" | tee "$out/$conn/result.json" || rc=1
  stop_all
done
exit $rc
