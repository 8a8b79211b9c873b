#!/usr/bin/env bash
# shellcheck disable=SC2154  # bindir, sysconfdir, ... come from install-layout.env
# `cmake --install` into a staging dir (DESTDIR): every file lands where GNUInstallDirs says, the
# unit's ExecStart names the installed kvtierd, an operator's config survives a re-install, and a
# program builds and links against the installed client library through pkg-config.
# usage: install_test.sh BUILD_DIR   (reads BUILD_DIR/deploy/install-layout.env, written by
#        cmake/KvtierInstall.cmake: the configured absolute install dirs and programs)
set -euo pipefail
build=$1
# shellcheck source=/dev/null
. "$build/deploy/install-layout.env"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

DESTDIR=$stage cmake --install "$build" >"$stage.log" 2>&1 || { cat "$stage.log"; exit 1; }
rm -f "$stage.log"
for program in $programs; do
  [ -x "$stage$bindir/$program" ] || fail "$bindir/$program not installed"
done
for f in "$libdir/libkvtier_client.a" "$libdir/pkgconfig/kvtier-client.pc" \
         "$includedir/kvtier/client.h" "$includedir/kvtier/v1/kvtier.pb.h" \
         "$sysconfdir/kvtier/kvtierd.toml" "$datadir/kvtier/kvtierd.toml" \
         "$datadir/kvtier/prometheus.yml" "$datadir/kvtier/kvtier.json" \
         "$datadir/kvtier/k8s/daemonset.yaml" "$unitdir/kvtierd.service"; do
  [ -f "$stage$f" ] || fail "$f not installed"
done
unit="$stage$unitdir/kvtierd.service"
grep -q "^ExecStart=$bindir/kvtierd --config $sysconfdir/kvtier/kvtierd.toml\$" "$unit" ||
  fail "unit ExecStart: $(grep ^ExecStart= "$unit")"

# An operator's edit of the config survives a re-install (an upgrade).
echo "# edited by the operator" >>"$stage$sysconfdir/kvtier/kvtierd.toml"
DESTDIR=$stage cmake --install "$build" >/dev/null
grep -q "edited by the operator" "$stage$sysconfdir/kvtier/kvtierd.toml" ||
  fail "re-install overwrote $sysconfdir/kvtier/kvtierd.toml"

# A worker program against the installed headers and libraries only.
cat >"$stage/worker.cc" <<'CC'
#include <kvtier/client.h>
#include <cstdio>
int main() {
  kvtier::ClientOptions options;
  options.address = "unix:/nonexistent/kvtierd.sock";
  options.background_heartbeat = false;
  auto client = kvtier::WorkerClient::Connect(options);
  std::printf("%s\n", client.ok() ? "connected?" : "refused as expected");
  return client.ok() ? 1 : 0;
}
CC
export PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage$libdir/pkgconfig
if flags=$(pkg-config --cflags --libs kvtier-client); then
  # shellcheck disable=SC2086
  c++ -std=c++20 -o "$stage/worker" "$stage/worker.cc" $flags 2>&1 | tail -20 ||
    true
  if [ -x "$stage/worker" ]; then
    "$stage/worker" || fail "the installed client connected to a nonexistent socket"
  else
    fail "a program does not build against the installed client library"
  fi
else
  fail "pkg-config kvtier-client"
fi
[ "$status" = 0 ] && echo "OK: install layout, unit, config preservation, client library"
exit "$status"
