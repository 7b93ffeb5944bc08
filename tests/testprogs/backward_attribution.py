#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Collectives issued in backward, for commdbg's backward-attribution tests.

    backward_attribution.py [STEPS]

2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1, STEPS (default 2)
forward+backward passes of:

    <root>  Model
      grove  ModuleList (iterated, never called)
        0  Tree
          canopy  Canopy  applies AllReduceGrad, a custom autograd.Function:
                          identity forward, an all_reduce of the gradient in
                          its backward
        1  Tree           (same class as grove.0: siblings)
      ckpt  Block         run through torch.utils.checkpoint: its
                          forward issues one all_reduce (before lin), again
                          when backward recomputes it
        lin  Linear
      tail  Tail          registers a tensor hook on its output's input-side
                          tensor that all_reduces the gradient
      head  Linear

Each rank counts what it issued where it issues it, in CommDebugMode's terms
(module_comm_counts: {fqn: {"forward"|"backward": {"all_reduce": n}}}): a
forward collective under every module running; a backward one under the
module whose forward made the autograd node that issued it and under that
module's callers; a recomputed forward's (activation checkpointing) as
backward, under the recomputed module and its callers.  On torch >= 2.4
CommDebugMode itself runs too, one window per step, and its
comm_module_counts (summed) are printed next to the rank's own ("commdebug").  One
JSON line per rank: {"rank", "pid", "torch", "module_comm_counts",
"commdebug"?, "calls"}.  torch 1.13 (host) and 2.x (trixie root).
"""
import json
import os
import socket
import sys
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

DIM = 8
# torch 1.13: the reentrant checkpoint (its first forward under no_grad, the
# recomputation in the checkpoint's backward, which runs a nested backward);
# torch 2.x: the non-reentrant one (recomputed from a saved-tensor hook inside
# the node that needs it), the one CommDebugMode can follow.
REENTRANT = int(torch.__version__.split(".")[0]) < 2


def in_backward():
    if REENTRANT:
        return torch.is_grad_enabled()  # the first forward runs under no_grad
    return torch._C._current_graph_task_id() != -1
COUNTS = defaultdict(lambda: {"forward": defaultdict(int), "backward": defaultdict(int)})
RUNNING = []  # FQNs whose forward runs, outermost first (forward hooks)
CALLS = [0]
NODES = {}  # module FQN -> torch's own name of the node its custom Function made (grad_fn.name())


def callers(fqn):
    """fqn and the modules that call it (its dotted prefixes that are called, and the root)."""
    out = [fqn]
    parts = fqn.split(".")
    for i in range(len(parts) - 1, 0, -1):
        p = ".".join(parts[:i])
        if p != "grove":  # a ModuleList is iterated, never called
            out.append(p)
    if fqn != "<root>":
        out.append("<root>")
    return out


def all_reduce(t, backward_of=None):
    dist.all_reduce(t)
    CALLS[0] += 1
    if backward_of is not None:
        for m in callers(backward_of):
            COUNTS[m]["backward"]["all_reduce"] += 1
    else:
        for m in RUNNING:
            COUNTS[m]["forward"]["all_reduce"] += 1


class AllReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, owner):
        ctx.owner = owner
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        all_reduce(g, backward_of=ctx.owner)
        return g, None


class Canopy(nn.Module):
    def forward(self, x):
        y = AllReduceGrad.apply(x, self.fqn)
        NODES[self.fqn] = y.grad_fn.name()
        return y


class Tree(nn.Module):
    def __init__(self):
        super().__init__()
        self.canopy = Canopy()

    def forward(self, x):
        return self.canopy(x) + 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, x):
        # Before lin runs: CommDebugMode's tracker does not leave a module
        # while it recomputes, so a collective after lin would be lin's there.
        recompute = in_backward()
        all_reduce(x.detach().sum().reshape(1), backward_of=self.fqn if recompute else None)
        return torch.relu(self.lin(x))


class Tail(nn.Module):
    def forward(self, x):
        y = x * 2
        fqn = self.fqn
        y.register_hook(lambda g: all_reduce(g.detach().sum().reshape(1), backward_of=fqn))
        return y - 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.grove = nn.ModuleList([Tree(), Tree()])
        self.ckpt = Block()
        self.tail = Tail()
        self.head = nn.Linear(DIM, 2)

    def forward(self, x):
        for t in self.grove:
            x = t(x)
        x = checkpoint(self.ckpt, x, use_reentrant=REENTRANT)
        return self.head(self.tail(x))


def enter(m, args):
    RUNNING.append(m.fqn)


def leave(m, args, out):  # returns None: the output stays
    RUNNING.pop()


def make_mode():
    try:
        from torch.distributed.tensor.debug import CommDebugMode
    except ImportError:
        return None
    return CommDebugMode()


def rank_main(rank, world, port, steps):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Model()
    for fqn, m in model.named_modules():
        m.fqn = fqn or "<root>"
        if isinstance(m, nn.ModuleList):
            continue
        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave)
    x = torch.randn(4, DIM, requires_grad=True)
    commdebug = {}  # CommDebugMode's comm_module_counts, summed over its windows
    for _ in range(steps):
        RUNNING.clear()  # a recomputation may stop before its forward hooks run
        # One CommDebugMode window per step: its module tracker follows one
        # forward per window (a module called again in one window fails it).
        mode = make_mode()
        if mode is None:
            model(x).sum().backward()
            continue
        with mode:
            model(x).sum().backward()
        for fqn, sides in mode.comm_module_counts.items():
            for side in ("forward", "backward"):
                for k, v in sides.get(side, {}).items():
                    into = commdebug.setdefault(fqn, {}).setdefault(side, {})
                    into[str(k)] = into.get(str(k), 0) + v
    out = {"rank": rank, "pid": os.getpid(), "torch": torch.__version__, "calls": CALLS[0], "nodes": NODES,
           "module_comm_counts": {fqn: {side: dict(v) for side, v in sides.items() if v}
                                  for fqn, sides in COUNTS.items()}}
    if commdebug:
        out["commdebug"] = commdebug
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    dist.barrier()
    if int(torch.__version__.split(".")[0]) >= 2:
        os._exit(0)  # torch 2.6's gloo teardown may abort (see torch_gloo_workload.py)
    dist.destroy_process_group()


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sys.stdout.write(json.dumps({"mode": "backward_attribution", "pid": os.getpid(),
                                 "torch": torch.__version__}) + "\n")
    sys.stdout.flush()
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(2, port, steps), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
