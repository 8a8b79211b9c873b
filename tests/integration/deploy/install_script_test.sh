#!/usr/bin/env bash
# shellcheck disable=SC2154  # bindir, sysconfdir, prefix come from install-layout.env
# deploy/install.sh for real, as root, inside a private mount namespace whose install prefix and
# config dir are overlays over temporary dirs (and /run a fresh tmpfs): the host's users, files
# and services are untouched. Checks the system user and group, the config's ownership, that a
# second run changes nothing, and then the permission model end to end: kvtierd runs as kvtier,
# a user in group kvtier can use the socket, a user outside it cannot, the pools are 0660 group
# kvtier. Exit 77 (skipped) without root or mount namespaces.
# usage: install_script_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail
repo=$1
build=$2

if [ "${KVTIER_IN_NAMESPACE:-}" != 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: needs root (runs deploy/install.sh in a private mount namespace)"
    exit 77
  fi
  if ! unshare --mount --propagation private true 2>/dev/null; then
    echo "SKIP: cannot create a mount namespace here"
    exit 77
  fi
  tmp=$(mktemp -d)
  rc=0
  KVTIER_IN_NAMESPACE=1 KVTIER_TEST_TMP=$tmp unshare --mount --propagation private "$0" "$@" ||
    rc=$?
  rm -rf "$tmp"
  exit "$rc"
fi

# ---- inside the namespace ----
tmp=$KVTIER_TEST_TMP
# shellcheck source=/dev/null
. "$build/deploy/install-layout.env"
status=0
fail() { echo "FAIL: $*"; status=1; }

overlay() {  # overlay DIR: writes under DIR land in $tmp
  local dir=$1 name
  name=$(echo "$dir" | tr / _)
  mkdir -p "$tmp/$name/upper" "$tmp/$name/work" "$dir"
  if ! mount -t overlay overlay \
       -o "lowerdir=$dir,upperdir=$tmp/$name/upper,workdir=$tmp/$name/work" "$dir"; then
    echo "SKIP: overlayfs unavailable for $dir"
    exit 77
  fi
}
overlay /etc
overlay "$prefix"
case "$sysconfdir" in /etc|/etc/*|"$prefix"/*) ;; *) overlay "$sysconfdir" ;; esac
mount -t tmpfs tmpfs /run  # no /run/systemd/system: install.sh takes the manual-start path

shm_prefix="kvtier-installtest-$$"
daemon_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
  rm -f /dev/shm/"$shm_prefix"*
}
trap cleanup EXIT

# ---- first run ----
if ! out=$("$repo/deploy/install.sh" --build "$build" 2>&1); then
  echo "$out"
  echo "FAIL: install.sh exited non-zero"
  exit 1
fi
echo "$out" | grep -q "added system user kvtier" || fail "no user added: $out"
uid=$(getent passwd kvtier | cut -d: -f3)
if [ -z "$uid" ] || [ "$uid" -ge 1000 ]; then fail "kvtier is not a system user (uid '$uid')"; fi
getent passwd kvtier | grep -q ':/usr/sbin/nologin$' || fail "kvtier has a login shell"
getent group kvtier >/dev/null || fail "no group kvtier"
cfg="$sysconfdir/kvtier/kvtierd.toml"
[ "$(stat -c '%U:%G %a' "$sysconfdir/kvtier")" = "root:kvtier 750" ] ||
  fail "$sysconfdir/kvtier is $(stat -c '%U:%G %a' "$sysconfdir/kvtier")"
[ "$(stat -c '%U:%G %a' "$cfg")" = "root:kvtier 640" ] || fail "$cfg is $(stat -c '%U:%G %a' "$cfg")"
[ "$(stat -c '%U:%G %a' /run/kvtier)" = "kvtier:kvtier 750" ] ||
  fail "/run/kvtier is $(stat -c '%U:%G %a' /run/kvtier)"
[ -f "$unitdir/kvtierd.service" ] || fail "no unit in $unitdir"

# ---- an operator's edit, then a second run: idempotent, the edit survives ----
sed -i -e 's/^ddr_mib = .*/ddr_mib = 64/' -e 's/^compressed_mib = .*/compressed_mib = 32/' \
       -e "s|^shm_prefix = .*|shm_prefix = \"/$shm_prefix\"|" -e 's/^metrics = .*/metrics = ""/' \
       "$cfg"
out2=$("$repo/deploy/install.sh" --build "$build" 2>&1) || fail "second run failed: $out2"
if echo "$out2" | grep -q "added"; then fail "second run added users again: $out2"; fi
grep -q "^shm_prefix = \"/$shm_prefix\"" "$cfg" || fail "the second run overwrote $cfg"

# ---- the permission model, end to end ----
useradd --system --no-create-home --shell /usr/sbin/nologin kvworker
usermod -aG kvtier kvworker
useradd --system --no-create-home --shell /usr/sbin/nologin kvstranger
# setpriv execs (runuser would stay the parent and turn SIGTERM into a "session terminated").
setpriv --reuid=kvtier --regid=kvtier --init-groups -- "$bindir/kvtierd" --config "$cfg" \
  >"$tmp/kvtierd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S /run/kvtier/kvtierd.sock ] && break
  sleep 0.1
done
[ -S /run/kvtier/kvtierd.sock ] || { cat "$tmp/kvtierd.log"; fail "kvtierd did not listen"; }
ctl=("$bindir/kvtierctl" --socket /run/kvtier/kvtierd.sock status)
runuser -u kvworker -- "${ctl[@]}" >"$tmp/ctl.out" 2>&1 ||
  fail "a member of group kvtier cannot use the daemon: $(cat "$tmp/ctl.out")"
if runuser -u kvstranger -- "${ctl[@]}" >/dev/null 2>&1; then
  fail "a user outside group kvtier can use the daemon"
fi
# Pool memory is unnamed (memfd extents passed to each worker): nothing under /dev/shm.
if compgen -G "/dev/shm/${shm_prefix#/}*" >/dev/null; then fail "named pools in /dev/shm"; fi
for sock in /run/kvtier/kvtierd.sock /run/kvtier/kvtierd.sock.mem; do
  [ "$(stat -c '%G %a' "$sock")" = "kvtier 660" ] || fail "$sock is $(stat -c '%G %a' "$sock")"
done
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "kvtierd did not stop cleanly: $(tail -5 "$tmp/kvtierd.log")"
daemon_pid=""
[ -e /run/kvtier/kvtierd.sock.mem ] && fail "the memory channel socket is left after SIGTERM"

[ "$status" = 0 ] && echo "OK: install.sh (twice), system user and group, config ownership, socket permissions, no named memory"
exit "$status"
