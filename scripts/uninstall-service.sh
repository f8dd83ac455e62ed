#!/usr/bin/env bash
# Remove the appliance service installed by scripts/install-service.sh (docs/SERVICE.md).
#
#   sudo scripts/uninstall-service.sh [--purge] [--prefix DIR]
#
# Stops, disables and removes the unit and the installed code (PREFIX, default
# /opt/appliance, only if install-service.sh made it). Keeps the models and state in
# /var/lib/appliance, the configuration in /etc/appliance and the user `appliance` unless
# --purge. Safe to run twice.
set -euo pipefail

me=$(basename "$0")
prefix=/opt/appliance
user=appliance
state=/var/lib/appliance
etc=/etc/appliance
unit_dst=/etc/systemd/system/appliance.service
marker=.appliance-install
purge=0
args=("$@")

say() { echo "$me: $*" >&2; }

usage() {
  cat <<EOF
Usage: sudo scripts/$me [--purge] [--prefix DIR]

Stop, disable and remove the systemd service 'appliance' and the code installed in PREFIX.

  --purge         also delete $state (models), $etc (configuration), drop-ins in
                  $unit_dst.d and the user '$user'
  --prefix DIR    where install-service.sh put the code (default /opt/appliance)
  -h, --help      this help
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --purge) purge=1 ;;
    --prefix) [ $# -ge 2 ] || { usage >&2; exit 2; }; prefix=$2; shift ;;
    --prefix=*) prefix=${1#--prefix=} ;;
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

if [ "$(id -u)" != 0 ]; then
  say "must run as root; run:  sudo $(printf '%q ' "$(cd "$(dirname "$0")" && pwd)/$me" ${args[@]+"${args[@]}"})"
  exit 1
fi

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  # disable --now: stop (the app drains running answers first) and remove the boot links.
  if systemctl cat appliance.service >/dev/null 2>&1; then
    systemctl disable --now --quiet appliance.service || true
    say "stopped and disabled appliance.service"
  fi
  booted=1
else
  say "systemd is not running as PID 1 here: removing the unit files without systemctl"
  booted=0
fi
# The link `systemctl enable` made; also present if it was enabled offline.
rm -f /etc/systemd/system/multi-user.target.wants/appliance.service
if [ -e "$unit_dst" ]; then
  rm -f "$unit_dst"
  say "removed $unit_dst"
fi
if [ $purge = 1 ] && [ -d "$unit_dst.d" ]; then
  rm -rf "$unit_dst.d"
  say "removed $unit_dst.d"
fi
if [ $booted = 1 ]; then
  systemctl daemon-reload
  systemctl reset-failed appliance.service >/dev/null 2>&1 || true
fi

if [ -e "$prefix/$marker" ]; then
  rm -rf "$prefix"
  say "removed $prefix"
elif [ -d "$prefix" ]; then
  say "left $prefix alone: install-service.sh did not create it (a checkout run in place?)"
fi

if [ $purge = 1 ]; then
  for d in "$state" "$etc"; do
    if [ -e "$d" ]; then
      rm -rf "$d"
      say "removed $d"
    fi
  done
  if getent passwd "$user" >/dev/null; then
    userdel "$user"
    say "removed user $user"
  fi
  if getent group "$user" >/dev/null; then
    groupdel "$user"
  fi
else
  kept=()
  for d in "$state" "$etc"; do
    [ -e "$d" ] && kept+=("$d")
  done
  getent passwd "$user" >/dev/null && kept+=("user $user")
  if [ ${#kept[@]} -gt 0 ]; then
    say "kept ${kept[*]} (remove with --purge)"
  fi
fi
