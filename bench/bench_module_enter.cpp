// SPDX-License-Identifier: Apache-2.0
// What telling module calls apart costs: the torch-modules spec probes the
// call of torch::jit::tracer::getTracingState() in the dispatcher of
// torch._C._get_tracing_state(), which every nn.Module call makes first,
// with its Python stack.  One python (Debian's, torch 1.13) calls an
// nn.Sequential of 10 Linear(4, 4) (11 module calls a forward) in a loop, in
// the SAME process: unprobed, under torch-scopes, under torch-scopes and
// torch-modules, and under torch-scopes and torch-modules as it was before
// (getTracingState() itself, which torch 1.13 calls only from that binding:
// the same traps, at another place).  Rounds in turn; ratios against the
// unprobed run of their own round; the BPF programs' own time per probed
// call (bpf_enable_stats) beside them.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "earlier_specs.hpp"
#include "torch_loop.hpp"
#include "trace_session.hpp"

using namespace commdbg;

namespace {

constexpr int kModuleCallsPerForward = 11;
constexpr const char* kModuleLoop = R"PY(
import sys, time, torch, torch.nn as nn
m = nn.Sequential(*[nn.Linear(4, 4) for _ in range(10)])
x = torch.ones(2, 4)
print("ready", flush=True)
with torch.no_grad():
    for line in sys.stdin:
        n = int(line.split()[1])
        t0 = time.perf_counter()
        for _ in range(n):
            m(x)
        print(time.perf_counter() - t0, flush=True)
)PY";

}  // namespace

int main(int argc, char** argv) {
    auto args = bench::bench_args(argc, argv, {{"forwards", 5000, 10}, {"rounds", 5, 1}});
    const long n = args[0];
    const int rounds = static_cast<int>(args[1]);
    bench::TorchLoop py;
    if (!bench::start_or_skip(py, "bench_module_enter", kModuleLoop, n, "does not import torch (apt install python3-torch)")) return 0;
    auto traced = bench::traced_specs;
    std::vector<bench::Mode> modes = {
        {"unprobed", std::nullopt, {}, {}, {}},
        {"torch-scopes", traced({"torch-scopes"}, true), {}, {}, {}},
        {"torch-scopes + torch-modules", traced({"torch-scopes", "torch-modules"}, true), {}, {}, {}},
        {"both, module entry at getTracingState()",
         traced({"torch-scopes", bench::module_entry_at_get_tracing_state_spec(SOURCE_DIR)}, true), {}, {}, {}}};
    if (auto m = bench::measure_modes(py, n, double(n * kModuleCallsPerForward), rounds, modes); !m) {
        std::fprintf(stderr, "bench_module_enter: %s\n", m.error().c_str());
        return 1;
    }
    using bench::median;
    std::printf("nn.Sequential of 10 Linear(4, 4) under no_grad (python pid %d), %ld forwards x %d rounds\n", py.pid(),
                n, rounds);
    for (const auto& m : modes) {
        auto q = bench::ratio_to_first(modes, m);
        std::printf("%-38s %7.0f ns per module call  ratio %.2f of unprobed (rounds %.2f-%.2f)", m.what.c_str(),
                    median(m.ns), q.median, q.lo, q.hi);
        if (!m.bpf_ns.empty()) std::printf("  BPF %.0f ns per probed call", median(m.bpf_ns));
        std::printf("\n");
    }
    std::vector<double> added;
    for (int r = 0; r < rounds; ++r) added.push_back(modes[2].ns[r] - modes[1].ns[r]);
    std::printf("a module entry adds %+.0f ns per module call (median of rounds)\n", median(added));
    return 0;
}
