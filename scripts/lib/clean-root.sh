# Sourced inside a private mount namespace by scripts/package-test and scripts/wheel-test: the
# throwaway overlay over the clean Debian 12 root and the helpers both tests use.
# Needs: tmp (holding upper/, work/, root/), base (the clean root), archives (apt's cache, kept
# across runs); ROOT_PATH may prepend directories to the root's PATH.
root=$tmp/root
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }
mount -t overlay overlay -o "lowerdir=$base,upperdir=$tmp/upper,workdir=$tmp/work" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mount -t tmpfs tmpfs "$root/tmp"
mount --bind "$archives" "$root/var/cache/apt/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i PATH="${ROOT_PATH:+$ROOT_PATH:}/usr/sbin:/usr/bin:/sbin:/bin" \
              HOME=/root DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
