#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Records a wake-up does not announce, named before their code is freed.

Pure Python (no torch): loads the stub libnccl.so.2 with ctypes and runs
bursts, each from a function compiled for it alone (burst_0, burst_1, ...):

    py_trailing_records.py BURSTS GAP_MS --lib PATH

A burst calls ncclAllReduce (NULL comm: the stub returns at once), sleeps
2 ms (a tracer woken by that record reads it meanwhile), calls it again, then
waits GAP_MS with its code object alive, then drops the function: its code
object is freed (gc), so a tracer that names the second record later finds
no code object there.  The second record comes within the 5 ms in which
commdbg's kernel side wakes the reader at most once, so nothing announces
it.  Then GAP_MS more before the next burst.  Prints, one write per line,
{"burst": K, "qualname": "burst_K", "file": "<burst K>"} per burst, then
{"pid": PID, "bursts": N, "calls_per_burst": 2}.
"""
import argparse
import ctypes
import gc
import json
import os
import sys
import time

SOURCE = """
def burst_{k}(lib):
    lib.ncclAllReduce(None, None, 1, 7, 0, None, None)
    time.sleep(0.002)
    lib.ncclAllReduce(None, None, 1, 7, 0, None, None)
"""


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bursts", type=int)
    ap.add_argument("gap_ms", type=float)
    ap.add_argument("--lib", required=True)
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.ncclAllReduce.restype = ctypes.c_int
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    gap = args.gap_ms / 1000.0
    for k in range(args.bursts):
        ns = {"time": time}
        exec(compile(SOURCE.format(k=k), f"<burst {k}>", "exec"), ns)
        ns[f"burst_{k}"](lib)
        time.sleep(gap)
        del ns  # the function, its globals and its code: a cycle gc frees now
        gc.collect()
        emit({"burst": k, "qualname": f"burst_{k}", "file": f"<burst {k}>"})
        time.sleep(gap)
    emit({"pid": os.getpid(), "bursts": args.bursts, "calls_per_burst": 2})
    return 0


if __name__ == "__main__":
    sys.exit(main())
