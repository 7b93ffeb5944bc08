#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Module calls that look alike from outside, for commdbg's module-call tests.

    module_calls.py [STEPS]

2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1, STEPS (default 2)
calls of the model in a row, nothing between them:

    <root>  Model      forward: grove.0, grove.1, then lone twice in a row
      grove  ModuleList
        0  Tree        (same class as grove.1)
          canopy  Canopy   forward: 1 all_reduce
        1  Tree
          canopy  Canopy   forward: 1 all_reduce
      lone  Canopy         forward: 1 all_reduce

Every collective is issued with no other probed call between it and the
previous one: the siblings' frames (and each repeated call's) sit where the
last one's did.  Per rank, one JSON line: {"rank", "pid", "module_calls":
{fqn: calls}, "collectives": [[fqn, ...] per all_reduce, outermost module
first]}, from forward pre/post hooks (root "<root>").  Runs on torch 1.13
(host) and 2.x (trixie root).
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

STACK = []
CALLS = {}
ISSUED = []


class Canopy(nn.Module):
    def forward(self, x):
        ISSUED.append(list(STACK))
        dist.all_reduce(x)
        return x


class Tree(nn.Module):
    def __init__(self):
        super().__init__()
        self.canopy = Canopy()

    def forward(self, x):
        return self.canopy(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.grove = nn.ModuleList([Tree(), Tree()])
        self.lone = Canopy()

    def forward(self, x):
        for t in self.grove:
            x = t(x)
        x = self.lone(x)
        return self.lone(x)


def rank_main(rank, world, port, steps):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = Model()
    names = {m: (fqn or "<root>") for fqn, m in model.named_modules()}

    def pre(m, args):
        STACK.append(names[m])
        CALLS[names[m]] = CALLS.get(names[m], 0) + 1

    def post(m, args, out):
        STACK.pop()

    for m in names:
        if not isinstance(m, nn.ModuleList):  # iterated, never called
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)
    x = torch.ones(4)
    for _ in range(steps):
        model(x)
    sys.stdout.write(json.dumps({"rank": rank, "pid": os.getpid(), "module_calls": CALLS,
                                 "collectives": ISSUED}) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    if int(torch.__version__.split(".")[0]) >= 2:
        os._exit(0)  # torch 2.6's teardown may abort (see torch_gloo_workload.py)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sys.stdout.write(json.dumps({"mode": "module_calls", "pid": os.getpid(), "torch": torch.__version__}) + "\n")
    sys.stdout.flush()
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(2, port, steps), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
