#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A process that imports torch, forks, and whose child execs a new
interpreter that runs collectives: the child holds its parent's image
(torch mapped) until the exec, and the new one maps torch elsewhere.

    fork_exec_job.py S N

The child waits S seconds before its exec, so that a tracer sees the fork
while the child still has the parent's image; then, exec'd as
`fork_exec_job.py rank N`, it runs N gloo all-reduces of a 16-element
float32 tensor alone (world size 1, tcp on 127.0.0.1) in do_all_reduces().
Stdout, one write per line: the plan {"mode", "pid"}, then the rank's
{"rank": 0, "pid", "issued": N, "numel", "dtype"} at its end.
"""
import json
import os
import socket
import sys
import time

import torch

NUMEL = 16


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def do_all_reduces(n):
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(NUMEL)
    for _ in range(n):
        dist.all_reduce(t)
    dist.destroy_process_group()
    emit({"rank": 0, "pid": os.getpid(), "issued": n, "numel": NUMEL, "dtype": str(t.dtype).replace("torch.", "")})


def main():
    if sys.argv[1] == "rank":
        do_all_reduces(int(sys.argv[2]))
        return 0
    emit({"mode": "fork_exec", "pid": os.getpid()})
    child = os.fork()
    if child == 0:
        time.sleep(float(sys.argv[1]))
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "rank", sys.argv[2]])
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
