// SPDX-License-Identifier: Apache-2.0
// What tracing a real job costs, against what a user would run instead:
// the 2-rank tensor-parallel job of tests/testprogs/tp_commdebug.py (torch
// 2.6 on CPU + gloo in the trixie root: 3 MLP blocks under ColwiseParallel /
// RowwiseParallel, forward, backward, SGD step), each rank timing its steps
// (--timed: the median of N after 3 untimed).  Per round, in turn: alone,
// with torch's CommDebugMode around each step (in-process), under `commdbg
// run --noise-level 2` with every ATen op probed (as before noise level 2
// left the trivial ones unprobed: --trace asks for every record), and as a
// user runs it (the trivial ops unprobed: output::is_trivial_op).
// Ratios against the round's alone run; medians and ranges over rounds.
// Usage (root, from the build tree): bench_tp [steps] [rounds] [trixie root]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"

namespace {

namespace fs = std::filesystem;
using commdbg::bench::median;

struct Mode {
    std::string what;
    std::string prefix;  // before the job's command: a commdbg run, or nothing
    bool commdebug = false;
    std::vector<double> step_s, ratio;
};

// The job's ranks' median step time (the slower rank's), or nullopt when it failed.
std::optional<double> run_job(const std::string& cmd) {
    FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r");
    if (!f) return std::nullopt;
    std::vector<double> ranks;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("step_s")) ranks.push_back(j["step_s"].get<double>());
    }
    int status = pclose(f);
    if (status != 0 || ranks.size() != 2) return std::nullopt;
    return *std::max_element(ranks.begin(), ranks.end());
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
    const std::string commdbg = (bin / "commdbg").string() + " run --noise-level 2 --json /tmp/bench_tp.json ";
    std::vector<Mode> modes = {
        {"alone", "", false, {}, {}},
        {"CommDebugMode in-process", "", true, {}, {}},
        {"commdbg --noise-level 2, every op probed", commdbg + "--trace /tmp/bench_tp.trace -- ", false, {}, {}},
        {"commdbg --noise-level 2 (trivial ops unprobed)", commdbg + "-- ", false, {}, {}},
    };
    for (int r = 0; r < rounds; ++r)
        for (Mode& m : modes) {
            auto s = run_job(m.prefix + job + (m.commdebug ? " --with-commdebug" : ""));
            if (!s) {
                std::fprintf(stderr, "bench_tp: the job failed under '%s'\n", m.what.c_str());
                return 1;
            }
            m.step_s.push_back(*s);
            m.ratio.push_back(*s / modes[0].step_s.back());
        }
    std::printf("2-rank tensor-parallel job (torch 2.6, gloo), %ld timed steps x %d rounds, step time (slower rank)\n",
                steps, rounds);
    for (const Mode& m : modes) {
        auto [lo, hi] = std::minmax_element(m.ratio.begin(), m.ratio.end());
        std::printf("%-44s %7.2f ms per step  ratio %.2f of alone (rounds %.2f-%.2f)\n", m.what.c_str(),
                    1e3 * median(m.step_s), median(m.ratio), *lo, *hi);
    }
    return 0;
}
