#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""c10d collectives of known tensors, for commdbg's tensor-shape tests.

    c10d_shapes.py

2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1.  Each rank issues
a fixed sequence of collectives over tensors of several shapes and dtypes
(one with 7 dims, more than commdbg keeps) and prints, as one JSON line,
its pid, dist.get_rank() / get_world_size() and, per collective in issue
order, the shapes and dtypes of the tensors it passed: what the tests
compare commdbg's records with.  Runs on the host's torch 1.13 and on torch
2.x in the trixie root.
"""
import json
import os
import socket
import sys

import torch


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def desc(ts):
    return [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "numel": t.numel(),
             "bytes": t.numel() * t.element_size()} for t in ts]


def rank_main(rank, world, port):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    done = []

    def did(kind, inputs, outputs):
        done.append({"collective": kind, "inputs": desc(inputs), "outputs": desc(outputs)})

    a = torch.ones(3, 5)
    dist.all_reduce(a)
    did("all_reduce", [a], [a])
    b = torch.arange(7, dtype=torch.int64)
    dist.all_reduce(b)
    did("all_reduce", [b], [b])
    c = torch.zeros(2, 3, dtype=torch.float64)
    outs = [torch.empty(2, 3, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(outs, c)
    did("all_gather", [c], outs)
    d = torch.zeros(4, 1, 2, dtype=torch.int32)
    dist.broadcast(d, src=0)
    did("broadcast", [d], [d])
    e = torch.ones(1, 2, 1, 2, 1, 2, 3)  # 7 dims
    dist.all_reduce(e)
    did("all_reduce", [e], [e])
    f = torch.ones(6, dtype=torch.uint8)
    if rank == 0:
        dist.send(f, dst=1)
        did("send", [f], [])
    else:
        dist.recv(f, src=0)
        did("recv", [], [f])
    emit({"rank": rank, "world": dist.get_world_size(), "dist_rank": dist.get_rank(), "pid": os.getpid(),
          "collectives": done})
    dist.destroy_process_group()
    if int(torch.__version__.split(".")[0]) >= 2:
        sys.stdout.flush()
        os._exit(0)  # torch 2.6's teardown may abort (see torch_gloo_workload.py)


def main():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emit({"mode": "c10d_shapes", "pid": os.getpid(), "torch": torch.__version__})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(2, port), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
