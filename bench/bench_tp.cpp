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
// scopes were closed at their own exit), with only the collectives' and
// scopes' probes, with --counts-only, and under a
// commdbgd started before the job (its node counter with the default probes
// and with torch-c10d's collectives counted too, and --fsdp-checks); then the
// same for the FSDP2 version of the job (--fsdp), with `commdbg check` too.
// Ratios against the round's alone run; medians and ranges over rounds.
// Beside the step time, the job's CPU per step (each rank's process, every
// thread, user and kernel; tp_commdebug.py's cpu_s, summed over the ranks):
// a uprobe's trap and the BPF programs run in the calling thread, so this is
// what tracing costs the job's own threads, without the waits on the slower
// rank that spread a step's time over rounds on this VM.
// commdbg's own CPU (its --cost line): in all, setting processes up, and per
// record handled; commdbgd's: utime + stime over the job.
// Usage (root, from the build tree): bench_tp [steps] [rounds] [trixie root]
// BENCH_TP_MODES=key,... runs only those modes (alone always; keys printed by
// --help), BENCH_TP_JOBS=tp|fsdp only that job.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"
#include "earlier_specs.hpp"
#include "proc_cpu.hpp"
#include "test_proc.hpp"

namespace {

namespace fs = std::filesystem;
using commdbg::bench::cpu_seconds;
using commdbg::bench::median;
using commdbg::bench::every_record_function_spec;
using commdbg::bench::module_entry_at_get_tracing_state_spec;

struct Mode {
    std::string key;  // what BENCH_TP_MODES names it
    std::string what;
    std::string prefix;  // before the job's command: a commdbg run, or nothing
    bool commdebug = false;
    std::vector<std::string> daemon;  // a commdbgd to start before the job, or none
    std::vector<double> step_s, ratio;
    std::vector<double> job_cpu_s, cpu_ratio;           // the ranks' CPU per step, summed; over alone's
    std::vector<double> cpu_s, setup_s, per_record_us;  // commdbg's --cost line
    std::vector<double> daemon_cpu_s;                   // commdbgd's utime + stime over the job
};

Mode mode(std::string key, std::string what, std::string prefix, bool commdebug = false) {
    Mode m;
    m.key = std::move(key), m.what = std::move(what), m.prefix = std::move(prefix), m.commdebug = commdebug;
    return m;
}

Mode daemon_mode(std::string key, std::string what, std::vector<std::string> argv) {
    Mode m = mode(std::move(key), std::move(what), "");
    m.daemon = std::move(argv);
    return m;
}

struct JobRun {
    double step_s = 0;   // the ranks' median step time (the slower rank's)
    double job_cpu_s = 0;  // the ranks' median CPU per step (their processes, every thread), summed
    std::optional<std::array<double, 3>> cost;  // commdbg's CPU: all, set-ups, us per record
    std::optional<double> daemon_cpu_s;         // commdbgd's CPU over the job
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
        if (j.is_discarded() || !j.is_object() || !j.contains("step_s") || !j.contains("cpu_s")) continue;
        ranks.push_back(j["step_s"].get<double>());
        run.job_cpu_s += j["cpu_s"].get<double>();
    }
    int status = pclose(f);
    if (status != 0 || ranks.size() != 2) return std::nullopt;
    run.step_s = *std::max_element(ranks.begin(), ranks.end());
    return run;
}

// The job under a commdbgd started before it (ready once it says it is
// counting: its probes are placed and it watches for new processes) and
// stopped after it; with the daemon's CPU over the job.  nullopt: the daemon
// did not start (said) or the job failed.
std::optional<JobRun> run_under_daemon(const std::vector<std::string>& daemon, const std::string& cmd) {
    commdbg::testproc::Background d(daemon);
    if (d.wait_for_err_line("counting", 60).empty()) {
        std::fprintf(stderr, "bench_tp: commdbgd did not start: %s\n", d.wait(10).err.substr(0, 400).c_str());
        return std::nullopt;
    }
    const double cpu0 = cpu_seconds(d.pid());
    auto run = run_job(cmd);
    if (run) run->daemon_cpu_s = cpu_seconds(d.pid()) - cpu0;
    kill(d.pid(), SIGTERM);
    d.wait(60);
    return run;
}

// What runs the job: alone, CommDebugMode, commdbg at each noise level, every
// op probed, every RecordFunction probed (how torch-scopes worked before),
// module entries at getTracingState() (how torch-modules worked before),
// only the collectives and scopes (no ATen, module or autograd probe), counts
// only, commdbgd (its node counter, with c10d, with the FSDP checks);
// for the FSDP2 job also `commdbg check` (the lifecycle checks with Python
// stacks, as a user runs them on one job).
std::vector<Mode> modes_for(const fs::path& bin, const fs::path& src, bool fsdp) {
    const std::string commdbg = (bin / "commdbg").string();
    const std::string run = commdbg + " run --cost --json /tmp/bench_tp.json ";
    const std::string every_rf = "--probes nccl,torch-aten,torch-autograd,torch-c10d,torch-modules," +
                                 every_record_function_spec(src) + " ";
    const std::vector<std::string> commdbgd = {(bin / "commdbgd").string(), "--socket", "/tmp/bench_tp.sock",
                                               "--metrics-listen", ""};
    auto with = [](std::vector<std::string> v, std::initializer_list<std::string> more) {
        v.insert(v.end(), more);
        return v;
    };
    std::vector<Mode> modes = {
        mode("alone", "alone", ""),
        mode("cdm", "CommDebugMode in-process", "", true),
        mode("n0", "commdbg --noise-level 0", run + "--noise-level 0 -- "),
        mode("n1", "commdbg --noise-level 1", run + "--noise-level 1 -- "),
        mode("n2", "commdbg --noise-level 2", run + "--noise-level 2 -- "),
        mode("every-op", "commdbg --noise-level 2, every op probed",
             run + "--noise-level 2 --trace /tmp/bench_tp.trace -- "),
        mode("every-rf", "commdbg --noise-level 2, every RecordFunction", run + "--noise-level 2 " + every_rf + "-- "),
        mode("gts", "commdbg --noise-level 2, module entry at getTracingState()",
             run + "--noise-level 2 --probes nccl,torch-aten,torch-autograd,torch-c10d,torch-scopes," +
                 module_entry_at_get_tracing_state_spec(src) + " -- "),
        mode("c10d-scopes", "commdbg --probes nccl,torch-c10d,torch-scopes",
             run + "--noise-level 2 --probes nccl,torch-c10d,torch-scopes -- "),
        mode("counts", "commdbg --counts-only", run + "--counts-only -- "),
        daemon_mode("commdbgd", "commdbgd node counter (default probes)", commdbgd),
        daemon_mode("commdbgd-c10d", "commdbgd node counter --probes nccl,torch-c10d",
                    with(commdbgd, {"--probes", "nccl,torch-c10d"})),
        daemon_mode("commdbgd-fsdp", "commdbgd --fsdp-checks", with(commdbgd, {"--fsdp-checks"})),
    };
    if (fsdp) modes.push_back(mode("check", "commdbg check (FSDP lifecycle)", commdbg + " check --cost -- "));
    return modes;
}

// Only the modes `keys` names (comma-separated; empty: all), alone first always.
std::vector<Mode> select(std::vector<Mode> modes, const std::string& keys) {
    if (keys.empty()) return modes;
    std::vector<Mode> out;
    for (Mode& m : modes)
        if (m.key == "alone" || ("," + keys + ",").find("," + m.key + ",") != std::string::npos)
            out.push_back(std::move(m));
    return out;
}

// Rounds of every mode in turn; false (said) when the job failed.
bool run_rounds(std::vector<Mode>& modes, const std::string& job, int rounds) {
    for (int r = 0; r < rounds; ++r)
        for (Mode& m : modes) {
            const std::string cmd = m.prefix + job + (m.commdebug ? " --with-commdebug" : "");
            auto s = m.daemon.empty() ? run_job(cmd) : run_under_daemon(m.daemon, cmd);
            if (!s) {
                std::fprintf(stderr, "bench_tp: the job failed under '%s'\n", m.what.c_str());
                return false;
            }
            m.step_s.push_back(s->step_s);
            m.ratio.push_back(s->step_s / modes[0].step_s.back());
            m.job_cpu_s.push_back(s->job_cpu_s);
            m.cpu_ratio.push_back(s->job_cpu_s / modes[0].job_cpu_s.back());
            if (s->cost) {
                m.cpu_s.push_back((*s->cost)[0]);
                m.setup_s.push_back((*s->cost)[1]);
                m.per_record_us.push_back((*s->cost)[2]);
            }
            if (s->daemon_cpu_s) m.daemon_cpu_s.push_back(*s->daemon_cpu_s);
        }
    return true;
}

// Per mode: the median step, the median and range of its ratios to the
// round's alone run, and its best step over alone's best (noise on this VM
// only ever adds time, so the best rounds bound what the tracer itself adds);
// then the ranks' CPU per step, summed, and its ratio to alone's: what the
// job's own threads spent, traps and BPF programs included, without the
// waits on the other rank that make a step's time so noisy here.
void print_modes(const std::vector<Mode>& modes) {
    const double alone_best = *std::min_element(modes[0].step_s.begin(), modes[0].step_s.end());
    for (const Mode& m : modes) {
        auto [lo, hi] = std::minmax_element(m.ratio.begin(), m.ratio.end());
        auto [clo, chi] = std::minmax_element(m.cpu_ratio.begin(), m.cpu_ratio.end());
        const double best = *std::min_element(m.step_s.begin(), m.step_s.end());
        std::printf("%-46s %6.2f ms per step  ratio %.2f of alone (rounds %.2f-%.2f, best %.2f)", m.what.c_str(),
                    1e3 * median(m.step_s), median(m.ratio), *lo, *hi, best / alone_best);
        std::printf("  job CPU %.2f ms per step, %.3f of alone (rounds %.3f-%.3f)", 1e3 * median(m.job_cpu_s),
                    median(m.cpu_ratio), *clo, *chi);
        if (!m.cpu_s.empty())
            std::printf("  commdbg CPU %.2f s (set-ups %.2f s, %.1f us per record)", median(m.cpu_s),
                        median(m.setup_s), median(m.per_record_us));
        if (!m.daemon_cpu_s.empty()) std::printf("  commdbgd CPU %.2f s over the job", median(m.daemon_cpu_s));
        std::printf("\n");
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string root = "/var/cache/commdbg/trixie-root";
    const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
    const fs::path src = SOURCE_DIR;
    for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
            std::printf("BENCH_TP_MODES (comma-separated; alone always runs):");
            for (const Mode& m : modes_for(bin, src, true)) std::printf(" %s", m.key.c_str());
            std::printf("\nBENCH_TP_JOBS: tp, fsdp (default both)\n");
        }
    const auto args = commdbg::bench::bench_args(argc, argv, {{"steps", 30, 5}, {"rounds", 3, 1}}, "trixie-root", &root);
    const long steps = args[0];
    const int rounds = static_cast<int>(args[1]);
    const char* keys = std::getenv("BENCH_TP_MODES");
    const std::string jobs = std::getenv("BENCH_TP_JOBS") ? std::getenv("BENCH_TP_JOBS") : "tp,fsdp";
    if (geteuid() != 0 || !fs::exists(root + "/.commdbg-trixie-root")) {
        std::printf("bench_tp: skipped — needs root and the trixie root at %s (make trixie-root)\n", root.c_str());
        return 0;
    }
    const std::string job = "env USE_LIBUV=0 GLOO_SOCKET_IFNAME=lo " + (src / "tests/trixie_run.sh").string() +
                            " --bind " + (src / "tests/testprogs").string() + ":/opt/commdbg-testprogs " + root +
                            " python3 /opt/commdbg-testprogs/tp_commdebug.py --timed " + std::to_string(steps);
    for (const bool fsdp : {false, true}) {
        if (jobs.find(fsdp ? "fsdp" : "tp") == std::string::npos) continue;
        std::vector<Mode> modes = select(modes_for(bin, src, fsdp), keys ? keys : "");
        if (!run_rounds(modes, job + (fsdp ? " --fsdp" : ""), rounds)) return 1;
        std::printf("2-rank %s job (torch 2.6, gloo), %ld timed steps x %d rounds, step time (slower rank)\n",
                    fsdp ? "FSDP2 (fully_shard per block and the root)" : "tensor-parallel", steps, rounds);
        print_modes(modes);
    }
    return 0;
}
