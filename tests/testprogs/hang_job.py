#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A 3-rank job that hangs, for `commdbg hang` (gloo on CPU: torch 1.13 and 2.x;
NCCL on one GPU: torch 2.x).

    hang_job.py [--backend gloo|nccl] MODE

torch.multiprocessing.spawn starts 3 ranks on 127.0.0.1; each runs steps of
load_batch() then step(), which all-reduces the batch.  At step 2 rank 2
does not reach the all-reduce, and ranks 0 and 1 wait in it (gloo's timeout
is 600 s: the test ends the job first):

  loader   rank 2 gets stuck in its data loader: load_batch() sleeps.
  spin     rank 2 spins in pure Python, holding the GIL: spin().
  atexit   rank 2 leaves its loop and, at interpreter teardown, blocks in an
           atexit handler: wait_at_exit().
  mismatch every rank issues step 2's all-reduce, rank 2 with twice the
           elements; then every rank waits in wait_after_mismatch().  With
           --backend nccl only: gloo aborts a rank whose sizes differ.
  op_mismatch  every rank issues step 2's all-reduce, rank 2 with
           ReduceOp.MAX, the others with SUM (gloo completes it: each rank
           reduces with its own op, the silent corruption); then every rank
           waits in wait_after_mismatch().
  root_mismatch  every rank issues step 2 as a broadcast (async: it never
           completes), rank 2 from root 1, the others from root 0; then
           every rank waits in wait_after_mismatch().

--backend nccl runs the 3 ranks on the one GPU there is (cuda:0) through the
real libnccl torch ships: NCCL refuses two ranks of a communicator on one
device of one host, so each rank gets its own NCCL_HOSTID and the ranks talk
over sockets on lo.  step() waits for the GPU, so a rank whose all-reduce
never completes blocks there, as a training step that reads its loss does.

Stdout, one write per line: the plan ({"mode", "pid", "world", "stuck_rank",
"hang_at", "numel" and "dtype" of the tensor each all-reduce reduces,
"reduce_ops": torch's c10d ReduceOp.RedOpType members, {value: name}}),
each rank's {"rank", "pid", "group": torch's name of its process group,
"op": the name of the ReduceOp its step-2 all-reduce reduces with,
"root": the root of its step-2 broadcast (root_mismatch)} once
its process group is up, and
{"stuck": RANK, "pid", "function"} just before the stuck rank blocks.
"""
import argparse
import atexit
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, STUCK, HANG_AT, STEPS, BATCH = 3, 2, 2, 4, 16
MODES = ("loader", "spin", "atexit", "mismatch", "op_mismatch", "root_mismatch")


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def load_batch(rank, step, mode, device):
    if rank == STUCK and step == HANG_AT and mode == "loader":
        say({"stuck": rank, "pid": os.getpid(), "function": "load_batch"})
        time.sleep(3600)
    numel = 2 * BATCH if rank == STUCK and step == HANG_AT and mode == "mismatch" else BATCH
    return torch.ones(numel, device=device) * (rank + step)


def spin():
    n = 0
    while True:
        n = (n + 1) % 1000003


def wait_after_mismatch(rank):
    if rank == STUCK:
        say({"stuck": rank, "pid": os.getpid(), "function": "wait_after_mismatch"})
    time.sleep(3600)


def wait_at_exit():
    say({"stuck": STUCK, "pid": os.getpid(), "function": "wait_at_exit"})
    time.sleep(3600)


def group_name():
    """torch's own name of the default group (1.13: _pg_names, 2.x: _world.pg_names)."""
    c10d = dist.distributed_c10d
    names = c10d._world.pg_names if hasattr(c10d, "_world") else c10d._pg_names
    return names[dist.group.WORLD]


def op_of(rank, mode):
    """The name of the ReduceOp rank's step-2 all-reduce reduces with."""
    return "MAX" if mode == "op_mismatch" and rank == STUCK else "SUM"


def root_of(rank):
    """The root rank's step-2 broadcast (root_mismatch) is from."""
    return 1 if rank == STUCK else 0


def step(batch, wait, op="SUM"):
    dist.all_reduce(batch, op=getattr(dist.ReduceOp, op))
    if wait and batch.is_cuda:
        torch.cuda.synchronize()
    return batch


def nccl_on_one_gpu(rank, job):
    """Makes this process rank `rank` of job `job` on the one GPU there is, for
    NCCL: NCCL refuses two ranks of a communicator on one device of one host,
    so each rank gets its own NCCL_HOSTID and the ranks talk over sockets on
    lo.  Returns the device (bench/bench_gpu_job.py uses it too)."""
    torch.cuda.set_device(0)
    os.environ.update({"NCCL_HOSTID": f"commdbg-{job}-rank{rank}", "NCCL_SOCKET_IFNAME": "lo",
                       "NCCL_IB_DISABLE": "1"})
    return "cuda:0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, mode, backend):
    device = nccl_on_one_gpu(rank, "hang") if backend == "nccl" else "cpu"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    say({"rank": rank, "pid": os.getpid(), "group": group_name(), "op": op_of(rank, mode), "root": root_of(rank)})
    for s in range(STEPS):
        if s == HANG_AT and mode == "root_mismatch":
            dist.broadcast(load_batch(rank, s, mode, device), src=root_of(rank), async_op=True)
            wait_after_mismatch(rank)
        if s == HANG_AT and mode in ("mismatch", "op_mismatch"):
            step(load_batch(rank, s, mode, device), wait=False, op=op_of(rank, mode))
            wait_after_mismatch(rank)
        if rank == STUCK and s == HANG_AT and mode == "spin":
            say({"stuck": rank, "pid": os.getpid(), "function": "spin"})
            spin()
        if rank == STUCK and s == HANG_AT and mode == "atexit":
            atexit.register(wait_at_exit)
            return
        step(load_batch(rank, s, mode, device), wait=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("mode", choices=MODES)
    args = ap.parse_args()
    port = free_port()
    say({"mode": args.mode, "pid": os.getpid(), "world": WORLD, "stuck_rank": STUCK, "hang_at": HANG_AT,
         "numel": BATCH, "dtype": str(torch.ones(BATCH).dtype).replace("torch.", ""),
         "reduce_ops": {int(v): n for n, v in dist.ReduceOp.RedOpType.__members__.items()}})
    mp.spawn(worker, args=(port, args.mode, args.backend), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
