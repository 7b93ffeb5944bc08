#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a torch job pays per collective under commdbgd, against torch's own
flight recorder, on real NCCL (a GPU machine; --backend gloo runs the same
harness on CPU).

    bench_gpu_job.py --commdbgd PATH [--rounds N] [--iters N] [--numel N]

Each round runs the same 3-rank job once per configuration, in turn (so
that drift in the machine hits every configuration alike):

  alone          the job, nothing else
  commdbgd       commdbgd --probes nccl from before the job: node counter
                 and its flight recorder in the kernel
  commdbgd-nofr  commdbgd --no-flight-recorder: counts only
  torch-fr       torch's own flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE
                 and TORCH_FR_BUFFER_SIZE = 2000), what users set at launch
                 instead (NCCL only)

The job: each rank all-reduces a tensor of --numel float32 elements --iters
times, waiting for the GPU every 50 calls, after 200 calls of warm-up; the
time per call is the slowest rank's.  Small tensors make the per-call cost
(a uprobe on ncclAllReduce's entry and return, the recorder's write) as large
a share as it can be: a real step's all-reduces are larger, its share smaller.
Printed: per configuration the median time per call and, per round, its ratio
to `alone` in the same round (median and range).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The 3-rank NCCL set-up on one GPU and a free port, as the hang tests' job has them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "testprogs"))
from hang_job import free_port, nccl_on_one_gpu  # noqa: E402

WORLD, WARMUP, SYNC_EVERY = 3, 200, 50


def rank_main(rank, port, backend, iters, numel, out):
    import torch
    import torch.distributed as dist
    device = nccl_on_one_gpu(rank, "bench") if backend == "nccl" else "cpu"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    x = torch.ones(numel, device=device)

    def wait():
        if device != "cpu":
            torch.cuda.synchronize()

    for i in range(WARMUP):
        dist.all_reduce(x)
    wait()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(iters):
        dist.all_reduce(x)
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            wait()
    wait()
    per_call = (time.perf_counter() - t0) / iters
    with open(out, "a") as f:
        f.write(json.dumps({"rank": rank, "us": per_call * 1e6}) + "\n")
    dist.destroy_process_group()


def run_job(args, env):
    """One run of the job: the slowest rank's microseconds per call."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        cmd = [sys.executable, __file__, "--rank-job", str(free_port()), out.name, "--backend", args.backend,
               "--iters", str(args.iters), "--numel", str(args.numel)]
        subprocess.run(cmd, env={**os.environ, **env}, check=True, timeout=300)
        times = [json.loads(line)["us"] for line in open(out.name) if line.strip()]
    if len(times) != WORLD:
        raise SystemExit(f"bench_gpu_job: {len(times)} of {WORLD} ranks reported")
    return max(times)


class Daemon:
    def __init__(self, binary, extra):
        self.dir = tempfile.mkdtemp(prefix="commdbg-bench-")
        self.sock = os.path.join(self.dir, "d.sock")
        self.proc = subprocess.Popen([binary, "--socket", self.sock, "--metrics-listen", "127.0.0.1:0",
                                      "--probes", "nccl"] + extra,
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "log"), "w"))
        for _ in range(300):
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                raise SystemExit("bench_gpu_job: commdbgd exited: " + open(os.path.join(self.dir, "log")).read())
            time.sleep(0.05)
        raise SystemExit("bench_gpu_job: commdbgd did not open its socket in 15 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def configs(args):
    out = [("alone", None, {}), ("commdbgd", [], {}), ("commdbgd-nofr", ["--no-flight-recorder"], {})]
    if args.backend == "nccl":
        out.append(("torch-fr", None, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000"}))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commdbgd", help="the commdbgd binary")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--numel", type=int, default=1)
    ap.add_argument("--rank-job", nargs=2, metavar=("PORT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        import torch.multiprocessing as mp
        port, out = int(args.rank_job[0]), args.rank_job[1]
        mp.spawn(rank_main, args=(port, args.backend, args.iters, args.numel, out), nprocs=WORLD, join=True)
        return
    if not args.commdbgd:
        ap.error("--commdbgd PATH is required")
    times = {name: [] for name, _, _ in configs(args)}
    for r in range(args.rounds):
        for name, daemon_args, env in configs(args):
            d = Daemon(args.commdbgd, daemon_args) if daemon_args is not None else None
            try:
                us = run_job(args, env)
            finally:
                if d:
                    d.stop()
            times[name].append(us)
            print(f"round {r + 1} {name:14s} {us:8.2f} us per all_reduce", flush=True)
    print(f"\n{args.backend}, {WORLD} ranks, {args.numel} float32 per all_reduce, {args.iters} calls per run, "
          f"{args.rounds} rounds")
    print(f"{'configuration':14s} {'us/call':>9s} {'ratio to alone':>15s} {'range':>15s}")
    for name, ts in times.items():
        ratios = [t / a for t, a in zip(ts, times["alone"])]
        print(f"{name:14s} {statistics.median(ts):9.2f} {statistics.median(ratios):14.3f}x "
              f"{min(ratios):6.3f}-{max(ratios):.3f}x")


if __name__ == "__main__":
    main()
