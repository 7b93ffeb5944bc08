// SPDX-License-Identifier: Apache-2.0
// What backward attribution costs: the torch-autograd spec probes
// torch::autograd::impl::set_gradient_edge / rebase_history (each node forward
// makes, with its Python stack) and Engine::evaluate_function (each node
// backward runs, with its Python stack).  One python (Debian's, torch 1.13)
// runs forward and backward of a 4-block MLP (Linear, ReLU; 12 module calls,
// ~20 nodes a step) in a loop, in the SAME process: unprobed, under the
// context specs a backward record needs without it (torch-scopes,
// torch-modules), with torch-autograd added, and with torch-autograd counters
// only (the uprobes' own floor), and alone.  Rounds in turn; ratios against the
// unprobed run of their own round; the BPF programs' time per probed call.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "torch_loop.hpp"
#include "trace_session.hpp"

using namespace commdbg;

namespace {

constexpr const char* kTrainLoop = R"PY(
import sys, time, torch, torch.nn as nn
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))
m = nn.Sequential(*[Block() for _ in range(4)])
x = torch.ones(8, 16)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line.split()[1])
    t0 = time.perf_counter()
    for _ in range(n):
        m(x).sum().backward()
    print(time.perf_counter() - t0, flush=True)
)PY";

}  // namespace

int main(int argc, char** argv) {
    auto args = bench::bench_args(argc, argv, {{"steps", 1000, 10}, {"rounds", 5, 1}});
    const long n = args[0];
    const int rounds = static_cast<int>(args[1]);
    bench::TorchLoop py;
    if (!bench::start_or_skip(py, "bench_autograd", kTrainLoop, n, "does not import torch (apt install python3-torch)"))
        return 0;
    auto traced = bench::traced_specs;
    std::vector<bench::Mode> modes = {
        {"unprobed", std::nullopt, {}, {}, {}},
        {"torch-scopes + torch-modules", traced({"torch-scopes", "torch-modules"}, true), {}, {}, {}},
        {"... + torch-autograd", traced({"torch-scopes", "torch-modules", "torch-autograd"}, true), {}, {}, {}},
        {"... + torch-autograd, counters only", traced({"torch-scopes", "torch-modules", "torch-autograd"}, false),
         {}, {}, {}},
        {"torch-autograd alone", traced({"torch-autograd"}, true), {}, {}, {}}};
    if (auto m = bench::measure_modes(py, n, double(n), rounds, modes); !m) {
        std::fprintf(stderr, "bench_autograd: %s\n", m.error().c_str());
        return 1;
    }
    using bench::median;
    std::printf("4-block MLP forward+backward (python pid %d), %ld steps x %d rounds\n", py.pid(), n, rounds);
    for (const auto& m : modes) {
        auto q = bench::ratio_to_first(modes, m);
        std::printf("%-38s %8.0f ns per step  ratio %.2f of unprobed (rounds %.2f-%.2f)", m.what.c_str(),
                    median(m.ns), q.median, q.lo, q.hi);
        if (!m.bpf_ns.empty()) std::printf("  BPF %.0f ns per probed call", median(m.bpf_ns));
        std::printf("\n");
    }
    std::vector<double> added;
    for (int r = 0; r < rounds; ++r) added.push_back(modes[4].ns[r] - modes[0].ns[r]);
    std::printf("torch-autograd alone adds %+.0f ns per step (median of rounds)\n", median(added));
    return 0;
}
