# SPDX-License-Identifier: Apache-2.0
# A probe target for Python discovery: prints what it knows of itself from
# inside (its thread state, the autoTSSkey it finds by asking pthread, its
# pthread_self) as one line, then waits in wait_here() until killed.
import ctypes
import os
import sys
import time


def own_key(tstate):
    # The key whose pthread slot holds this thread's tstate, found without
    # CPython internals: ask pthread_getspecific for each key.
    libc = ctypes.CDLL(None)
    libc.pthread_getspecific.restype = ctypes.c_void_p
    libc.pthread_getspecific.argtypes = [ctypes.c_uint]
    for k in range(1024):
        if libc.pthread_getspecific(k) == tstate:
            return k
    return -1


def wait_here():
    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    tstate = api.PyThreadState_Get()
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_void_p
    runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
    print("PYWAIT pid=%d tstate=%d key=%d pthread_self=%d runtime=%d version=%d.%d.%d" % (
        os.getpid(), tstate, own_key(tstate), libc.pthread_self(), runtime, *sys.version_info[:3]), flush=True)
    while True:
        time.sleep(1)


wait_here()
