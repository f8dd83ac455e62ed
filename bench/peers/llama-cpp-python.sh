#!/usr/bin/env bash
# Start llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`) on a GGUF model,
# as a peer to benchmark against. It needs FastAPI, which pins its own Starlette, so it gets
# a virtual environment of its own under $PEERS_DIR/llama-cpp-python-server/ (never .venv/).
# The llama-cpp-python wheel is the one scripts/setup.sh built for this machine (same
# llama.cpp commit and build flags as the appliance); the server's extras come from PyPI,
# pinned. A re-run whose pins did not change installs nothing.
#
#   bench/peers/llama-cpp-python.sh MODEL.gguf [llama_cpp.server args...]
#   e.g. bench/peers/llama-cpp-python.sh models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --port 18282
#
# Settings comparable to the appliance's defaults: a 16,384-token context (the appliance's
# kv_tokens, llama-server's -c), 2 threads for decode and prefill, the chat template from the
# GGUF (no --chat_format), 127.0.0.1:18282. It runs one request at a time; the others wait
# (--interrupt_requests False: by default a new request ends the running stream early with
# [DONE], which would count a cut-off answer as complete). Later args override these.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/appliance-peers}
venv=$PEERS_DIR/llama-cpp-python-server
model=${1:?usage: llama-cpp-python.sh MODEL.gguf [llama_cpp.server args...]}; shift
# llama-cpp-python[server]'s extras (its pyproject.toml), pinned; starlette-context <0.4 is its own bound.
pins=(fastapi==0.165.0 uvicorn==0.54.0 sse-starlette==3.7.0 starlette-context==0.3.6
      pydantic-settings==2.16.3 PyYAML==6.0.4 diskcache==5.6.3)

# The wheel scripts/setup.sh built: its keyed directory first, then the wheelhouse itself.
wheel_dir=$("$root/scripts/setup.sh" --print-build | sed -n 's/^wheel_dir=//p')
wheel=$(compgen -G "$wheel_dir/llama_cpp_python-$VERSION-*.whl" | head -n1 || true)
[ -n "$wheel" ] || wheel=$(compgen -G "$(dirname "$wheel_dir")/llama_cpp_python-$VERSION-*.whl" | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "no llama_cpp_python-$VERSION wheel in $wheel_dir: run scripts/setup.sh first" >&2
  exit 1
fi

want="$wheel $(sha256sum "$wheel" | cut -c1-16) ${pins[*]}"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
  echo "setting up $venv (llama-cpp-python $VERSION from $wheel)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" "${pins[@]}"
  "$venv/bin/python" -m pip freeze --disable-pip-version-check > "$venv/freeze.txt"
  echo "$want" > "$venv/.installed"
fi

exec "$venv/bin/python" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port 18282 \
  --n_ctx 16384 --n_threads 2 --n_threads_batch 2 --interrupt_requests False "$@"
