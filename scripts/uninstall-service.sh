#!/usr/bin/env bash
# Remove the appliance service installed by scripts/install-service.sh (docs/SERVICE.md).
#
#   sudo scripts/uninstall-service.sh [--purge] [--prefix DIR] [--root DIR]
#
# Stops, disables and removes the unit and the installed code (PREFIX, default
# /opt/appliance, only if install-service.sh made it). Keeps the models and state in
# /var/lib/appliance, the configuration in /etc/appliance and the user `appliance` unless
# --purge. Safe to run twice. --root DIR undoes an install-service.sh --root DIR.
set -euo pipefail

me=$(basename "$0")
prefix=/opt/appliance
user=appliance
state=/var/lib/appliance
etc=/etc/appliance
unit_dst=/etc/systemd/system/appliance.service
marker=.appliance-install
root=
purge=0
args=("$@")

say() { echo "$me: $*" >&2; }

usage() {
  cat <<EOF
Usage: sudo scripts/$me [--purge] [--prefix DIR] [--root DIR]

Stop, disable and remove the systemd service 'appliance' and the code installed in PREFIX.

  --purge         also delete $state (models), $etc (configuration), drop-ins in
                  $unit_dst.d and the user '$user'
  --prefix DIR    where install-service.sh put the code (default /opt/appliance)
  --root DIR      remove from the directory tree DIR (as installed with --root DIR);
                  this system's users and systemd are not touched
  -h, --help      this help
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --purge) purge=1 ;;
    --prefix) [ $# -ge 2 ] || { usage >&2; exit 2; }; prefix=$2; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
    --root) [ $# -ge 2 ] || { usage >&2; exit 2; }; root=$2; shift ;;
    --root=*) root=${1#--root=} ;;
    -h|--help) usage; exit 0 ;;
    *) say "unknown argument: $1"; usage >&2; exit 2 ;;
  esac
  shift
done
prefix=${prefix%/}
case $prefix in
  /?*) ;;
  *) say "--prefix must be an absolute path, got '$prefix'"; exit 2 ;;
esac
root=${root%/}
case $root in
  ''|/*) ;;
  *) say "--root must be an absolute path, got '$root'"; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  say "must run as root; run:  sudo $(printf '%q ' "$(cd "$(dirname "$0")" && pwd)/$me" ${args[@]+"${args[@]}"})"
  exit 1
fi

if [ -n "$root" ]; then
  [ -d "$root" ] || { say "--root $root: no such directory"; exit 1; }
  root=$(readlink -f "$root")
  [ "$root" = / ] && root=
fi

if [ -n "$root" ]; then
  if [ -e "$root$unit_dst" ] && command -v systemctl >/dev/null; then
    systemctl --root="$root" disable --quiet appliance.service || true
    systemctl --root="$root" disable --quiet appliance-backup.timer || true
  fi
  booted=0
elif [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  # disable --now: stop (the app drains running answers first) and remove the boot links.
  if systemctl cat appliance.service >/dev/null 2>&1; then
    systemctl disable --now --quiet appliance.service || true
    systemctl disable --now --quiet appliance-backup.timer 2>/dev/null || true
    say "stopped and disabled appliance.service"
  fi
  booted=1
else
  say "systemd is not running as PID 1 here: removing the unit files without systemctl"
  booted=0
fi
# The link `systemctl enable` made; also present if it was enabled offline.
rm -f "$root/etc/systemd/system/multi-user.target.wants/appliance.service"
# The daily backup's units (the backups themselves stay in the state, as the state does).
rm -f "$root/etc/systemd/system/timers.target.wants/appliance-backup.timer" \
  "$root/etc/systemd/system/appliance-backup.service" "$root/etc/systemd/system/appliance-backup.timer"
if [ -e "$root$unit_dst" ]; then
  rm -f "$root$unit_dst"
  say "removed $root$unit_dst"
fi
if [ $purge = 1 ] && [ -d "$root$unit_dst.d" ]; then
  rm -rf "$root$unit_dst.d"
  say "removed $root$unit_dst.d"
fi
if [ $booted = 1 ]; then
  systemctl daemon-reload
  systemctl reset-failed appliance.service >/dev/null 2>&1 || true
fi

if [ -e "$root$prefix/$marker" ]; then
  rm -rf "$root$prefix"
  say "removed $root$prefix"
elif [ -d "$root$prefix" ]; then
  say "left $root$prefix alone: install-service.sh did not create it (a checkout run in place?)"
fi

# The user's entries in the system's (or the tree's) databases.
entry() {  # entry passwd|group NAME
  if [ -n "$root" ]; then
    awk -F: -v n="$2" '$1 == n {found = 1} END {exit !found}' "$root/etc/$1" 2>/dev/null
  else
    getent "$1" "$2" >/dev/null
  fi
}

if [ $purge = 1 ]; then
  for d in "$root$state" "$root$etc"; do
    if [ -e "$d" ]; then
      rm -rf "$d"
      say "removed $d"
    fi
  done
  if entry passwd "$user"; then
    userdel ${root:+--prefix "$root"} "$user"
    say "removed user $user${root:+ from $root}"
  fi
  if entry group "$user"; then
    groupdel ${root:+--prefix "$root"} "$user"
  fi
else
  kept=()
  for d in "$root$state" "$root$etc"; do
    [ -e "$d" ] && kept+=("$d")
  done
  entry passwd "$user" && kept+=("user $user")
  if [ ${#kept[@]} -gt 0 ]; then
    say "kept ${kept[*]} (remove with --purge)"
  fi
fi
