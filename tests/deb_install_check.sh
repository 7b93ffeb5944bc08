#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian package into a clean bookworm root (tests/debian_root.sh
# bookworm), runs its programs there, purges it and shows what is left.  The
# cached root is never changed: all of it happens on an overlay of the root,
# in a private mount namespace, gone when this script ends.
#
#   tests/deb_install_check.sh ROOT DEB
#
# Prints one "== STEP" line before each step's output and "== end" after the
# last; stops at the first step that fails, with its status.  The first round
# (apt-get install: the dependencies come from bookworm and its backports,
# then purge) leaves the dependencies in; the second (dpkg -i ... purge) is
# the one compared: a tree listing before it and after its purge.
set -euo pipefail
if [[ ${COMMDBG_DEB_NS:-} != 1 ]]; then
    [[ $(id -u) == 0 ]] || { echo "deb_install_check.sh: needs root (mount, chroot)" >&2; exit 125; }
    COMMDBG_DEB_NS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
[[ $# == 2 && -f $2 && -x $1/bin/sh ]] || { echo "usage: deb_install_check.sh ROOT DEB" >&2; exit 125; }
root=${1%/}
work=$(mktemp -d /tmp/commdbg-deb.XXXXXX)
m=$work/merged
trap 'umount -R "$m" 2>/dev/null || true; rm -rf --one-file-system "$work"' EXIT
mkdir -p "$work/upper" "$work/work" "$m"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$work/upper,workdir=$work/work" "$m"
mount -t proc proc "$m/proc"
mount -t sysfs sysfs "$m/sys"
mount --bind /dev "$m/dev"
cp /etc/resolv.conf "$m/etc/resolv.conf"
cp "$2" "$m/tmp/commdbg.deb"

in_root() { chroot "$m" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
# Every file, directory and link, but the package manager's own records.
snapshot() {
    (cd "$m" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp -o -path ./var/lib/dpkg \
        -o -path ./var/lib/apt -o -path ./var/cache -o -path ./var/log \) -prune -o -print | sort)
}

echo "== apt-get install"
in_root apt-get update -q
in_root apt-get install -y -q --no-install-recommends -t bookworm-backports /tmp/commdbg.deb
in_root dpkg --purge commdbg
snapshot >"$work/before"
echo "== dpkg -i"
in_root dpkg -i /tmp/commdbg.deb
echo "== commdbg --version"
in_root commdbg --version
echo "== commdbg probes list"
in_root commdbg probes list
echo "== commdbgd --help"
in_root commdbgd --help
echo "== dpkg -L commdbg"
in_root dpkg -L commdbg
echo "== enabled units"
ls "$m/etc/systemd/system/multi-user.target.wants/"
echo "== dpkg --purge"
in_root dpkg --purge commdbg
snapshot >"$work/after"
echo "== left after purge"
diff "$work/before" "$work/after" || true
echo "== end"
