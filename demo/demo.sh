#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make demo`: what commdbg shows, on real jobs, in a few minutes.  Builds only
# what it runs (commdbg, and the stub libnccl with its workload for part 3),
# then:
#   1. traces a real PyTorch job from outside (bookworm's torch 1.13, gloo,
#      2 ranks: demo/train.py) at noise level 2 — record_function scopes,
#      nn.Module calls, each c10d collective with the Python line that issued
#      it — and sets commdbg's per-module counts beside the job's own;
#   2. runs `commdbg check` on an FSDP2 job with a lifecycle fault (torch 2.6
#      in the trixie root of `make trixie-root`, when it is there);
#   3. traces the stub-NCCL workload: exact counts of the NCCL API.
# Prints how long it took, build included.
#
#   demo/demo.sh [BUILD_DIR]        (as root: BPF)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TRIXIE_ROOT=${TRIXIE_ROOT:-/var/cache/commdbg/trixie-root}
DEMO_CALLS=${DEMO_CALLS:-all_reduce=8,all_gather=4,reduce_scatter=4,broadcast=2}
start=$SECONDS

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building commdbg (only what the demo runs)"
[[ -f $BUILD/CMakeCache.txt ]] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target commdbg nccl_workload stub_nccl | grep -v '^\[' || true
built=$((SECONDS - start))
echo "built in ${built} s"

say "1. a PyTorch job (torch 1.13, gloo, 2 ranks), traced from outside: commdbg run --noise-level 2"
echo "   (demo/train.py knows nothing of commdbg; the same works on a running job: commdbg attach PID)"
"$BUILD/bin/commdbg" run --noise-level 2 --probes torch-c10d,torch-scopes,torch-modules \
    --json "$BUILD/demo-torch.json" -- /usr/bin/python3 demo/train.py
say "   per-module counts: commdbg's (its JSON dump through the Python package, CommDebugMode's API) and the job's own"
/usr/bin/python3 demo/module_counts.py "$BUILD/demo-torch.json"

say "2. the FSDP lifecycle checks: commdbg check on an FSDP2 job whose layers.1 forward is bypassed"
if [[ -x $TRIXIE_ROOT/usr/bin/python3 ]]; then
    rc=0
    USE_LIBUV=0 GLOO_SOCKET_IFNAME=lo "$BUILD/bin/commdbg" check -- tests/trixie_run.sh \
        --bind "$PWD/tests/testprogs:/opt/commdbg-testprogs" "$TRIXIE_ROOT" \
        python3 /opt/commdbg-testprogs/fsdp2_workload.py bypassed_child | grep -v '^{' || rc=$?
    echo "commdbg check exited $rc (3: a violation was found)"
else
    echo "skipped: FSDP2 needs torch >= 2.4, which lives in a Debian trixie root that is not built at"
    echo "$TRIXIE_ROOT — build it once with 'make trixie-root' (~1.3 GB, a few minutes), then run 'make demo' again"
fi

say "3. the NCCL API, exact: the stub libnccl's workload ($DEMO_CALLS, 2 threads)"
LD_LIBRARY_PATH=$BUILD/lib/stub "$BUILD/bin/commdbg" run --json "$BUILD/demo.json" -- \
    "$BUILD/bin/nccl_workload" --calls "$DEMO_CALLS" --threads 2 --init-seed 7 --nranks 4 --rank 0
echo "JSON dumps: $BUILD/demo-torch.json, $BUILD/demo.json"

say "demo: done in $((SECONDS - start)) s (build ${built} s)"
