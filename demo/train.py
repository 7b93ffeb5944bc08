#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The demo's training job: 2 ranks (torch.multiprocessing), gloo on
127.0.0.1, a small model whose blocks all-reduce their activations (as a
tensor-parallel layer does), gradients all-reduced by hand inside a
record_function("grad_sync") scope, 3 steps each inside
record_function("train_step").  Nothing in it knows commdbg.  At the end
each rank prints its own account of the collectives it issued, per module
(as CommDebugMode would count them: a block's all-reduce counts for the
block and for the root), for the demo to set beside commdbg's:

    rank 0 (pid 4242) issued: <root> forward all_reduce=6; blocks.0 forward all_reduce=3; ...

    python3 demo/train.py [--steps N]
"""
import collections
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.autograd.profiler import record_function

ISSUED = collections.Counter()  # (module path, "forward"), counted by the job itself


class Block(nn.Module):
    def __init__(self, dim, path):
        super().__init__()
        self.path = path
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        dist.all_reduce(h)  # the partial sums of a row-parallel layer
        ISSUED[(self.path, "forward")] += 1
        ISSUED[("<root>", "forward")] += 1
        return h / dist.get_world_size()


class Net(nn.Module):
    def __init__(self, dim=16, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, f"blocks.{i}") for i in range(blocks))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def sync_gradients(model):
    with record_function("grad_sync"):
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def rank_main(rank, world, port, steps):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with record_function("train_step"):
            x = torch.randn(8, 16)
            loss = model(x).pow(2).mean()
            loss.backward()
            sync_gradients(model)
            opt.step()
            opt.zero_grad()
    account = "; ".join(f"{path} {side} all_reduce={n}" for (path, side), n in sorted(ISSUED.items()))
    # One write: the two ranks' lines never interleave.
    os.write(1, f"rank {rank} (pid {os.getpid()}) issued: {account}\n".encode())
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, a.steps), nprocs=2)


if __name__ == "__main__":
    main()
