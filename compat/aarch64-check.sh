#!/usr/bin/env bash
# aarch64, checked on x86-64: cross-compile the appliance's llama.cpp (the llama-cpp-python
# sdist's vendor/llama.cpp, the same commit) for the Raspberry Pi 4 (armv8-a, Cortex-A72)
# and the Pi 5 (armv8.2-a+dotprod, Cortex-A76) with Debian's aarch64 cross compiler, run a
# short greedy generation of the model under qemu-user emulating each CPU, and compare with
# the x86 run teacher-forced: x86's greedy token must be in the ARM run's top 5 at every
# step (identical tokens across architectures are not guaranteed). Not run in CI.
#
#   compat/aarch64-check.sh [MODEL] [OUT]      (as root it apt-gets the cross compiler and qemu-user)
#
# Env: N_GEN (greedy tokens, default 32), THREADS (default nproc), PEERS_DIR (where the
# llama.cpp source is, as for bench/peers/llama-server.sh), JOBS (build jobs).
# Wrap it in `flock /tmp/appliance-cpu.lock` on a shared machine: it uses every core.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$(realpath "${1:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}")
out=$(realpath -m "${2:-$root/aarch64-results}")
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/appliance-peers}
src="$PEERS_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
n_gen=${N_GEN:-32}
threads=${THREADS:-$(nproc)}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
t_start=$(date +%s)
say() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$out/summary.txt"; }
: >"$out/summary.txt"

need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v cmake >/dev/null || need+=(cmake)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
  else
    echo "missing: run  sudo apt-get install ${need[*]}" >&2; exit 1
  fi
fi
if [ ! -d "$src" ]; then
  mkdir -p "$PEERS_DIR"
  "$root/.venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: -d "$PEERS_DIR" "llama-cpp-python==$VERSION"
  tar xzf "$PEERS_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS_DIR"
fi
say "llama.cpp from llama-cpp-python $VERSION ($src); model $model; $threads threads"

# The chat prompt, as the appliance's template writes it.
printf '%s' $'<|im_start|>system\nYou are a helpful assistant in an office.<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in two sentences.<|im_end|>\n<|im_start|>assistant\n' >"$out/prompt.txt"

# x86-64: the same program against the peer build's libraries (GGML_NATIVE, as setup.sh
# builds the appliance's), built here only if bench/peers/llama-server.sh has not yet.
t0=$(date +%s)
if [ ! -f "$src/build/bin/libllama.so" ]; then
  [ -f "$src/build/CMakeCache.txt" ] || cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF >"$out/x86-cmake.log"
  cmake --build "$src/build" -j"$jobs" --target llama >"$out/x86-build.log"
fi
g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$root/compat/aarch64/check.cpp" \
  -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o "$out/check-x86_64"
say "x86-64 native build: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
APPLIANCE_NO_REPACK=1 "$out/check-x86_64" gen "$model" "$threads" "$n_gen" "$out/prompt.txt" \
  >"$out/x86.tokens" 2>"$out/x86.log"
say "x86-64 greedy run: $(( $(date +%s) - t0 )) s; $(grep -m1 '^prompt' "$out/x86.log")"
grep '^text:' "$out/x86.log" | tee -a "$out/summary.txt"

fail=0
for board in pi4:armv8-a:cortex-a72 pi5:armv8.2-a+dotprod:cortex-a76; do
  IFS=: read -r name arch cpu <<<"$board"
  b="$src/build-aarch64-$name"
  t0=$(date +%s)
  cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$arch" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    >"$out/$name-cmake.log"
  # Only ggml-cpu is compiled for the board's -march; libllama and ggml-base are the same
  # for both boards, so the Pi 5 build reuses the Pi 4's.
  if [ "$name" = pi4 ]; then
    cmake --build "$b" -j"$jobs" --target llama >"$out/$name-build.log"
    common="$b"
  else
    cmake --build "$b" -j"$jobs" --target ggml-cpu >"$out/$name-build.log"
  fi
  libs=("$common/src/libllama.a" "$common/ggml/src/libggml.a" "$b/ggml/src/libggml-cpu.a" "$common/ggml/src/libggml-base.a")
  aarch64-linux-gnu-g++ -O2 -std=c++17 -march="$arch" -I"$src/include" -I"$src/ggml/include" \
    "$root/compat/aarch64/check.cpp" "${libs[@]}" -fopenmp -lpthread -static -o "$out/check-$name"
  say "$name ($arch) cross-build: $(( $(date +%s) - t0 )) s; $(file -b "$out/check-$name" | cut -d, -f1-2)"

  t0=$(date +%s)
  qemu-aarch64 -cpu "$cpu" "$out/check-$name" gen "$model" "$threads" "$n_gen" "$out/prompt.txt" \
    >"$out/$name.tokens" 2>"$out/$name-gen.log"
  same=$(python3 -c 'import sys
a, b = (open(p).read().split("\n")[1].split() for p in sys.argv[1:])
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print(f"identical to x86 for {n - int(open(sys.argv[1]).readline().split()[1])} of the generated tokens" if n < len(a) else "identical to x86")' \
    "$out/x86.tokens" "$out/$name.tokens")
  say "$name greedy under qemu-aarch64 -cpu $cpu: $(( $(date +%s) - t0 )) s; $(grep -m1 '^prompt' "$out/$name-gen.log"); $same"
  grep '^text:' "$out/$name-gen.log" | tee -a "$out/summary.txt"

  t0=$(date +%s)
  if qemu-aarch64 -cpu "$cpu" "$out/check-$name" force "$model" "$threads" "$out/x86.tokens" \
      >"$out/$name-force.txt" 2>"$out/$name-force.log"; then verdict=PASS; else verdict=FAIL; fail=1; fi
  say "$name teacher-forced on x86's tokens: $(( $(date +%s) - t0 )) s; $(tail -1 "$out/$name-force.txt"): $verdict"
done
say "total $(( $(date +%s) - t_start )) s"
exit $fail
