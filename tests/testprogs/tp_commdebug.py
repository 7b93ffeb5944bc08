#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A 2-rank tensor-parallel job with torch's own CommDebugMode running in
it, the ground truth commdbg's tensor and parameter records are compared
with (torch 2.6 on CPU + gloo, run in the trixie root).

    tp_commdebug.py [--steps N] [--fsdp [--exit-in-first-forward S]] [--timed N [--with-commdebug]]

2 ranks (torch.multiprocessing.spawn) on 127.0.0.1, a 1-D device mesh.
The model: `blocks`, three MLP blocks (up: Linear(16, 32), down:
Linear(32, 16)) under ColwiseParallel (up) / RowwiseParallel (down), then
`head` (Linear(16, 4), replicated: a plain parameter).  With --fsdp the
same MLP blocks are fully_shard'ed (FSDP2) instead, then the root.

Each step (forward, backward, SGD step) runs inside its own `with
CommDebugMode()` (torch 2.6's breaks on a module's second forward inside
one window), itself inside record_function("commdebug_step").  Per rank, one JSON line at its end:
  {"rank", "pid", "world", "steps": [per step:
     {"comm_counts": {op: n}, "module_counts": {fqn: {"forward": {op: n},
      "backward": {...}}}, "parameter_info": {fqn: {param: {"shape",
      "dtype", "local_shape"}}}, "sharding_info": {"fqn.param": str},
      "collectives": [{"op", "tensors": [{"shape", "dtype", "numel",
      "bytes"}]}]}]}
Module names are CommDebugMode's ("Global", "TPModel.blocks.0.up") and
ops its keys (str(op)); "collectives" lists, in issue order, each c10d
collective op's tensor arguments as the dispatcher saw them (what the job
passed to c10d).  After the steps the ranks meet in one dist.barrier().
With --timed N (bench_tp) each rank instead times N steps after 3 untimed
ones, alone or each in its own CommDebugMode, and prints {"rank", "pid",
"step_s"}: the median.
With --fsdp --exit-in-first-forward S each rank prints {"rank", "pid",
"parameter_info"} (each module's own parameters as torch had them before
fully_shard) at the start of the root's first forward, then sleeps S
seconds and exits: no block is ever all-gathered.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.nn as nn

WORLD, DIM, HIDDEN, BLOCKS = 2, 16, 32, 3
STEP_SCOPE = "commdebug_step"


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class TPModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(MLP() for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, 4)
        self.first_forward = None  # --exit-in-first-forward

    def forward(self, x):
        if self.first_forward:
            self.first_forward()
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def tensor_desc(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "numel": t.numel(),
            "bytes": t.numel() * t.element_size()}


def make_mode():
    from torch.distributed.tensor.debug import CommDebugMode

    class Recording(CommDebugMode):
        """CommDebugMode that also keeps each collective's input tensor."""

        def __init__(self):
            super().__init__()
            self.collectives = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace in ("_c10d_functional", "c10d_functional", "c10d") and args \
                    and isinstance(args[0], torch.Tensor) and not any(t.__name__ == "DTensor" for t in types):
                if "wait" not in func.__name__:
                    tensors = [a for a in args if isinstance(a, torch.Tensor)]
                    self.collectives.append({"op": str(func._overloadpacket),
                                             "tensors": [tensor_desc(t) for t in tensors]})
            return super().__torch_dispatch__(func, types, args, kwargs)

    return Recording()


def step_account(mode):
    from torch.distributed.tensor import DTensor

    params = {}
    for fqn, by_name in mode.get_parameter_info().items():
        params[fqn] = {}
        for name, p in by_name.items():
            local = p.to_local() if isinstance(p, DTensor) else p
            params[fqn][name] = {"shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                                 "local_shape": list(local.shape)}
    module_counts = {}
    for fqn, sides in mode.comm_module_counts.items():
        module_counts[fqn] = {side: {str(k): v for k, v in sides[side].items()}
                              for side in ("forward", "backward") if sides.get(side)}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from commdebug_script import summarize

    return {"script": summarize(mode), "comm_counts": {str(k): v for k, v in mode.get_comm_counts().items()},
            "module_counts": module_counts, "parameter_info": params,
            "sharding_info": {k: str(v) for k, v in mode.get_sharding_info().items()},
            "collectives": mode.collectives}


# --count-module-calls: the nn.Module calls of this rank, counted by a global
# forward pre-hook (which nn.Module._call_impl runs once per call), and the
# calls of torch._C._get_tracing_state() from Python (_call_impl's first
# call, looked up on torch._C at each call), counted by a wrapper.
MODULE_CALLS = None


def count_module_calls():
    global MODULE_CALLS
    MODULE_CALLS = [0, 0]

    def hook(module, args):
        MODULE_CALLS[0] += 1

    torch.nn.modules.module.register_module_forward_pre_hook(hook)
    binding = torch._C._get_tracing_state

    def counted():
        MODULE_CALLS[1] += 1
        return binding()

    torch._C._get_tracing_state = counted


def run_timed(rank, model, opt, x, timed, with_commdebug):
    """bench_tp: `timed` steps after 3 untimed, each alone or inside its own
    CommDebugMode; one line {"rank", "pid", "step_s": median step seconds,
    "cpu_s": median step CPU seconds of the whole process (all its threads,
    user and kernel: a uprobe's trap and BPF programs run in the calling
    thread and are charged to it)}."""
    import contextlib
    import statistics
    import time

    import torch.distributed as dist

    times, cpus = [], []
    for i in range(3 + timed):
        t0, c0 = time.perf_counter(), time.process_time()
        with make_mode() if with_commdebug else contextlib.nullcontext():
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        if i >= 3:
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    line = {"rank": rank, "pid": os.getpid(), "step_s": statistics.median(times), "cpu_s": statistics.median(cpus)}
    if MODULE_CALLS is not None:
        line["module_calls"], line["tracing_state_calls"] = MODULE_CALLS
    emit(line)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def own_parameters(model):
    """Each module's own parameters as its forward sees them, keyed as
    commdbg names modules (the root's: "<root>")."""
    out = {}
    for fqn, m in model.named_modules():
        params = {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch."), "local_shape": list(p.shape)}
                  for n, p in m.named_parameters(recurse=False)}
        if params:
            out[fqn or "<root>"] = params
    return out


def end_in_first_forward(rank, model, truth, seconds):
    """--exit-in-first-forward S: the root's first forward (after FSDP2's
    pre-hook has gathered the root's own parameters, before any block's)
    makes one op (a record under the root), prints the parameters taken
    before fully_shard, sleeps S seconds and ends the rank: no block is ever
    all-gathered, so FSDP2 never makes their unsharded parameters."""

    def first_forward():
        torch.ones(1).add_(1)
        emit({"rank": rank, "pid": os.getpid(), "parameter_info": truth})
        time.sleep(seconds)
        os._exit(0)

    model.first_forward = first_forward


def rank_main(rank, world, port, steps, fsdp, timed=0, with_commdebug=False, exit_in_forward=0.0, count_calls=False):
    if count_calls:
        count_module_calls()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = TPModel()
    if fsdp:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from fsdp2_workload import import_fully_shard, patch_torch_cpu

        patch_torch_cpu()
        fully_shard = import_fully_shard()
        truth = own_parameters(model)
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if exit_in_forward:
            end_in_first_forward(rank, model, truth, exit_in_forward)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {}
        for i in range(BLOCKS):
            plan[f"blocks.{i}.up"] = ColwiseParallel()
            plan[f"blocks.{i}.down"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, DIM)
    if timed:
        run_timed(rank, model, opt, x, timed, with_commdebug)
    out = []
    for _ in range(steps):
        mode = make_mode()
        # The scope marks the window for the tests: setup collectives
        # (parallelize_module's scatters and broadcasts) are outside it.
        with torch.autograd.profiler.record_function(STEP_SCOPE), mode:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        out.append(step_account(mode))
    emit({"rank": rank, "pid": os.getpid(), "world": dist.get_world_size(), "steps": out})
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch 2.6's gloo teardown may abort (see torch_gloo_workload.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--timed", type=int, default=0, help="bench_tp: time this many steps, no accounting")
    ap.add_argument("--with-commdebug", action="store_true", help="bench_tp: each timed step in CommDebugMode")
    ap.add_argument("--count-module-calls", action="store_true",
                    help="with --timed: print each rank's nn.Module calls (a global forward pre-hook counts them)")
    ap.add_argument("--exit-in-first-forward", type=float, default=0.0, metavar="S",
                    help="with --fsdp: print the parameters, sleep S s and exit before the first all-gather")
    a = ap.parse_args()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emit({"mode": "fsdp2" if a.fsdp else "tp", "pid": os.getpid(), "torch": torch.__version__})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(WORLD, port, a.steps, a.fsdp, a.timed, a.with_commdebug, a.exit_in_first_forward,
                           a.count_module_calls), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
