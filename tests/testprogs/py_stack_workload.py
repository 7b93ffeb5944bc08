#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Known Python stacks at a probed native call, for commdbg's py_stack tests.

Pure Python (no torch): loads libnccl.so.2 (the in-tree stub; --lib PATH, or
the one LD_LIBRARY_PATH finds) with ctypes, which releases the GIL around
the call as torch's bindings do, and calls ncclAllReduce with a NULL comm
(the stub returns ncclInvalidArgument at once) from known places.

    py_stack_workload.py sites [--lib PATH] [--wait-file PATH] [--depth N]
        First one JSON line per call site, in call order:
            {"site": NAME, "innermost": [qualnames, innermost first]}
        (the qualnames the innermost frames must have; co_name on 3.10,
        which has no co_qualname), then "ready pid=N".  Waits until the
        wait file exists (or, without one, for a line on stdin), then makes
        exactly one call per site and prints per site
            {"call": NAME, "tid": TID, "stack": [{"qualname", "file",
             "line", "first"}, ...]}
        the whole stack as the interpreter itself sees it at the call,
        innermost first ("line": the line being run, "first":
        co_firstlineno).  Sites: nested functions, a method, a closure
        capturing self, a generator, a second Python thread, a recursion
        --depth deep (default 200) and a native thread without Python
        (pthread_create straight into ncclCommDestroy(NULL) instead: its
        "stack" is [] and its tid is unknown here: "tid": 0), and last a
        call right after dlopen of a library not mapped before (libanl).
        Ends with
            {"pid": PID, "calls": N, "python": "3.X", "tids": [...]}
        and exits 0; 1 when a site's innermost frames are not the ones
        announced (the workload checks itself before a test trusts it).

    py_stack_workload.py bench DEPTH [--lib PATH]
        For bench/bench_py_stack: prints "ready", then for each line
        "go N" on stdin makes N ncclAllReduce calls from DEPTH nested
        Python frames and prints the seconds they took.
"""
import argparse
import ctypes
import json
import os
import sys
import threading
import time

QUALNAME = sys.version_info >= (3, 11)  # 3.10 code objects have co_name only
LIB = None
PROBED = []  # (site, tid, stack) in call order


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def name_of(code):
    return code.co_qualname if QUALNAME else code.co_name


def stack_of(frame):
    out = []
    while frame is not None:
        c = frame.f_code
        out.append({"qualname": name_of(c), "file": c.co_filename, "line": frame.f_lineno,
                    "first": c.co_firstlineno})
        frame = frame.f_back
    return out


def probed(site, frame):
    # Called on the same line as the ncclAllReduce it describes, so every
    # frame's f_lineno is the line the native call runs from.
    PROBED.append((site, threading.get_native_id(), stack_of(frame)))


def load(lib_path):
    global LIB
    LIB = ctypes.CDLL(lib_path)
    f = LIB.ncclAllReduce
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_void_p]


# ---- the call sites ----------------------------------------------------------

def outer():
    def middle():
        def inner():
            probed("nested", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)
        inner()
    middle()


class Worker:
    def method(self):
        probed("method", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)

    def with_closure(self):
        # `self` is a cell here (inner reads it): localsplus[0] holds the cell.
        def inner():
            probed("closure_self", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)
            return self
        inner()

    def gen(self):
        probed("generator", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)
        yield 1

    def run_generator(self):
        for _ in self.gen():
            pass


def thread_body():
    probed("thread", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)


def recurse(n):
    if n > 1:
        return recurse(n - 1)
    probed("recursion", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)


def after_dlopen():
    probed("after_dlopen", sys._getframe()) or LIB.ncclAllReduce(None, None, 1, 7, 0, None, None)


def load_then_call():
    # A library mapped after the attach (torch loads some lazily): the
    # tracer sees the loader change and must keep resolving frames.
    ctypes.CDLL("libanl.so.1")
    after_dlopen()


def no_python_thread():
    # A thread that never runs Python: pthread_create starts it right in
    # ncclCommDestroy(NULL) (its one argument is pthread's: the stub frees
    # NULL), a probed call whose records carry a stack.
    libc = ctypes.CDLL(None)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    start = ctypes.cast(LIB.ncclCommDestroy, ctypes.c_void_p).value
    t = ctypes.c_ulong()
    if libc.pthread_create(ctypes.byref(t), None, start, None) != 0:
        sys.exit("pthread_create failed")
    libc.pthread_join(t.value, None)
    PROBED.append(("no_python", 0, []))


def sites(depth):
    """(name, function to run it, the innermost qualnames it must show)."""
    w = Worker()

    def nested_names():
        if QUALNAME:
            return ["outer.<locals>.middle.<locals>.inner", "outer.<locals>.middle", "outer"]
        return ["inner", "middle", "outer"]

    def q(name):
        return name if QUALNAME else name.rsplit(".", 1)[-1]

    def second_thread():
        t = threading.Thread(target=thread_body, name="py-stack-second")
        t.start()
        t.join()

    return [
        ("nested", outer, nested_names()),
        ("method", w.method, [q("Worker.method")]),
        ("closure_self", w.with_closure,
         [q("Worker.with_closure.<locals>.inner") if QUALNAME else "inner", q("Worker.with_closure")]),
        ("generator", w.run_generator, [q("Worker.gen"), q("Worker.run_generator")]),
        ("thread", second_thread, ["thread_body", q("Thread.run")]),
        ("recursion", lambda: recurse(depth), ["recurse"] * depth),
        ("no_python", no_python_thread, []),
        ("after_dlopen", load_then_call, ["after_dlopen", "load_then_call"]),
    ]


def wait_go(wait_file):
    if not wait_file:
        sys.stdin.readline()
        return
    while not os.path.exists(wait_file):
        time.sleep(0.01)


def run_sites(args):
    load(args.lib)
    plan = sites(args.depth)
    for name, _, innermost in plan:
        emit({"site": name, "innermost": innermost})
    print("ready pid=%d" % os.getpid(), flush=True)
    wait_go(args.wait_file)
    for _, run, _ in plan:
        run()
    ok = True
    for (name, _, innermost), (site, tid, stack) in zip(plan, PROBED):
        got = [f["qualname"] for f in stack[:len(innermost)]]
        if site != name or got != innermost:
            sys.stderr.write("py_stack_workload: site %s: innermost %s, announced %s\n" % (site, got, innermost))
            ok = False
        emit({"call": site, "tid": tid, "stack": stack})
    emit({"pid": os.getpid(), "calls": len(PROBED), "python": "%d.%d" % sys.version_info[:2],
          "tids": sorted({tid for _, tid, _ in PROBED if tid})})
    # Frames are named from the live process when commdbg takes the record
    # (within a few ms); code objects freed before that -- this script's
    # <module> at exit -- are "<unknown>" by design.  Stay alive a moment so
    # the last site is named, as a job that goes on after a collective would.
    time.sleep(0.3)
    return 0 if ok and len(PROBED) == len(plan) else 1


def deep(n, calls):
    if n > 1:
        return deep(n - 1, calls)
    f = LIB.ncclAllReduce
    t0 = time.perf_counter()
    for _ in range(calls):
        f(None, None, 1, 7, 0, None, None)
    return time.perf_counter() - t0


def bench(args):
    load(args.lib)
    # <module>, main() and bench() are 3 of the DEPTH frames at the call.
    frames = max(1, args.depth - 3)
    print("ready", flush=True)
    for line in sys.stdin:
        print(deep(frames, int(line.split()[1])), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sites", "bench"])
    p.add_argument("depth", nargs="?", type=int, default=None)
    p.add_argument("--lib", default="libnccl.so.2")
    p.add_argument("--wait-file", default="")
    p.add_argument("--depth", dest="depth_opt", type=int, default=200)
    args = p.parse_args()
    if args.mode == "bench":
        args.depth = args.depth or 20
        return bench(args)
    args.depth = args.depth_opt
    return run_sites(args)


if __name__ == "__main__":
    sys.exit(main())
