#!/usr/bin/env bash
# Build (once) and start llama.cpp's own llama-server on a GGUF model, as the peer to
# benchmark against. The llama.cpp source comes from the llama-cpp-python sdist on PyPI,
# so the peer runs the very same llama.cpp commit as the appliance.
#
#   bench/peers/llama-server.sh MODEL.gguf [extra llama-server args...]
#   e.g. bench/peers/llama-server.sh models/x.gguf -np 8 -c 16384 --port 18080
#
# The build (about 6 minutes on 2 cores) is cached under $PEERS_DIR.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/appliance-peers}
model=${1:?usage: llama-server.sh MODEL.gguf [llama-server args...]}; shift
src="$PEERS_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
bin="$src/build/bin"
if [ ! -x "$bin/llama-server" ]; then
  mkdir -p "$PEERS_DIR"
  if [ ! -d "$src" ]; then
    pip download --quiet --no-deps --no-binary :all: -d "$PEERS_DIR" "llama-cpp-python==$VERSION"
    tar xzf "$PEERS_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS_DIR"
  fi
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$src/build" -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >/dev/null
fi
threads=$(nproc)
exec "$bin/llama-server" -m "$model" -t "$threads" -tb "$threads" --host 127.0.0.1 "$@"
