#!/usr/bin/env bash
# shellcheck disable=SC2154  # bindir, sysconfdir, ... come from install-layout.env
# Installs kvtierd on this host from a built tree: the `kvtier` system user and group, the files
# (`cmake --install`), the config's ownership, the socket directory, and the systemd unit
# (enabled; started or restarted with --now). Idempotent: run it again to upgrade.
#
# usage: sudo deploy/install.sh [--build DIR] [--now]
#   --build DIR  the configured and built tree (default: build)
#   --now        also (re)start kvtierd
# Then add each worker's user to the group:  usermod -aG kvtier <user>
set -euo pipefail

build=build
start_now=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --now) start_now=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { echo "install.sh: $*"; }
[ "$(id -u)" -eq 0 ] || { say "run as root (sudo $0 $*)" >&2; exit 1; }
layout="$build/deploy/install-layout.env"
[ -f "$layout" ] || { say "$layout missing: configure and build first (cmake -S . -B $build)" >&2; exit 1; }
# shellcheck source=/dev/null
. "$layout"  # bindir, sysconfdir, unitdir, ... as configured
for program in $programs; do
  [ -x "$build/bin/$program" ] || { say "$build/bin/$program not built: ninja -C $build" >&2; exit 1; }
done

# A *system* group and user: logind's RemoveIPC (default on) deletes a regular user's shared
# memory when its last session ends, which would take the pools with it. No home, no shell.
getent group kvtier >/dev/null || { groupadd --system kvtier; say "added group kvtier"; }
if ! getent passwd kvtier >/dev/null; then
  useradd --system --gid kvtier --no-create-home --home-dir /nonexistent \
          --shell /usr/sbin/nologin --comment "kvtier daemon" kvtier
  say "added system user kvtier"
fi

cmake --install "$build"

# The config is the operator's: readable by the daemon's group, writable by root only.
chown root:kvtier "$sysconfdir/kvtier" "$sysconfdir/kvtier/kvtierd.toml"
chmod 0750 "$sysconfdir/kvtier"
chmod 0640 "$sysconfdir/kvtier/kvtierd.toml"
"$bindir/kvtierd" --check-config --config "$sysconfdir/kvtier/kvtierd.toml"

if [ -d /run/systemd/system ]; then
  # systemd creates /run/kvtier (RuntimeDirectory=) on every start.
  systemctl daemon-reload
  systemctl enable kvtierd.service
  if [ "$start_now" = 1 ]; then
    systemctl restart kvtierd.service
    systemctl --no-pager --lines=5 status kvtierd.service || true
  else
    say "enabled; start with: systemctl start kvtierd"
  fi
else
  # No systemd (a container): the directory the unit would create, for a manual start.
  install -d -o kvtier -g kvtier -m 0750 /run/kvtier
  say "systemd is not running here; start by hand as kvtier:"
  say "  runuser -u kvtier -- $bindir/kvtierd --config $sysconfdir/kvtier/kvtierd.toml"
fi
say "done. Workers join the group: usermod -aG kvtier <user>; check: kvtierctl status"
