#!/usr/bin/env bash
# Install or upgrade the appliance as a hardened systemd service (docs/SERVICE.md).
# Idempotent: re-run it from a newer checkout to upgrade in place; the configuration in
# /etc/appliance and the state in /var/lib/appliance are kept, and a run with nothing new
# changes no file.
#
#   sudo scripts/install-service.sh [--no-start] [--prefix DIR] [--root DIR]
#
# What it does, in order:
#   1. creates the system user `appliance` (no login shell, home /var/lib/appliance);
#   2. copies this checkout to PREFIX (default /opt/appliance) and builds PREFIX/.venv with
#      the system Python via scripts/setup.sh (the service cannot see /home or /root);
#   3. writes /etc/appliance/appliance.toml with commented defaults, only if it is absent;
#   4. as the service user, checks the configuration and assembles the bundled model into
#      /var/lib/appliance/models if no model is there yet;
#   5. installs systemd/appliance.service to /etc/systemd/system, then daemon-reload,
#      enable and (re)start, unless --no-start or systemd is not PID 1;
#   6. installs the daily backup (systemd/appliance-backup.service and .timer) and enables
#      its timer with the service, unless --no-backup (docs/OPERATING.md).
# With --root DIR all of this goes into the tree DIR instead of /: the user through
# `useradd --prefix DIR`, enabling through `systemctl --root=DIR`, nothing started.
set -euo pipefail
umask 022  # everything installed must be readable by the service user

repo=$(cd "$(dirname "$0")/.." && pwd)
me=$(basename "$0")
prefix=/opt/appliance  # also the path written in systemd/appliance.service
user=appliance
state=/var/lib/appliance
etc=/etc/appliance
unit_dst=/etc/systemd/system/appliance.service
marker=.appliance-install  # marks a PREFIX this script owns (and may empty on upgrade)
root=  # --root: the tree to install into ("" = /)
start=1
backup=1  # a box that keeps an office's chats backs them up unless told not to
action=install
args=("$@")

say() { echo "$me: $*" >&2; }
die() { say "$*"; exit 1; }

usage() {
  cat <<EOF
Usage: sudo scripts/$me [--no-start] [--no-backup] [--prefix DIR] [--root DIR]

Install or upgrade the appliance as the systemd service 'appliance' (idempotent).

  --no-start      install everything and daemon-reload, but do not enable or (re)start
  --no-backup     install the daily backup's timer (appliance-backup.timer) but do not
                  enable it (by default it is enabled with the service: a backup a day,
                  the newest backup_keep kept in backup_dir)
  --prefix DIR    where the code and its .venv go (default /opt/appliance); not under
                  /home, /root or /tmp, which the service cannot see. Give the checkout's
                  own directory to run it in place.
  --root DIR      install into the directory tree DIR as if it were / (a staged system
                  tree, or a test): files go to DIR/opt/appliance, DIR/etc, DIR/var/lib;
                  the user is added with 'useradd --prefix DIR' (DIR/etc/passwd must
                  exist), the unit enabled with 'systemctl --root=DIR'; nothing is started
                  and this system's users and systemd are not touched. The venv is built
                  in DIR/PREFIX and works from there only: for a bootable image run the
                  installer inside it (chroot or systemd-nspawn) instead.
  --print-config  print the default /etc/appliance/appliance.toml and exit
  --print-unit    print the unit file as it would be installed (with --prefix) and exit
  -h, --help      this help

Environment: PYTHON (default /usr/bin/python3) builds the venv; LLAMA_WHEELHOUSE as for
scripts/setup.sh (default root's ~/.cache/appliance/wheels, or the sudo user's if only that
one has the llama-cpp-python wheel).
Files: PREFIX; $etc/appliance.toml (kept if present); $state (models; kept);
$unit_dst. Undo with scripts/uninstall-service.sh [--purge].
EOF
}

# The default configuration file. Lines "#key = value" are the built-in defaults
# (tests/ops/test_service_files.py checks that they are valid and true); uncomment to change.
default_config() {
  cat <<'EOF'
# /etc/appliance/appliance.toml: read by `appliance serve` at start-up.
# Precedence: built-in defaults < this file < APPLIANCE_* environment variables < flags.
# `sudo systemctl restart appliance` applies changes; check them first with
#   cd /var/lib/appliance && sudo -u appliance /opt/appliance/.venv/bin/appliance config
# All keys: `appliance serve --help`. The lines below show the defaults.

# Where to listen. The service needs no privileges, so keep the port above 1023.
#host = "0.0.0.0"
#port = 8080

# Conversations decoded together, and tokens one conversation may hold.
#slots = 24
#ctx_per_slot = 4096
# KV cache cells shared by all conversations, 12 KiB each (16384 = 192 MiB of RAM).
# Raspberry Pi with 1-2 GiB of RAM: set slots to 4 and kv_tokens to 8192.
#kv_tokens = 16384

# llama.cpp threads (0 = one per core used) and the cores to pin them to ("" = all,
# or e.g. "0-3", "0,2").
#threads = 0
#cpus = ""

# Requests waiting for a slot before 429, and how long one may wait before 503.
#max_queue = 64
#queue_timeout_s = 120.0
# Cap and default for a request's max_tokens.
#max_tokens_limit = 2048
#default_max_tokens = 512
# On stop (SIGTERM), how long running answers may finish. Keep it below the unit's
# TimeoutStopSec (45 s).
#grace_s = 30.0

# A GGUF file to serve ("" = the official or bundled model in /var/lib/appliance/models),
# and the model id shown in the API ("" = the file name without .gguf).
#model = ""
#model_name = ""
#log_level = "info"
EOF
}

unit_text() {  # $1: a unit in systemd/ (default the service's)
  sed "s|/opt/appliance|$prefix|g" "$repo/systemd/${1:-appliance.service}"
}

while [ $# -gt 0 ]; do
  case $1 in
    --no-start) start=0 ;;
    --no-backup) backup=0 ;;
    --prefix) [ $# -ge 2 ] || { usage >&2; exit 2; }; prefix=$2; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --root) [ $# -ge 2 ] || { usage >&2; exit 2; }; root=$2; shift ;;
    --root=*) root=${1#--root=} ;;
    --print-config) action=print-config ;;
    --print-unit) action=print-unit ;;
    -h|--help) usage; exit 0 ;;
    *) say "unknown argument: $1"; usage >&2; exit 2 ;;
  esac
  shift
done

if [ "$action" = print-config ]; then
  default_config
  exit 0
fi

# PREFIX ends up in ExecStart= and in a sed replacement: keep it to plain path characters
# (systemd would expand % and split on spaces).
prefix=${prefix%/}
case $prefix in
  /*) ;;
  *) say "--prefix must be an absolute path, got '$prefix'"; exit 2 ;;
esac
if [[ ! $prefix =~ ^(/[A-Za-z0-9._+-]+)+$ ]] || [[ $prefix =~ /\.\.?(/|$) ]]; then
  say "--prefix '$prefix': use a plain absolute path (letters, digits, . _ + - and /)"
  exit 2
fi
case $prefix/ in
  /home/*|/root/*|/run/user/*)
    say "--prefix $prefix: the service runs with ProtectHome=true and cannot see /home, /root or /run/user"
    exit 2 ;;
  /tmp/*|/var/tmp/*)
    say "--prefix $prefix: the service has a private /tmp and cannot see $prefix"
    exit 2 ;;
  $state/*|$etc/*)
    say "--prefix $prefix: choose a directory outside $state and $etc"
    exit 2 ;;
esac

if [ "$action" = print-unit ]; then
  unit_text
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  say "must run as root; run:  sudo $(printf '%q ' "$repo/scripts/$me" ${args[@]+"${args[@]}"})"
  exit 1
fi

# Where things go on disk: under --root DIR, DIR + the path the service sees.
root=${root%/}
if [ -n "$root" ]; then
  case $root in
    /*) ;;
    *) die "--root must be an absolute path, got '$root'" ;;
  esac
  [ -d "$root" ] || die "--root $root: no such directory"
  root=$(readlink -f "$root")
  [ "$root" = / ] && root=
fi
if [ -n "$root" ]; then
  case $root/ in
    "$(readlink -f "$repo")"/*) die "--root $root is inside the checkout $repo" ;;
  esac
  [ -f "$root/etc/passwd" ] && [ -f "$root/etc/group" ] \
    || die "--root $root has no etc/passwd and etc/group: give the root of a system tree"
fi
dprefix=$root$prefix
detc=$root$etc
dstate=$root$state
dunit=$root$unit_dst

# The user's entries in the system's (or the tree's) databases.
entry() {  # entry passwd|group NAME
  if [ -n "$root" ]; then
    awk -F: -v n="$2" '$1 == n {print; found = 1} END {exit !found}' "$root/etc/$1"
  else
    getent "$1" "$2"
  fi
}

# ---- 1. the service user ----
if entry passwd "$user" >/dev/null; then
  say "user $user exists${root:+ in $root}"
else
  group_opt=(--user-group)
  entry group "$user" >/dev/null && group_opt=(--gid "$user")
  useradd ${root:+--prefix "$root"} --system "${group_opt[@]}" --home-dir "$state" \
    --no-create-home --shell /usr/sbin/nologin --comment "LLM chat appliance" "$user"
  say "created system user $user${root:+ in $root}"
fi
# Numeric ids: under --root the user exists only in DIR/etc/passwd, not for chown or setpriv.
uid=$(entry passwd "$user" | cut -d: -f3)
gid=$(entry passwd "$user" | cut -d: -f4)
[ -n "$uid" ] && [ -n "$gid" ] || die "cannot find the ids of user $user${root:+ in $root/etc/passwd}"

# ---- 2. code and venv in PREFIX ----
python=${PYTHON:-/usr/bin/python3}
command -v "$python" >/dev/null \
  || die "no $python: apt-get install -y python3 python3-venv, or set PYTHON"
python_real=$(readlink -f "$(command -v "$python")")
case $python_real in
  /home/*|/root/*|/tmp/*|/var/tmp/*)
    die "$python is $python_real, which the service cannot see (ProtectHome/PrivateTmp);" \
        "use a system Python, e.g. PYTHON=/usr/bin/python3" ;;
esac

in_place=0
if [ "$(readlink -f "$dprefix" 2>/dev/null || true)" = "$(readlink -f "$repo")" ]; then
  in_place=1
  say "running in place from $repo"
else
  case $(readlink -m "$dprefix")/ in
    "$(readlink -f "$repo")"/*) die "--prefix $prefix is inside the checkout $repo" ;;
  esac
  if [ -d "$dprefix" ] && [ -n "$(ls -A "$dprefix")" ] && [ ! -e "$dprefix/$marker" ]; then
    die "$dprefix exists, is not empty and was not made by this script; choose another --prefix or empty it"
  fi
  say "copying $repo to $dprefix"
  mkdir -p "$dprefix"
  # Replace the code, keep the venv (setup.sh only reinstalls when pyproject.toml changed).
  # tar keeps the checkout's modification times, so unchanged files come out identical.
  find "$dprefix" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
  tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./models --exclude=./state \
    --exclude=__pycache__ --exclude='*.egg-info' --exclude=./.pytest_cache \
    --exclude=./.mypy_cache --exclude=./.ruff_cache -cf - . \
    | tar -C "$dprefix" --no-same-owner -xf -
  # No date in it: an upgrade with nothing new must change no file.
  echo "installed by scripts/$me from $repo; replaced (all but .venv) on every install" \
    > "$dprefix/$marker"
  mkdir -p "$dprefix/models"  # the checkout's models/ directory; the service uses $state/models
fi

# A venv whose base interpreter the service cannot reach would fail at start-up.
venv_home=$(sed -n 's/^home *= *//p' "$dprefix/.venv/pyvenv.cfg" 2>/dev/null || true)
case $venv_home in
  /home/*|/root/*|/tmp/*|/var/tmp/*)
    if [ $in_place = 1 ]; then
      die "$dprefix/.venv is based on $venv_home, which the service cannot see;" \
          "remove $dprefix/.venv and re-run (it is rebuilt with $python), or install to /opt/appliance"
    fi
    say "rebuilding $dprefix/.venv (it was based on $venv_home)"
    rm -rf "$dprefix/.venv" ;;
esac

# setup.sh keeps the llama-cpp-python wheel in root's ~/.cache, in a directory keyed for this
# CPU and the build flags; reuse the sudo user's if only that one has a wheel with this key
# (saves a ~6 minute compile, much longer on a Raspberry Pi).
has_keyed_wheel() {  # has_keyed_wheel WHEELHOUSE
  local dir
  dir=$(LLAMA_WHEELHOUSE=$1 "$dprefix/scripts/setup.sh" --print-build 2>/dev/null \
    | sed -n 's/^wheel_dir=//p') || return 1
  [ -n "$dir" ] && compgen -G "$dir/llama_cpp_python-*.whl" >/dev/null
}
if [ -z "${LLAMA_WHEELHOUSE:-}" ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  sudo_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
  if ! has_keyed_wheel "$HOME/.cache/appliance/wheels" \
     && has_keyed_wheel "$sudo_home/.cache/appliance/wheels"; then
    export LLAMA_WHEELHOUSE=$sudo_home/.cache/appliance/wheels
    say "using the llama-cpp-python wheel in $LLAMA_WHEELHOUSE"
  fi
fi
PYTHON=$python "$dprefix/scripts/setup.sh" bundled-model
if [ $in_place = 0 ]; then
  # /opt is read-only to the service: compile the package now so it need not.
  "$dprefix/.venv/bin/python" -m compileall -q "$dprefix/appliance" >/dev/null
  chmod -R go+rX,go-w "$dprefix"
else
  chmod -R go+rX "$dprefix"  # the service user must read the checkout and its venv
fi

# ---- 3. configuration ----
install -d -m 0755 "$detc"
if [ -e "$detc/appliance.toml" ]; then
  say "keeping $detc/appliance.toml"
else
  default_config > "$detc/appliance.toml.new"
  chmod 0644 "$detc/appliance.toml.new"
  mv "$detc/appliance.toml.new" "$detc/appliance.toml"
  say "wrote $detc/appliance.toml (all defaults; edit it, then restart the service)"
fi

# ---- 4. state directory, configuration check, model ----
# systemd (StateDirectory=) creates and chowns $state too; doing it now lets the service
# user assemble the model before the first start. Existing contents are kept.
install -d -o "$uid" -g "$gid" -m 0750 "$dstate"
install -d -o "$uid" -g "$gid" -m 0750 "$dstate/models"
if ls "$dstate"/models/*.gguf >/dev/null 2>&1; then
  say "checking the configuration and the model as user $user"
else
  say "checking the configuration as user $user and assembling the bundled model (~470 MiB) into $dstate/models"
fi
check_py='
import os, sys
from pathlib import Path
os.umask(0o077)  # as UMask= in the unit
from appliance import config
from appliance.model import files as model_files
try:
    cfg, _ = config.load(config_file=sys.argv[1])
except config.ConfigError as e:
    sys.exit(f"appliance: {e}")
try:
    path = model_files.resolve(cfg.model, Path(cfg.models_dir))
except model_files.ModelFileError as e:
    sys.exit(f"appliance: {e}")
print(f"model {path}; listening on {cfg.host}:{cfg.port}")
'
# As the service user (by number: under --root only DIR knows the name), in a clean
# environment like systemd gives the service (none of root's APPLIANCE_* variables).
if ! summary=$(cd "$dstate" && setpriv --reuid="$uid" --regid="$gid" --clear-groups -- \
      env -i PATH=/usr/bin:/bin HOME="$dstate" APPLIANCE_MODELS_DIR="$dstate/models" \
      "$dprefix/.venv/bin/python" -I -c "$check_py" "$detc/appliance.toml"); then
  die "the service would not start (see above); fix $detc/appliance.toml or the model, then re-run"
fi
say "$summary"

# ---- 5. the unit ----
if [ -f "$dunit" ] && [ "$(unit_text)" = "$(cat "$dunit")" ]; then
  say "$dunit is up to date"
else
  install -d -m 0755 "$(dirname "$dunit")"
  unit_text > "$dunit.new"
  chmod 0644 "$dunit.new"
  mv "$dunit.new" "$dunit"
  say "installed $dunit"
fi
for u in appliance-backup.service appliance-backup.timer; do
  d=$root/etc/systemd/system/$u
  if [ ! -f "$d" ] || [ "$(unit_text $u)" != "$(cat "$d")" ]; then
    unit_text $u > "$d.new"
    chmod 0644 "$d.new"
    mv "$d.new" "$d"
    say "installed $d"
  fi
done

if [ -n "$root" ]; then
  if [ $start = 1 ]; then
    systemctl --root="$root" enable --quiet appliance.service
    [ $backup = 0 ] || systemctl --root="$root" enable --quiet appliance-backup.timer
    say "enabled in $root: it starts when that tree boots (nothing started here)"
  else
    say "not enabled (--no-start); enable with:  systemctl --root=$root enable appliance"
  fi
  exit 0
fi
if [ ! -d /run/systemd/system ] || ! command -v systemctl >/dev/null; then
  say "systemd is not running as PID 1 here (a container or chroot?): skipping systemctl."
  say "On a system booted with systemd run:  systemctl daemon-reload && systemctl enable --now appliance"
  exit 0
fi
systemctl daemon-reload
if [ $start = 0 ]; then
  say "not started (--no-start). Start and enable at boot with:  systemctl enable --now appliance"
  systemctl is-active --quiet appliance \
    && say "note: the running service still uses the old code until:  systemctl restart appliance"
  exit 0
fi
systemctl enable --quiet appliance
[ $backup = 0 ] || systemctl enable --now --quiet appliance-backup.timer
systemctl restart appliance  # starts it, or restarts it onto the new code on an upgrade
say "started; logs: journalctl -u appliance -f   status: systemctl status appliance"
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' <<<"$summary")
addr=$(hostname -I 2>/dev/null | awk '{print $1}')
say "chat page: http://${addr:-localhost}:${port:-8080}/ (ready once /health answers 200)"
