#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian roots the tests run in, built with debootstrap (minbase) and
# cached outside the repository, so that a clean clone, `make clean` and every
# worktree reuse them:
#   trixie    python3 3.13 and python3-torch 2.6 with gloo: the torch 2.x
#             jobs (bookworm's torch 1.13 cannot run FSDP2); ~1.3 GB.
#             Default DIR: $COMMDBG_TRIXIE_ROOT or /var/cache/commdbg/trixie-root.
#   bookworm  a clean bookworm with bookworm-backports in its apt sources:
#             where the Debian package is installed and purged (test_deb).
#             Default DIR: $COMMDBG_BOOKWORM_ROOT or /var/cache/commdbg/bookworm-root.
#
#   tests/debian_root.sh NAME [DIR]           build DIR unless it is already healthy
#   tests/debian_root.sh --check NAME [DIR]   exit 0 when healthy, 1 otherwise
#
# A root is built in DIR.tmp and renamed into place only after it passed its
# health check, and the stamp DIR/.commdbg-NAME-root is written last, so an
# interrupted build never looks healthy.  Jobs run in one through
# tests/trixie_run.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
check_only=0
if [[ ${1:-} == --check ]]; then check_only=1; shift; fi
name=${1:-}
shift || true
case $name in
    trixie)
        dir=${1:-${COMMDBG_TRIXIE_ROOT:-/var/cache/commdbg/trixie-root}}
        suite=trixie
        pkgs=python3,python3-torch,python3-numpy
        # Bump when the package set changes: an older root is rebuilt.
        recipe="minbase trixie python3 python3-torch python3-numpy v1"
        ;;
    bookworm)
        dir=${1:-${COMMDBG_BOOKWORM_ROOT:-/var/cache/commdbg/bookworm-root}}
        suite=bookworm
        pkgs=ca-certificates
        recipe="minbase bookworm ca-certificates backports v1"
        ;;
    *)
        echo "usage: tests/debian_root.sh [--check] trixie|bookworm [DIR]" >&2
        exit 2
        ;;
esac
dir=${dir%/}
stamp=.commdbg-$name-root
die() { echo "debian_root.sh: $*" >&2; exit 1; }

# What the tests rely on: trixie's torch imports, has gloo, and is the 2.x
# they expect; bookworm's apt and dpkg run.
healthy() {
    [[ -f $1/$stamp ]] && [[ $(cat "$1/$stamp") == "$recipe" ]] || return 1
    if [[ $name == trixie ]]; then
        "$here/trixie_run.sh" "$1" python3 -c \
            'import sys, torch, torch.distributed as d; sys.exit(not (d.is_gloo_available() and torch.__version__.startswith("2.")))' \
            >/dev/null 2>&1
    else
        "$here/trixie_run.sh" "$1" sh -c 'apt-get --version && dpkg --version' >/dev/null 2>&1
    fi
}

if healthy "$dir"; then
    [[ $check_only == 1 ]] || echo "$name root $dir: healthy, kept"
    exit 0
fi
[[ $check_only == 0 ]] || exit 1

[[ $(id -u) == 0 ]] || die "building $dir needs root (debootstrap, chroot); run as root, or set COMMDBG_TRIXIE_ROOT to a healthy root"
mkdir -p "$(dirname "$dir")"
# One builder at a time; a second waits and then finds the root healthy.
exec 9>"$dir.lock"
flock 9
if healthy "$dir"; then echo "$name root $dir: healthy, kept"; exit 0; fi

# A mount left inside the old tree would make rm -rf reach the host.
if grep -qF " $dir" /proc/self/mountinfo; then
    die "something is mounted under $dir (see /proc/self/mountinfo); unmount it, then rerun"
fi

if ! command -v debootstrap >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap ||
        die "cannot install debootstrap (apt-get install debootstrap)"
fi

# The archive this machine's apt already uses (a mirror or proxy of Debian's).
mirror=$(sed -n 's/^URIs:[[:space:]]*\(http[^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

tmp=$dir.tmp
rm -rf --one-file-system "$tmp"
echo "$name root $dir: building from $mirror (a few minutes)"
start=$(date +%s)
if ! debootstrap --variant=minbase --include="$pkgs" "$suite" "$tmp" "$mirror" >"$dir.build.log" 2>&1; then
    tail -n 20 "$dir.build.log" >&2
    die "debootstrap failed (log: $dir.build.log); check that $mirror serves $suite, then rerun"
fi
if [[ $name == bookworm ]]; then
    # libbpf >= 1.4 (the package's dependency) is in bookworm-backports.
    echo "deb $mirror bookworm-backports main" >"$tmp/etc/apt/sources.list.d/bookworm-backports.list"
fi
echo "$recipe" >"$tmp/$stamp"
if ! healthy "$tmp"; then
    die "the new root $tmp fails its health check (see healthy() in $0); left in place for inspection"
fi
if [[ -e $dir ]]; then
    rm -rf --one-file-system "$dir.old"
    mv "$dir" "$dir.old"
fi
mv "$tmp" "$dir"
rm -rf --one-file-system "$dir.old"
echo "$name root $dir: built in $(($(date +%s) - start)) s, $(du -sh --one-file-system "$dir" | cut -f1)"
