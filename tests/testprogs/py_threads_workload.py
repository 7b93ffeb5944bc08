#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two Python threads that sit still, for reading every thread's stack from
outside (commdbg hang).  Any CPython >= 3.8, no torch.

The main thread sleeps in inner() called from outer(); a second thread
sleeps in worker_loop().  Prints {"pid", "worker_tid"} once
both are in place (worker_tid: threading.get_native_id()); exits after 60 s.
Lines marked "# here: NAME" are where each thread is.
"""
import json
import sys
import threading
import time

ready = threading.Event()
tid = []


def worker_loop():
    tid.append(threading.get_native_id())
    ready.set()
    time.sleep(60)  # here: worker_loop


def inner():
    ready.wait()
    print(json.dumps({"pid": __import__("os").getpid(), "worker_tid": tid[0]}), flush=True)
    time.sleep(60)  # here: inner


def outer():
    inner()  # here: outer


threading.Thread(target=worker_loop, daemon=True).start()
outer()  # here: <module>
sys.exit(0)
