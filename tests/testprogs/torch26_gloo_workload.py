#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A known number of c10d collectives on torch 2.x, for commdbg's tests that
run the job inside the trixie root (tests/trixie_run.sh).

    torch26_gloo_workload.py [STEPS [ALLREDUCE BROADCAST]]
        2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1 with a free
        port, a small nn.Linear model; per step exactly ALLREDUCE
        dist.all_reduce and BROADCAST dist.broadcast calls (defaults 3 steps,
        2 1).  Prints the plan as a JSON line first (with the interpreter's
        and torch's versions, so a test sees where it ran), then one JSON line
        per rank with its pid and the calls it made.  No other collective is
        issued between init_process_group and destroy_process_group.  A rank
        ends with os._exit(0) right after destroy_process_group.
"""
import json
import os
import socket
import sys

# Debian's torch 2.6 is built without libuv, the TCP store's default there.
os.environ.setdefault("USE_LIBUV", "0")
# The root has no /etc/hosts entry for the host name gloo would resolve.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402


def emit(obj):
    # One write per line: two ranks share stdout.
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, steps, n_ar, n_bc):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = {"all_reduce": 0, "broadcast": 0}
    x = torch.randn(16, 8)
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        grads = [p.grad for p in model.parameters()]
        for i in range(n_ar):
            dist.all_reduce(grads[i % len(grads)])
            calls["all_reduce"] += 1
        for _ in range(n_bc):
            dist.broadcast(model.weight.data, src=0)
            calls["broadcast"] += 1
        opt.step()
    emit({"rank": rank, "pid": os.getpid(), "calls": calls})
    dist.destroy_process_group()
    # Debian's torch 2.6 aborts in about one run of six while the interpreter
    # finalizes a rank after destroy_process_group ("terminate called without
    # an active exception", SIGABRT), untraced too; the work is done here.
    sys.stdout.flush()
    os._exit(0)


def main(argv):
    steps = int(argv[0]) if len(argv) > 0 else 3
    n_ar, n_bc = (int(a) for a in argv[1:3]) if len(argv) >= 3 else (2, 1)
    world = 2
    port = free_port()
    emit({"mode": "train", "pid": os.getpid(), "world": world, "steps": steps,
          "python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__,
          "per_step": {"all_reduce": n_ar, "broadcast": n_bc}})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, port, steps, n_ar, n_bc), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
