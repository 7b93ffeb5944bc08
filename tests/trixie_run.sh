#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs CMD inside a root filesystem (the trixie root of tests/trixie_root.sh)
# as a containerised job runs: its own python, libc and libtorch, the
# profiler outside.
#
#   tests/trixie_run.sh [--bind HOSTDIR:ROOTDIR]... ROOT CMD [ARG...]
#
# (ROOT: any root of tests/debian_root.sh; the name is the trixie root's, its first user.)
#
# The mounts the job needs (/proc, /sys, /dev, a fresh tmpfs on /dev/shm and
# /tmp, the read-only --bind directories) are made in a private mount
# namespace of this script: the host never sees them, and they go away with
# the namespace however the job ends.  The exit status is CMD's.  The pid
# stays the same from this script to CMD's exec, so `commdbg run` follows it.
set -euo pipefail

die() { echo "trixie_run.sh: $*" >&2; exit 125; }

if [[ ${COMMDBG_TRIXIE_NS:-} != 1 ]]; then
    [[ $(id -u) == 0 ]] || die "needs root (mount, chroot)"
    command -v unshare >/dev/null || die "unshare missing (apt-get install util-linux)"
    COMMDBG_TRIXIE_NS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
unset COMMDBG_TRIXIE_NS

binds=()
while [[ ${1:-} == --bind ]]; do
    [[ ${2:-} == *:/* ]] || die "--bind wants HOSTDIR:/ROOTDIR, got '${2:-}'"
    binds+=("$2")
    shift 2
done
[[ $# -ge 2 ]] || die "usage: trixie_run.sh [--bind HOSTDIR:ROOTDIR]... ROOT CMD [ARG...]"
root=${1%/}
shift
[[ -x $root/bin/sh && -d $root/proc ]] ||
    die "$root is not a built root (build it: tests/trixie_root.sh $root, or make trixie-root)"

mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount -t tmpfs -o mode=1777,size=1g tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
for b in "${binds[@]}"; do
    src=${b%%:*} dst=${b#*:}
    [[ -d $src ]] || die "--bind: $src is not a directory"
    mkdir -p "$root$dst"
    mount --bind "$src" "$root$dst"
    mount -o remount,bind,ro "$root$dst"
done

# No inherited pyenv or venv paths: they name the host's interpreters.
exec env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$root" "$@"
