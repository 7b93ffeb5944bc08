#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Collectives issued from known nn.Modules and record_function scopes, for
commdbg's framework-context tests (module records, module_comm_counts,
scopes).

    torch_module_workload.py train [STEPS] [--profiler]
        2 ranks (torch.multiprocessing.spawn), gloo on 127.0.0.1, STEPS
        (default 3) SGD steps of this model:

            <root>  Model            forward: 1 all_reduce of its own
              encoder  Encoder
                blocks  ModuleList   (not called: iterated)
                  0  Block
                    mixer  Mixer     forward: 1 all_reduce
                      proj  Linear
                    ffn  Linear
                  1  Block
                    mixer  Mixer     forward: 2 all_reduce; a full backward
                      proj  Linear   hook, a bound method of this Mixer,
                    ffn  Linear      issues 1 all_reduce in backward
              head  Linear

        Per step, in this order: opt.zero_grad(); the forward; backward;
        `with record_function("my_phase")` around 1 all_reduce; 1 all_reduce
        inside `with record_function("failing_phase")` that a ValueError
        then leaves (caught outside the scope); opt.step().  No other
        collective between init_process_group and destroy_process_group.
        Prints the plan as a JSON line (pid, python, torch), then one JSON
        line per rank with its pid and what it issued, counted by the
        workload itself as it issued it:
            "calls": {"all_reduce": n}
            "module_comm_counts": {fqn: {"forward": {"c10d.all_reduce": n},
                                         "backward": {...}}}
              every collective under every module whose forward was
              running; in backward, as CommDebugMode counts it: under the
              hooked module and those it was called from, and the module
              inside it whose backward began last; root "<root>"
            "per_step": the same for one step
            "scopes": {label: times entered}, "scope_collectives": {label:
              collectives issued directly inside it}
            "failing_phase_caught": how many ValueErrors left that scope
            "parameters": {fqn: {name: {"shape", "dtype"}}}: each module's
              own parameters, for modules that have any
        On torch 2.x a rank ends with os._exit(0) after destroy_process_group
        (torch_gloo_workload.py says why).

        --profiler: the steps run inside torch.profiler.profile(activities=
        [CPU]), so every dispatched op (and record_function's own enter op)
        runs inside a RecordFunction of scope FUNCTION or BACKWARD_FUNCTION
        around the user scopes, the same collectives and scopes as without
        it.  The plan and rank lines say "profiler": true, and a rank line
        "profiler_ops": how many aten:: events the profiler recorded (so the
        dispatcher's RecordFunctions are known to have been active).
"""
import contextlib
import json
import os
import socket
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

KIND = "c10d.all_reduce"


def emit(obj):
    # One write per line: two ranks share stdout.
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tally:
    """What the rank issued, counted where it issues it."""

    def __init__(self):
        self.fqn = {}          # id(module) -> its FQN ("<root>" for the root)
        self.running = []      # FQNs of the modules whose forward is running, outermost first
        self.counts = defaultdict(lambda: {"forward": defaultdict(int), "backward": defaultdict(int)})
        self.scopes = defaultdict(int)
        self.scope_collectives = defaultdict(int)
        self.calls = 0
        self.began = None      # the module whose backward began last (CommDebugMode's name)

    def name(self, model):
        for fqn, m in model.named_modules():
            self.fqn[id(m)] = fqn or "<root>"
            m.register_forward_hook(self.output_of)

    def output_of(self, module, args, out):
        # A module's backward begins when its output's gradient is ready
        # (CommDebugMode's full-backward pre-hook).  Modules returning one
        # tensor (Mixer and its proj) begin outermost first, the innermost
        # last, as CommDebugMode's nested output wrappers do; forward hooks
        # run innermost first, so the first one seen is the one named.
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return
        if not hasattr(out, "_tally_began"):
            out._tally_began = self.fqn[id(module)]
            out.register_hook(lambda g, fqn=out._tally_began: setattr(self, "began", fqn))

    def forward_of(self, module):
        tally = self

        class Running:
            def __enter__(self):
                tally.running.append(tally.fqn[id(module)])

            def __exit__(self, *exc):
                tally.running.pop()

        return Running()

    def all_reduce(self, t, backward_of=None):
        dist.all_reduce(t)
        self.calls += 1
        if backward_of is not None:
            # As CommDebugMode counts backward: the module and the modules it
            # was called from when its forward ran, and the module inside it
            # whose backward began last (a full backward hook runs after its
            # module's whole backward: proj's began after the Mixer's) with
            # those between.
            for fqn in backward_of.forward_chain:
                self.counts[fqn]["backward"][KIND] += 1
            own = self.fqn[id(backward_of)]
            if self.began and self.began.startswith(own + "."):
                parts = self.began.split(".")
                for n in range(len(own.split(".")) + 1, len(parts) + 1):
                    self.counts[".".join(parts[:n])]["backward"][KIND] += 1
        for fqn in self.running:
            self.counts[fqn]["forward"][KIND] += 1

    def snapshot(self):
        return {fqn: {side: dict(v) for side, v in sides.items() if v} for fqn, sides in self.counts.items()}


TALLY = Tally()


class Mixer(torch.nn.Module):
    def __init__(self, collectives):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.collectives = collectives

    def forward(self, x):
        with TALLY.forward_of(self):
            self.forward_chain = list(TALLY.running)
            y = self.proj(x)
            stat = y.detach().sum().reshape(1)
            for _ in range(self.collectives):
                TALLY.all_reduce(stat)
            return y

    def on_backward(self, module, grad_input, grad_output):
        # Runs on behalf of this module's gradients, from the autograd engine.
        TALLY.all_reduce(grad_output[0].detach().sum().reshape(1), backward_of=self)


class Block(torch.nn.Module):
    def __init__(self, collectives):
        super().__init__()
        self.mixer = Mixer(collectives)
        self.ffn = torch.nn.Linear(8, 8)

    def forward(self, x):
        with TALLY.forward_of(self):
            return self.ffn(torch.relu(self.mixer(x)))


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(1), Block(2)])

    def forward(self, x):
        with TALLY.forward_of(self):
            for b in self.blocks:
                x = b(x)
            return x


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        with TALLY.forward_of(self):
            h = self.encoder(x)
            TALLY.all_reduce(h.detach().sum().reshape(1))
            return self.head(h)


def scoped(label, fn):
    TALLY.scopes[label] += 1
    with record_function(label):
        before = TALLY.calls
        try:
            fn()
        finally:
            TALLY.scope_collectives[label] += TALLY.calls - before


def failing():
    TALLY.all_reduce(torch.ones(1))
    raise ValueError("unwinds through the record_function scope")


def step(model, opt, x):
    opt.zero_grad()
    TALLY.began = None  # a forward names no module's backward
    model(x).sum().backward()
    scoped("my_phase", lambda: TALLY.all_reduce(torch.ones(1)))
    try:
        scoped("failing_phase", failing)
    except ValueError:
        TALLY.scopes["failing_phase_caught"] += 1
    opt.step()


def profiled_ops(prof):
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def rank_main(rank, world, port, steps, profiler):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Model()
    TALLY.name(model)
    hooked = model.encoder.blocks[1].mixer
    hooked.register_full_backward_hook(hooked.on_backward)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    per_step = None
    if profiler:
        from torch.profiler import ProfilerActivity, profile

        session = profile(activities=[ProfilerActivity.CPU])
    else:
        session = contextlib.nullcontext()
    with session as prof:
        for i in range(steps):
            step(model, opt, x)
            if i == 0:
                per_step = TALLY.snapshot()
                # A tracer learns the code objects of the first step's frames
                # from its records (named within a few ms): the later steps
                # then run with commdbg's kernel side reading `self` only
                # where a module or a backward hook can be (events.h,
                # cd_py_codes), the first with every frame read.
                time.sleep(0.3)
    extra = {"profiler": True, "profiler_ops": profiled_ops(prof)} if profiler else {}
    caught = TALLY.scopes.pop("failing_phase_caught", 0)
    # Optimizer.step / zero_grad open record_function scopes of their own.
    scopes = dict(TALLY.scopes)
    scopes["Optimizer.step#SGD.step"] = steps
    scopes["Optimizer.zero_grad#SGD.zero_grad"] = steps
    # Each module's own parameters (recurse=False), as get_parameter_info() keys them.
    parameters = {}
    for fqn, m in model.named_modules():
        own = {name: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
               for name, t in m.named_parameters(recurse=False)}
        if own:
            parameters[fqn or "<root>"] = own
    emit({"rank": rank, "pid": os.getpid(), "steps": steps, "calls": {"all_reduce": TALLY.calls},
          "parameters": parameters,
          "module_comm_counts": TALLY.snapshot(), "per_step": per_step, "scopes": scopes,
          "scope_collectives": dict(TALLY.scope_collectives), "failing_phase_caught": caught, **extra})
    dist.destroy_process_group()
    if int(torch.__version__.split(".")[0]) >= 2:
        sys.stdout.flush()
        os._exit(0)


def train(argv):
    profiler = "--profiler" in argv
    argv = [a for a in argv if a != "--profiler"]
    steps = int(argv[0]) if argv else 3
    world = 2
    port = free_port()
    emit({"mode": "modules", "pid": os.getpid(), "world": world, "steps": steps, "profiler": profiler,
          "python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__})
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(world, port, steps, profiler), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "train"
    if mode == "train":
        sys.exit(train(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} train [STEPS] [--profiler]")
