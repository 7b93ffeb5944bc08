// SPDX-License-Identifier: Apache-2.0
// What a c10d record's tensors cost: dist.all_reduce on one float tensor
// (a 1-rank gloo group, torch on this host) in the SAME python, unprobed,
// under the torch-c10d spec with records, and with records that also carry
// the tensors and the group (the kernel reading each TensorImpl at entry).
// The machine's speed drifts, so the three are measured in turn, round after
// round, and each ratio is taken against the unprobed run of its own round.
// The kernel's own time per probed call (bpf_enable_stats: every program's
// run time, tail calls included in the program that made them) is exact
// where the call's time is noisy (gloo wakes threads).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "torch_loop.hpp"
#include "trace_session.hpp"

using namespace commdbg;

namespace {

constexpr const char* kC10dLoop = R"PY(
import os, socket, sys, time, torch
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(8)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line.split()[1])
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    print(time.perf_counter() - t0, flush=True)
)PY";

}  // namespace

int main(int argc, char** argv) {
    auto args = bench::bench_args(argc, argv, {{"calls", 20000, 100}, {"rounds", 5, 1}});
    const long n = args[0];
    const int rounds = static_cast<int>(args[1]);
    bench::TorchLoop py;
    if (!bench::start_or_skip(py, "bench_c10d", kC10dLoop, n, "cannot run a gloo group (Debian: apt install python3-torch)")) return 0;
    auto traced = [](bool tensors) {
        session::SessionOptions so;
        so.probes = {"torch-c10d"};
        so.tensors = tensors;
        so.py_stack = python::PyStackMode::Off;  // the tensors' cost alone
        return so;
    };
    std::vector<bench::Mode> modes = {{"unprobed", std::nullopt, {}, {}, {}},
                                      {"torch-c10d records, no tensors", traced(false), {}, {}, {}},
                                      {"torch-c10d records + tensors", traced(true), {}, {}, {}}};
    if (auto m = bench::measure_modes(py, n, double(n), rounds, modes); !m) {
        std::fprintf(stderr, "bench_c10d: %s\n", m.error().c_str());
        return 1;
    }
    using bench::median;
    std::printf("dist.all_reduce on 8 floats, 1-rank gloo group (python pid %d), %ld calls x %d rounds\n", py.pid(), n,
                rounds);
    for (const auto& m : modes) {
        auto q = bench::ratio_to_first(modes, m);
        std::printf("%-34s %9.0f ns/call  ratio %.2f of unprobed (rounds %.2f-%.2f)\n", m.what.c_str(), median(m.ns),
                    q.median, q.lo, q.hi);
    }
    std::printf("the tracer's own CPU per call (decode, model, polling): %.0f ns without tensors, %.0f ns with\n",
                median(modes[1].cpu_ns), median(modes[2].cpu_ns));
    if (modes[1].bpf_ns.size() == size_t(rounds) && modes[2].bpf_ns.size() == size_t(rounds)) {
        std::printf("BPF programs per probed call: %.0f ns without tensors, %.0f ns with (%+.0f ns; medians)\n",
                    median(modes[1].bpf_ns), median(modes[2].bpf_ns),
                    median(modes[2].bpf_ns) - median(modes[1].bpf_ns));
    } else {
        std::printf("BPF programs per probed call: not measured (bpf_enable_stats refused, or no runs counted)\n");
    }
    std::vector<double> added;
    for (int r = 0; r < rounds; ++r) added.push_back(modes[2].ns[r] - modes[1].ns[r]);
    auto [lo, hi] = std::minmax_element(added.begin(), added.end());
    std::printf("tensors and group read per c10d record, whole call: %+.0f ns median (rounds %+.0f to %+.0f)\n",
                median(added), *lo, *hi);
    return 0;
}
