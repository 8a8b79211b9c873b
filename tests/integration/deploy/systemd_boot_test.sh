#!/usr/bin/env bash
# deploy/kvtierd.service under a real systemd: systemd runs as PID 1 of private pid, mount, uts
# and cgroup namespaces, over an overlay /etc and /usr/local and a fresh /run, and starts the
# unit exactly as shipped (a drop-in only points ExecStart at the built binary, sends stdout to a
# file and drops the default dependencies on sysinit units that a namespace cannot run). Checks:
# the READY=1 handshake (Type=notify), RuntimeDirectory and socket ownership, a worker in group
# kvtier can use the daemon and a stranger cannot, no named pool memory in the shared /dev/shm,
# metrics on loopback through the IP firewall, the sandbox as the kernel sees it, `systemctl
# reload` (SIGHUP), Restart=on-failure after kill -9, the watchdog restarting a wedged daemon,
# and a clean stop.
#
# Runs only where it cannot disturb a host: as root, with no systemd already running as PID 1
# (a container or CI VM), and with namespaces and overlayfs available; otherwise exit 77.
# usage: systemd_boot_test.sh REPO_ROOT KVTIERD KVTIERCTL
set -euo pipefail
repo=$1
kvtierd=$2
kvtierctl=$3

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root"
[ ! -d /run/systemd/system ] || skip "systemd is this host's init; a nested one is not started here"
[ -x /lib/systemd/systemd ] || skip "no /lib/systemd/systemd (Debian package systemd)"
unshare --pid --fork --mount --uts --cgroup --propagation private true 2>/dev/null ||
  skip "cannot create pid/mount/cgroup namespaces"

tmp=$(mktemp -d)
chmod 0755 "$tmp"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
prefix="kvtier-sdtest-$$"
# cgroups the nested systemd creates at the root of each hierarchy; removed afterwards unless
# they existed before.
created_cgroups=()
for h in /sys/fs/cgroup/*/; do
  for d in init.scope system.slice; do [ -e "$h$d" ] || created_cgroups+=("$h$d"); done
done

# ---- the namespace's PID 1: prepare, then exec systemd ----
cat >"$tmp/init.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
for dir in /etc /usr/local; do
  name=\$(echo "\$dir" | tr / _)
  mkdir -p "$tmp/\$name/upper" "$tmp/\$name/work"
  mount -t overlay overlay -o "lowerdir=\$dir,upperdir=$tmp/\$name/upper,workdir=$tmp/\$name/work" "\$dir"
done
mount -t tmpfs tmpfs /run
groupadd --system kvtier
useradd --system --gid kvtier --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvtier
useradd --system --no-create-home --shell /usr/sbin/nologin kvworker
usermod -aG kvtier kvworker
install -d -m 0755 /usr/local/bin
install -m 0755 "$kvtierd" /usr/local/bin/kvtierd
install -d -o root -g kvtier -m 0750 /etc/kvtier
sed -e 's/^ddr_mib = .*/ddr_mib = 64/' -e 's/^compressed_mib = .*/compressed_mib = 32/' \\
    -e 's|^shm_prefix = .*|shm_prefix = "/$prefix"|' -e 's|^metrics = .*|metrics = "127.0.0.1:$port"|' \\
    "$repo/deploy/kvtierd.toml" >/etc/kvtier/kvtierd.toml
chown root:kvtier /etc/kvtier/kvtierd.toml
chmod 0640 /etc/kvtier/kvtierd.toml
install -m 0644 "$repo/deploy/kvtierd.service" /etc/systemd/system/kvtierd.service
mkdir -p /etc/systemd/system/kvtierd.service.d
cat >/etc/systemd/system/kvtierd.service.d/test.conf <<CONF
[Unit]
DefaultDependencies=no
[Service]
ExecStart=
ExecStart=/usr/local/bin/kvtierd --config /etc/kvtier/kvtierd.toml
StandardOutput=append:$tmp/kvtierd.log
StandardError=inherit
# A short watchdog, so the wedge check below takes seconds (the shipped unit: 10 s, SIGABRT).
WatchdogSec=2s
WatchdogSignal=SIGKILL
CONF
printf '[Unit]\nDefaultDependencies=no\nWants=kvtierd.service\n' >/etc/systemd/system/kvtier-test.target
for u in systemd-udevd.service systemd-udev-trigger.service systemd-udevd-control.socket \\
         systemd-udevd-kernel.socket systemd-sysctl.service systemd-modules-load.service \\
         systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket \\
         systemd-journald-audit.socket systemd-tmpfiles-setup.service \\
         systemd-tmpfiles-setup-dev.service systemd-remount-fs.service \\
         systemd-random-seed.service getty.target console-getty.service systemd-logind.service \\
         dbus.service dbus.socket systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \\
         systemd-update-utmp.service systemd-firstboot.service systemd-machine-id-commit.service \\
         sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount \\
         sys-fs-fuse-connections.mount dev-hugepages.mount dev-mqueue.mount \\
         systemd-journal-flush.service; do
  ln -sf /dev/null "/etc/systemd/system/\$u"
done
touch "$tmp/console"
mount --bind "$tmp/console" /dev/console  # systemd's own log, kept off the real console
exec /lib/systemd/systemd --system --unit=kvtier-test.target --log-target=console
EOF
chmod +x "$tmp/init.sh"
unshare --pid --fork --mount --uts --cgroup --propagation private --mount-proc "$tmp/init.sh" \
  >"$tmp/unshare.log" 2>&1 &
unshare_pid=$!

init_pid=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  [ -z "$init_pid" ] || kill -KILL "$init_pid" 2>/dev/null || true
  wait "$unshare_pid" 2>/dev/null || true
  rm -f /dev/shm/"$prefix"*
  local c
  for c in "${created_cgroups[@]}"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$tmp"
  return 0
}
trap cleanup EXIT

status=0
fail() { echo "FAIL: $*"; status=1; }
for _ in $(seq 50); do
  init_pid=$(pgrep -P "$unshare_pid" -x systemd || true)
  [ -n "$init_pid" ] && break
  sleep 0.1
done
[ -n "$init_pid" ] || { cat "$tmp/unshare.log"; skip "systemd did not start in the namespace"; }
ns() { nsenter -t "$init_pid" -m -p -u "$@"; }
prop() { ns systemctl show -p "$1" --value kvtierd; }

# ---- started: Type=notify means active only after READY=1 ----
for _ in $(seq 100); do
  state=$(ns systemctl is-active kvtierd 2>/dev/null || true)
  [ "$state" = active ] || [ "$state" = failed ] && break
  sleep 0.1
done
if [ "$state" != active ]; then
  if ! ns systemctl is-system-running >/dev/null 2>&1 && [ -z "$state" ]; then
    cat "$tmp/console" "$tmp/unshare.log"
    skip "systemd cannot manage services in this environment"
  fi
  ns systemctl status kvtierd --no-pager || true
  cat "$tmp/kvtierd.log" "$tmp/console"
  echo "FAIL: kvtierd.service is '$state'"
  exit 1
fi
[ "$(prop StatusText)" = serving ] || fail "StatusText '$(prop StatusText)' (READY=1 not seen?)"
pid=$(prop MainPID)

# ---- ownership and permissions ----
[ "$(ns stat -c '%U:%G %a' /run/kvtier)" = "kvtier:kvtier 750" ] ||
  fail "/run/kvtier is $(ns stat -c '%U:%G %a' /run/kvtier)"
[ "$(ns stat -c '%U:%G %a' /run/kvtier/kvtierd.sock)" = "kvtier:kvtier 660" ] ||
  fail "socket is $(ns stat -c '%U:%G %a' /run/kvtier/kvtierd.sock)"
[ "$(ns stat -c '%U:%G %a' /run/kvtier/kvtierd.sock.mem)" = "kvtier:kvtier 660" ] ||
  fail "memory channel is $(ns stat -c '%U:%G %a' /run/kvtier/kvtierd.sock.mem)"
# Pool memory is unnamed (memfd extents, passed to each worker over the memory channel).
if compgen -G "/dev/shm/$prefix*" >/dev/null; then fail "named pool memory in /dev/shm"; fi
ctl=("$kvtierctl" --socket /run/kvtier/kvtierd.sock status)
ns setpriv --reuid=kvworker --regid=nogroup --init-groups -- "${ctl[@]}" >"$tmp/ctl.out" 2>&1 ||
  fail "a member of group kvtier cannot use kvtierd: $(cat "$tmp/ctl.out")"
if ns setpriv --reuid=nobody --regid=nogroup --init-groups -- "${ctl[@]}" >/dev/null 2>&1; then
  fail "a user outside group kvtier can use kvtierd"
fi
if ! { exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 &&
       grep -q '^kvtier_pool_capacity_bytes' <&3; }; then
  fail "no metrics on 127.0.0.1:$port"
fi
exec 3<&-

# ---- the sandbox as the kernel sees it ----
st=$(ns cat "/proc/$pid/status")
echo "$st" | grep -q '^NoNewPrivs:[[:space:]]1' || fail "NoNewPrivileges not in effect"
echo "$st" | grep -q '^CapBnd:[[:space:]]0000000000000000' || fail "capabilities left"
echo "$st" | grep -q '^Seccomp:[[:space:]]2' || fail "no seccomp filter"
if grep -q 'Max locked memory.*unlimited' <(ns cat "/proc/$pid/limits"); then
  echo "LimitMEMLOCK=infinity in effect"
elif (( (0x$(grep CapEff /proc/self/status | awk '{print $2}') >> 24) & 1 )); then
  fail "LimitMEMLOCK=infinity not in effect: $(ns grep 'locked' "/proc/$pid/limits")"
else
  echo "note: this environment lacks CAP_SYS_RESOURCE, so systemd cannot raise memlock here"
fi

# ---- reload, crash, stop ----
ns sed -i 's/^max_workers = .*/max_workers = 8/' /etc/kvtier/kvtierd.toml
ns systemctl reload kvtierd
for _ in $(seq 50); do grep -q 'SIGHUP: reloaded' "$tmp/kvtierd.log" && break; sleep 0.1; done
grep -q 'SIGHUP: reloaded limits.max_workers 256 -> 8' "$tmp/kvtierd.log" ||
  fail "systemctl reload did not reload: $(tail -3 "$tmp/kvtierd.log")"
ns kill -KILL "$pid"
for _ in $(seq 100); do
  [ "$(prop NRestarts)" = 1 ] && [ "$(prop StatusText)" = serving ] && break
  sleep 0.1
done
if [ "$(prop NRestarts)" != 1 ] || [ "$(prop ActiveState)" != active ]; then
  fail "no restart after kill -9 (NRestarts=$(prop NRestarts), $(prop ActiveState))"
fi
[ "$(prop MainPID)" != "$pid" ] || fail "same MainPID after a crash"
grep -q 'systemd watchdog: a ping every' "$tmp/kvtierd.log" || fail "the watchdog was not armed"
# A wedged daemon (stopped: it answers nothing) misses its watchdog pings and is restarted.
pid=$(prop MainPID)
ns kill -STOP "$pid"
for _ in $(seq 100); do
  [ "$(prop NRestarts)" = 2 ] && [ "$(prop StatusText)" = serving ] && break
  sleep 0.1
done
if [ "$(prop NRestarts)" != 2 ] || [ "$(prop ActiveState)" != active ]; then
  fail "a wedged daemon was not restarted by the watchdog (NRestarts=$(prop NRestarts))"
fi
[ "$(prop MainPID)" != "$pid" ] || fail "same MainPID after the watchdog fired"
count_pools() { { compgen -G "/dev/shm/$prefix*" || true; } | wc -l; }
[ "$(count_pools)" -eq 0 ] || fail "a killed daemon left named memory in /dev/shm"
ns systemctl stop kvtierd
if [ "$(prop ActiveState)" != inactive ] || [ "$(prop Result)" != success ]; then
  fail "stop: $(prop ActiveState) $(prop Result)"
fi
[ "$(count_pools)" -eq 0 ] || fail "stop left named memory in /dev/shm"
ns test ! -e /run/kvtier || fail "/run/kvtier left after stop"

[ "$status" = 0 ] && echo "OK: kvtierd.service under systemd: notify, permissions, sandbox, reload, restart, stop"
exit "$status"
