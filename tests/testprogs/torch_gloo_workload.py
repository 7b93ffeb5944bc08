#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A known amount of c10d and ATen work, for commdbg's torch tests.

    torch_gloo_workload.py train [STEPS [ALLREDUCE ALLGATHER BROADCAST]]
        2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1 with a free
        port, a small nn.Linear model; per step exactly ALLREDUCE
        dist.all_reduce, ALLGATHER dist.all_gather and BROADCAST
        dist.broadcast calls (defaults 3 steps, 2 1 1).  Prints the plan as a
        JSON line first (with the interpreter's and torch's versions, so a
        test sees where it ran: the host's torch 1.13 or torch 2.x in the
        trixie root), then one JSON line per rank with its pid and the calls
        it made.  No other collective is issued between init_process_group
        and destroy_process_group (no barrier).  On torch 2.x a rank ends with
        os._exit(0) right after destroy_process_group (see rank_main).
    torch_gloo_workload.py throw [N]
        One process: N (default 1000) torch.mm calls on mismatched shapes,
        each raising a C++ exception through at::_ops::mm::call, caught in
        Python.  Exits 0; prints a JSON line with its pid and the count.
"""
import json
import os
import socket
import sys

import torch


def emit(obj):
    # One write per line: two ranks share stdout.
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, steps, n_ar, n_ag, n_bc):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = {"all_reduce": 0, "all_gather": 0, "broadcast": 0}
    x = torch.randn(16, 8)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        for i in range(n_ar):
            dist.all_reduce(grads[i % len(grads)])
            calls["all_reduce"] += 1
        for _ in range(n_ag):
            out = [torch.empty(4) for _ in range(world)]
            dist.all_gather(out, torch.full((4,), float(rank)))
            calls["all_gather"] += 1
        for _ in range(n_bc):
            dist.broadcast(model.weight.data, src=0)
            calls["broadcast"] += 1
        opt.step()
    emit({"rank": rank, "pid": os.getpid(), "calls": calls})
    dist.destroy_process_group()
    if int(torch.__version__.split(".")[0]) >= 2:
        # Debian's torch 2.6 aborts in about one run of six while the
        # interpreter finalizes a rank after destroy_process_group ("terminate
        # called without an active exception", SIGABRT), untraced too; the
        # work is done here.
        sys.stdout.flush()
        os._exit(0)


def train(argv):
    steps = int(argv[0]) if len(argv) > 0 else 3
    n_ar, n_ag, n_bc = (int(a) for a in argv[1:4]) if len(argv) >= 4 else (2, 1, 1)
    world = 2
    port = free_port()
    emit({"mode": "train", "pid": os.getpid(), "world": world, "steps": steps,
          "python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__,
          "per_step": {"all_reduce": n_ar, "all_gather": n_ag, "broadcast": n_bc}})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, port, steps, n_ar, n_ag, n_bc), nprocs=world, join=True)
    return 0


def throw(argv):
    n = int(argv[0]) if argv else 1000
    a, b = torch.ones(2, 3), torch.ones(4, 5)
    caught = 0
    for _ in range(n):
        try:
            torch.mm(a, b)
        except RuntimeError:
            caught += 1
    emit({"mode": "throw", "pid": os.getpid(), "calls": n, "caught": caught})
    return 0 if caught == n else 1


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "train"
    if mode == "train":
        sys.exit(train(sys.argv[2:]))
    if mode == "throw":
        sys.exit(throw(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} train [STEPS [ALLREDUCE ALLGATHER BROADCAST]] | throw [N]")
