// SPDX-License-Identifier: Apache-2.0
// What tracing a real job costs, against what a user would run instead:
// the 2-rank tensor-parallel job of tests/testprogs/tp_commdebug.py (torch
// 2.6 on CPU + gloo in the trixie root: 3 MLP blocks under ColwiseParallel /
// RowwiseParallel, forward, backward, SGD step), each rank timing its steps
// (--timed: the median of N after 3 untimed).  Per round, in turn: alone,
// with torch's CommDebugMode around each step (in-process), under `commdbg
// run` at noise levels 0, 1 and 2, at 2 with every ATen op probed (--trace
// asks for every record; below 3 the trivial ops are otherwise unprobed), at
// 2 with every at::RecordFunction probed (torch-scopes before torch 2.x's
// scopes were closed at their own exit), and with --counts-only; then the same for the FSDP2 version of the job
// (--fsdp), with `commdbg check` too.  Ratios against the round's alone run; medians and
// ranges over rounds.  commdbg's own CPU (its --cost line): in all, setting
// processes up, and per record handled, medians over rounds.
// Usage (root, from the build tree): bench_tp [steps] [rounds] [trixie root]
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"
#include "earlier_specs.hpp"

namespace {

namespace fs = std::filesystem;
using commdbg::bench::median;
using commdbg::bench::every_record_function_spec;
using commdbg::bench::module_entry_at_get_tracing_state_spec;

struct Mode {
    std::string what;
    std::string prefix;  // before the job's command: a commdbg run, or nothing
    bool commdebug = false;
    std::vector<double> step_s, ratio;
    std::vector<double> cpu_s, setup_s, per_record_us;  // commdbg's --cost line
};

Mode mode(std::string what, std::string prefix, bool commdebug = false) {
    Mode m;
    m.what = std::move(what), m.prefix = std::move(prefix), m.commdebug = commdebug;
    return m;
}

struct JobRun {
    double step_s = 0;  // the ranks' median step time (the slower rank's)
    std::optional<std::array<double, 3>> cost;  // commdbg's CPU: all, set-ups, us per record
};

// "commdbg: own CPU 0.93 s: 0.31 s in 270 process set-ups (...), 0.43 s handling 68242 records (6.2 us each)"
std::optional<std::array<double, 3>> cost_of(const std::string& line) {
    double all = 0, setup = 0, per = 0;
    const auto at = line.find("commdbg: own CPU ");
    if (at == std::string::npos || std::sscanf(line.c_str() + at, "commdbg: own CPU %lf s: %lf s", &all, &setup) != 2)
        return std::nullopt;
    const auto each = line.find(" us each)");
    const auto open = line.rfind('(', each);
    if (each == std::string::npos || open == std::string::npos || std::sscanf(line.c_str() + open, "(%lf", &per) != 1)
        return std::nullopt;
    return std::array<double, 3>{all, setup, per};
}

std::optional<JobRun> run_job(const std::string& cmd) {
    FILE* f = popen((cmd + " 2>&1").c_str(), "r");
    if (!f) return std::nullopt;
    std::vector<double> ranks;
    JobRun run;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        if (auto c = cost_of(line)) run.cost = c;
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("step_s")) ranks.push_back(j["step_s"].get<double>());
    }
    int status = pclose(f);
    if (status != 0 || ranks.size() != 2) return std::nullopt;
    run.step_s = *std::max_element(ranks.begin(), ranks.end());
    return run;
}

// What runs the job: alone, CommDebugMode, commdbg at each noise level, every
// op probed, every RecordFunction probed (how torch-scopes worked before),
// module entries at getTracingState() (how torch-modules worked before),
// counts only; for the FSDP2 job also `commdbg check` (the lifecycle checks,
// what commdbgd --fsdp-checks runs per window).
std::vector<Mode> modes_for(const std::string& commdbg, const fs::path& src, bool fsdp) {
    const std::string run = commdbg + " run --cost --json /tmp/bench_tp.json ";
    const std::string every_rf = "--probes nccl,torch-aten,torch-autograd,torch-c10d,torch-modules," +
                                 every_record_function_spec(src) + " ";
    std::vector<Mode> modes = {
        mode("alone", ""),
        mode("CommDebugMode in-process", "", true),
        mode("commdbg --noise-level 0", run + "--noise-level 0 -- "),
        mode("commdbg --noise-level 1", run + "--noise-level 1 -- "),
        mode("commdbg --noise-level 2", run + "--noise-level 2 -- "),
        mode("commdbg --noise-level 2, every op probed", run + "--noise-level 2 --trace /tmp/bench_tp.trace -- "),
        mode("commdbg --noise-level 2, every RecordFunction", run + "--noise-level 2 " + every_rf + "-- "),
        mode("commdbg --noise-level 2, module entry at getTracingState()",
             run + "--noise-level 2 --probes nccl,torch-aten,torch-autograd,torch-c10d,torch-scopes," +
                 module_entry_at_get_tracing_state_spec(src) + " -- "),
        mode("commdbg --counts-only", run + "--counts-only -- "),
    };
    if (fsdp) modes.push_back(mode("commdbg check (FSDP lifecycle)", commdbg + " check --cost -- "));
    return modes;
}

// Rounds of every mode in turn; false (said) when the job failed.
bool run_rounds(std::vector<Mode>& modes, const std::string& job, int rounds) {
    for (int r = 0; r < rounds; ++r)
        for (Mode& m : modes) {
            auto s = run_job(m.prefix + job + (m.commdebug ? " --with-commdebug" : ""));
            if (!s) {
                std::fprintf(stderr, "bench_tp: the job failed under '%s'\n", m.what.c_str());
                return false;
            }
            m.step_s.push_back(s->step_s);
            m.ratio.push_back(s->step_s / modes[0].step_s.back());
            if (s->cost) {
                m.cpu_s.push_back((*s->cost)[0]);
                m.setup_s.push_back((*s->cost)[1]);
                m.per_record_us.push_back((*s->cost)[2]);
            }
        }
    return true;
}

void print_modes(const std::vector<Mode>& modes) {
    for (const Mode& m : modes) {
        auto [lo, hi] = std::minmax_element(m.ratio.begin(), m.ratio.end());
        std::printf("%-46s %6.2f ms per step  ratio %.2f of alone (rounds %.2f-%.2f)", m.what.c_str(),
                    1e3 * median(m.step_s), median(m.ratio), *lo, *hi);
        if (!m.cpu_s.empty())
            std::printf("  commdbg CPU %.2f s (set-ups %.2f s, %.1f us per record)", median(m.cpu_s),
                        median(m.setup_s), median(m.per_record_us));
        std::printf("\n");
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string root = "/var/cache/commdbg/trixie-root";
    const auto args = commdbg::bench::bench_args(argc, argv, {{"steps", 30, 5}, {"rounds", 3, 1}}, "trixie-root", &root);
    const long steps = args[0];
    const int rounds = static_cast<int>(args[1]);
    const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
    const fs::path src = SOURCE_DIR;
    if (geteuid() != 0 || !fs::exists(root + "/.commdbg-trixie-root")) {
        std::printf("bench_tp: skipped — needs root and the trixie root at %s (make trixie-root)\n", root.c_str());
        return 0;
    }
    const std::string job = "env USE_LIBUV=0 GLOO_SOCKET_IFNAME=lo " + (src / "tests/trixie_run.sh").string() +
                            " --bind " + (src / "tests/testprogs").string() + ":/opt/commdbg-testprogs " + root +
                            " python3 /opt/commdbg-testprogs/tp_commdebug.py --timed " + std::to_string(steps);
    const std::string commdbg = (bin / "commdbg").string();
    for (const bool fsdp : {false, true}) {
        std::vector<Mode> modes = modes_for(commdbg, src, fsdp);
        if (!run_rounds(modes, job + (fsdp ? " --fsdp" : ""), rounds)) return 1;
        std::printf("2-rank %s job (torch 2.6, gloo), %ld timed steps x %d rounds, step time (slower rank)\n",
                    fsdp ? "FSDP2 (fully_shard per block and the root)" : "tensor-parallel", steps, rounds);
        print_modes(modes);
    }
    return 0;
}
