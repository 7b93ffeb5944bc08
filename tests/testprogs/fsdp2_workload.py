#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real FSDP2 training job with one injected fault per mode, for commdbg's
FSDP checks (torch 2.6 on CPU + gloo, run in the trixie root).

    fsdp2_workload.py MODE [--seconds-before S] [--wait-file PATH]

2 ranks (torch.multiprocessing.spawn) on 127.0.0.1.  The model is a root
module with `layers` (4 identical Linear(16,16)+ReLU blocks) and a `head`
(Linear(16,4), so the root unit has parameters of its own); each block is
fully_shard'ed, then the root.  3 optimizer steps (SGD) of 2 micro-steps
each (gradient accumulation), opt.zero_grad() after each step.  Explicit
forward prefetch layers[i] -> layers[i+1], explicit backward prefetch
layers[i] -> layers[i-1].

MODES (deterministic, the same on every run):
  clean               set_requires_gradient_sync(False) on micro-step 0,
                      True on micro-step 1; no violation.
  bad_prefetch        clean plus the forward-prefetch edges layers.2 ->
                      layers.0 (a unit that already ran) and layers.1 ->
                      unused (a fully_shard'ed block forward never calls).
  pending_all_gather  clean plus layers[3].unshard(async_op=True) right
                      before each opt.step(), never waited for.
  no_sync             no set_requires_gradient_sync(False): gradients are
                      reduce-scattered on micro-step 0 too.
  bypassed_child      layers.1 has reshard_after_forward=False and
                      reshard_after_backward=False; from step 1 on the root
                      calls layers[1].forward(x) (no hooks of layers.1 run),
                      and its parameters still get gradients (reduced by the
                      root's post-backward callback).
  rank_divergence     rank 1 skips layers[2] in step 1, micro-step 0.  To
                      keep the collectives paired, rank 1 issues one dummy
                      dist.all_gather_into_tensor of layers.2's shard size
                      where layers.2's backward all-gather would have been
                      (right after layers.3's pre-backward).  Its forward
                      needs none: layers.1's prefetch of layers.2 still runs.
                      (Without it rank 1 makes one all-gather fewer and
                      gloo aborts at the next reduce-scatter.)  Chosen over
                      running the blocks as 0,2,1,3, which under explicit
                      prefetch would re-gather a resharded unit (one more).

"issued" per rank (all_gather, reduce_scatter; never all_reduce): clean and
rank_divergence 54, 15 (per micro-step 5 forward + 4 backward all-gathers,
5 reduce-scatters on the synced one); bad_prefetch 60, 15 (+1 for unused
per micro-step; layers.0's early gather replaces its backward one);
pending_all_gather 55, 15 (the next step consumes it in layers.3's forward,
the last one stays pending); no_sync 54, 30; bypassed_child 43, 15.

Stdout, one write per line: the plan first ({"mode", "pid", "world",
"steps", "micro_steps", "blocks", "python", "torch", "units", "expect"}),
then one line per rank at its end ({"rank", "pid", "issued", "micro_steps"}):
"issued" counts this rank's calls of the c10d collectives (the job's own
account), "micro_steps" the order in which units ran forward (module forward
pre-hooks) and backward (the first gradient of a unit's outputs).
--seconds-before S: each rank sleeps S seconds before init_process_group;
--wait-file PATH: each rank waits for PATH before its first step.
--pause S: each rank sleeps S seconds after every micro-step but a step's
last, so that a time window shorter than S ends inside every step.
FSDP2_WORKLOAD_PROFILE=1 runs the steps under torch.profiler (CPU) and prints
each rank's FSDP:: and Optimizer. labels, in order, as a JSON line on stderr.
"""
import argparse
import functools
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.nn as nn

WORLD, STEPS, MICRO_STEPS, BLOCKS, DIM = 2, 3, 2, 4, 16
ROOT = "<root>"
MODES = ("clean", "bad_prefetch", "pending_all_gather", "no_sync", "bypassed_child", "rank_divergence")
BYPASSED, SKIPPED = 1, 2  # block indices for bypassed_child and rank_divergence
DIVERGENCE_AT = (1, 0)  # (global_step, micro_step) where rank 1 skips SKIPPED


def emit(obj, stream=sys.stdout):
    # One write per line: two ranks share stdout.
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def import_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4/2.5
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def fsdp_module(name):
    try:
        return __import__(f"torch.distributed.fsdp._fully_shard.{name}", fromlist=[name])
    except ImportError:
        return __import__(f"torch.distributed._composable.fsdp.{name}", fromlist=[name])


def patch_torch_cpu():
    """The three patches FSDP2 needs on CPU + gloo in torch 2.6 (newer torch
    has them built in); nothing else in commdbg patches torch."""
    # 1. FSDP records and waits on events of its streams; torch.cpu.Stream has
    #    neither method (CPU work is synchronous, so no-ops are exact).  No
    #    event at all: FSDP then skips its waits, among them finalize_backward's
    #    torch.cuda wait on an all-gather nobody consumed.
    if not hasattr(torch.cpu.Stream, "record_event"):
        torch.cpu.Stream.record_event = lambda self, event=None: None
    if not hasattr(torch.cpu.Stream, "wait_event"):
        torch.cpu.Stream.wait_event = lambda self, event: None
    # 2. The all-gather copy-out writes the unsharded parameters in place and
    #    bumps their version counter, so backward after a re-all-gather fails
    #    ("modified by an inplace operation"); the data is what forward saw.
    group_mod = fsdp_module("_fsdp_param_group")
    copy_out = group_mod.foreach_all_gather_copy_out

    @functools.wraps(copy_out)
    def copy_out_keeping_versions(all_gather_result, fsdp_params, group):
        saved = [(t, t._version) for p in fsdp_params for t in getattr(p, "all_gather_outputs", [])]
        copy_out(all_gather_result, fsdp_params, group)
        for t, version in saved:
            torch._C._autograd._unsafe_set_version_counter(t, version)

    group_mod.foreach_all_gather_copy_out = copy_out_keeping_versions
    # 3. (in CollectiveAccount.reduce_scatter_tensor) gloo's
    #    reduce_scatter_tensor takes ReduceOp.AVG as SUM, silently.


class CollectiveAccount:
    """Counts this rank's c10d collective calls.  FSDP2 calls them as
    `dist.<name>` (torch.distributed, looked up at call time), so wrapping
    torch.distributed and distributed_c10d catches every call; any module
    that imported one by name is rewrapped too.  Each wrapper calls the
    original, so a call is counted once."""

    NAMES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
             "all_reduce": "all_reduce"}

    def __init__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self.dist = dist
        self.issued = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
        self.originals = {name: getattr(c10d, name) for name in self.NAMES}
        modules = [dist, c10d, fsdp_module("_fsdp_collectives"), fsdp_module("_fsdp_param_group")]
        for mod in modules:
            for name in self.NAMES:
                if getattr(mod, name, None) is self.originals[name]:
                    setattr(mod, name, self.wrapper(name))

    def wrapper(self, name):
        original, kind = self.originals[name], self.NAMES[name]
        special = getattr(self, name, None)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            self.issued[kind] += 1
            if special is not None:
                return special(original, *args, **kwargs)
            return original(*args, **kwargs)

        return counted

    def reduce_scatter_tensor(self, original, output, input, op=None, group=None, async_op=False):
        dist = self.dist
        if op is None:
            op = dist.ReduceOp.SUM
        if op != dist.ReduceOp.AVG or dist.get_backend(group) != "gloo":
            return original(output, input, op=op, group=group, async_op=async_op)
        # Patch 3: gloo sums where AVG was asked for (gradients 2x on 2 ranks).
        original(output, input, op=dist.ReduceOp.SUM, group=group, async_op=False)
        output.div_(dist.get_world_size(group))
        return None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self, with_unused):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, 4)
        if with_unused:
            self.unused = Block()  # fully_shard'ed, never called
        self.skip, self.bypass = set(), set()  # set per micro-step by the loop

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i in self.skip:
                continue
            # .forward() skips the module's hooks, FSDP's among them.
            x = layer.forward(x) if i in self.bypass else layer(x)
        return self.head(x)


class UnitTrace:
    """Forward and backward order of the units per micro-step, seen as the
    in-process diagnostics see it: a forward pre-hook per unit module, and a
    hook on the unit's output tensors for the first gradient (pre-backward).
    Registered after fully_shard, so they run after FSDP's own hooks."""

    def __init__(self, units):
        self.micro_steps = []
        self.current = None
        self.seen_backward = set()
        self.output_hooks = []  # hooks to run after the first gradient of a unit's output
        for fqn, module in units.items():
            module.register_forward_pre_hook(functools.partial(self.on_forward, fqn))
            module.register_forward_hook(functools.partial(self.on_output, fqn))

    def begin(self, global_step, micro_step):
        self.current = {"global_step": global_step, "micro_step": micro_step, "forward": [], "backward": []}
        self.micro_steps.append(self.current)
        self.seen_backward = set()

    def on_forward(self, fqn, module, args):
        self.current["forward"].append(fqn)

    def on_output(self, fqn, module, args, output):
        if not torch.is_grad_enabled():
            return
        for t in output if isinstance(output, (tuple, list)) else [output]:
            if torch.is_tensor(t) and t.requires_grad:
                t.register_hook(functools.partial(self.on_gradient, fqn))

    def on_gradient(self, fqn, grad):
        if fqn in self.seen_backward:
            return
        self.seen_backward.add(fqn)
        self.current["backward"].append(fqn)
        for hook in self.output_hooks:
            hook(fqn)


def unit_names(mode):
    names = [ROOT] + [f"layers.{i}" for i in range(BLOCKS)]
    return sorted(names + (["unused"] if mode == "bad_prefetch" else []))


def prefetch_edges_into(unit):
    """The configured prefetch edges aimed at `unit`, by phase: what the
    reference reports as "target did not execute" where `unit` does not run."""
    i = int(unit.split(".")[1])
    return {"forward": [[f"layers.{i - 1}", unit]], "backward": [[f"layers.{i + 1}", unit]]}


def expectations(mode):
    """The violations the in-process reference diagnostics would report.
    Top-level pairs hold in every micro-step; the other entries say where."""
    if mode == "bad_prefetch":
        return {"prefetch_order": [["layers.2", "layers.0"]], "prefetch_target_not_run": [["layers.1", "unused"]]}
    if mode == "pending_all_gather":
        return {"pending_all_gather": [{"unit": "layers.3", "global_step": g} for g in range(STEPS)]}
    if mode == "no_sync":
        reduced = [f"layers.{i}" for i in range(BLOCKS)] + [ROOT]
        return {"unsynced_reduce": [{"global_step": g, "micro_step": m, "units": reduced}
                                    for g in range(STEPS) for m in range(MICRO_STEPS - 1)]}
    if mode == "bypassed_child":
        unit = f"layers.{BYPASSED}"
        return {"bypassed_child": [{"unit": unit, "global_step": g,
                                    "prefetch_target_not_run": prefetch_edges_into(unit)} for g in range(1, STEPS)]}
    if mode == "rank_divergence":
        g, m = DIVERGENCE_AT
        unit = f"layers.{SKIPPED}"
        return {"rank_divergence": [{"global_step": g, "micro_step": m, "rank": 1, "skipped": unit,
                                     "compensation": "one dummy all_gather_into_tensor of the skipped unit's "
                                                     f"shard size after layers.{SKIPPED + 1}'s pre-backward",
                                     "prefetch_target_not_run": prefetch_edges_into(unit)}]}
    return {}


def build_model(mode, fully_shard):
    torch.manual_seed(0)  # FSDP2 does not broadcast: both ranks build the same model
    model = Net(with_unused=mode == "bad_prefetch")
    for i, block in enumerate(model.layers):
        bypassed = mode == "bypassed_child" and i == BYPASSED
        fully_shard(block, reshard_after_forward=not bypassed)
        if bypassed:
            # Its parameters must stay unsharded (plain tensors) for the
            # hook-less forward calls of later steps.
            block.set_reshard_after_backward(False)
    if mode == "bad_prefetch":
        fully_shard(model.unused)
    fully_shard(model)
    layers = model.layers
    for i in range(BLOCKS):
        forward = [layers[i + 1]] if i + 1 < BLOCKS else []
        if mode == "bad_prefetch" and i == 1:
            forward.append(model.unused)
        if mode == "bad_prefetch" and i == 2:
            forward.append(layers[0])
        if forward:
            layers[i].set_modules_to_forward_prefetch(forward)
        if i > 0:
            layers[i].set_modules_to_backward_prefetch([layers[i - 1]])
    return model


def wait_for_file(path):
    while path and not os.path.exists(path):
        time.sleep(0.05)


class DivergentRank:
    """rank_divergence on rank 1: skips SKIPPED at DIVERGENCE_AT and issues
    the all-gather its backward would have made, after layers.3's
    pre-backward (where layers.3's backward prefetch of it would be)."""

    def __init__(self, model, trace, dist):
        self.model, self.dist, self.armed = model, dist, False
        self.shard_numel = sum(p.to_local().numel() for p in model.layers[SKIPPED].parameters())
        trace.output_hooks.append(self.on_backward)

    def route(self, global_step, micro_step):
        self.armed = (global_step, micro_step) == DIVERGENCE_AT
        self.model.skip = {SKIPPED} if self.armed else set()

    def on_backward(self, fqn):
        if self.armed and fqn == f"layers.{SKIPPED + 1}":
            shard = torch.zeros(self.shard_numel)
            out = torch.empty(self.shard_numel * self.dist.get_world_size())
            self.dist.all_gather_into_tensor(out, shard)
            self.armed = False


def train(mode, model, trace, rank, dist, pause=0.0):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    divergent = DivergentRank(model, trace, dist) if mode == "rank_divergence" and rank == 1 else None
    gen = torch.Generator().manual_seed(1000 + rank)
    inputs = [[torch.randn(8, DIM, generator=gen) for _ in range(MICRO_STEPS)] for _ in range(STEPS)]
    for g in range(STEPS):
        for m in range(MICRO_STEPS):
            if mode != "no_sync":
                model.set_requires_gradient_sync(m == MICRO_STEPS - 1)
            if mode == "bypassed_child" and g >= 1:
                model.bypass = {BYPASSED}
            if divergent:
                divergent.route(g, m)
            trace.begin(g, m)
            model(inputs[g][m]).sum().backward()
            if pause and m < MICRO_STEPS - 1:
                time.sleep(pause)
        if mode == "pending_all_gather":
            model.layers[3].unshard(async_op=True)  # the handle is dropped: never waited for
        opt.step()
        opt.zero_grad()


def profiled_labels(prof):
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    return [e.name for e in events if e.name.startswith(("FSDP::", "Optimizer."))]


def rank_main(rank, mode, port, seconds_before, wait_file, pause):
    import torch.distributed as dist

    if seconds_before:
        time.sleep(seconds_before)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    account = CollectiveAccount()  # before the first collective
    patch_torch_cpu()
    model = build_model(mode, import_fully_shard())
    units = {ROOT: model, **{f"layers.{i}": b for i, b in enumerate(model.layers)}}
    if mode == "bad_prefetch":
        units["unused"] = model.unused
    trace = UnitTrace(units)
    wait_for_file(wait_file)
    if os.environ.get("FSDP2_WORKLOAD_PROFILE") == "1":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train(mode, model, trace, rank, dist, pause)
        labels = profiled_labels(prof)
        emit({"rank": rank, "labels": sorted(set(labels)), "sequence": labels}, sys.stderr)
    else:
        train(mode, model, trace, rank, dist, pause)
    emit({"rank": rank, "pid": os.getpid(), "issued": account.issued, "micro_steps": trace.micro_steps})
    dist.destroy_process_group()
    # Debian's torch 2.6 aborts in about one run of six while the interpreter
    # finalizes a rank after destroy_process_group (see torch_gloo_workload.py).
    sys.stdout.flush()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description="FSDP2 training job with an injected fault per mode")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--seconds-before", type=float, default=0.0)
    parser.add_argument("--wait-file", default="")
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    port = free_port()
    emit({"mode": args.mode, "pid": os.getpid(), "world": WORLD, "steps": STEPS, "micro_steps": MICRO_STEPS,
          "blocks": BLOCKS, "python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__,
          "units": unit_names(args.mode), "expect": expectations(args.mode)})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(args.mode, port, args.seconds_before, args.wait_file, args.pause), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
