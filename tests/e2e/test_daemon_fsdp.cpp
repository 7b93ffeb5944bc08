// SPDX-License-Identifier: Apache-2.0
// commdbgd --fsdp-checks (issue 12, point 7): the FSDP lifecycle checks run
// all the time for every process on the node that loads libtorch, and
// /metrics counts what they find.  The real FSDP2 job (torch 2.6 on CPU +
// gloo in the trixie root, tests/testprogs/fsdp2_workload.py) runs under
// `commdbg check` while the daemon watches it too: for each mode the daemon's
// counts per rank equal what `commdbg check` found and what the workload's
// plan expects.  Windows: records are analysed and dropped once a window
// (a step cut by a window's end is not checked, never misreported), and a
// window that lost records to the budget is not counted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace daemon_fsdp {
namespace {

using namespace daemon_util;

std::vector<std::string> job(const std::string& mode, std::vector<std::string> extra = {}) {
    return concat({kRunScript, "--bind", kTestprogs + ":" + kInRoot, trixie_root(), "python3",
                   kInRoot + "/fsdp2_workload.py", mode},
                  extra);
}

using Findings = std::map<std::pair<std::string, std::string>, long>;  // (check, unit) -> count

// What `commdbg check --json` found in one process: violations and warnings.
Findings check_findings(const nlohmann::json& process) {
    Findings f;
    for (const char* kind : {"violations", "warnings"})
        for (const auto& v : process["fsdp"][kind]) ++f[{v["check"].get<std::string>(), v.value("unit", "")}];
    return f;
}

// The daemon's commdbg_fsdp_violations_total of one pid, rank_divergence
// apart (check lists it once for the job, not per process).
Findings daemon_findings(const std::vector<Sample>& samples, int pid, long* divergence = nullptr) {
    Findings f;
    for (const auto& s : samples) {
        if (s.name != "commdbg_fsdp_violations_total" || s.labels.at("pid") != std::to_string(pid)) continue;
        if (s.labels.at("check") == "rank_divergence") {
            if (divergence) *divergence += static_cast<long>(s.value);
            continue;
        }
        f[{s.labels.at("check"), s.labels.at("unit")}] += static_cast<long>(s.value);
    }
    return f;
}

// The value of `metric` for `pid`; -1 when it has no such series.
long pid_value(const std::vector<Sample>& samples, const std::string& metric, int pid) {
    for (const auto& s : samples)
        if (s.name == metric && s.labels.count("pid") && s.labels.at("pid") == std::to_string(pid))
            return static_cast<long>(s.value);
    return -1;
}

// Scrapes until every pid's steps_total is `steps` (a rank's last window
// ends at its job's exit, or within the grace after it); the last scrape.
std::vector<Sample> settled(int port, const std::vector<int>& pids, long steps, int timeout_s = 30) {
    auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    std::vector<Sample> s;
    do {
        s = scrape(port);
        bool all = true;
        for (int pid : pids) all = all && pid_value(s, "commdbg_fsdp_steps_total", pid) == steps;
        if (all) break;
        sleep_ms(200);
    } while (Clock::now() < deadline);
    return s;
}

// The plan's "expect", as counts per rank: each pair holds in every
// micro-step (3 steps x 2), pending_all_gather once a step.
Findings planned(const nlohmann::json& expect) {
    Findings f;
    for (const auto& [check, v] : expect.items()) {
        if (check == "pending_all_gather") {
            for (const auto& e : v) ++f[{check, e["unit"].get<std::string>()}];
        } else if (check == "prefetch_order" || check == "prefetch_target_not_run") {
            for (const auto& edge : v) f[{check, edge[0].get<std::string>()}] += 6;
        }
    }
    return f;
}

std::vector<int> rank_pids(const std::string& out) {
    std::vector<int> pids;
    for (const auto& r : workload_lines(out, "issued")) pids.push_back(r["pid"].get<int>());
    return pids;
}

TEST(DaemonFsdp, MetricsCountWhatCommdbgCheckFindsForEachMode) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--fsdp-checks"});
    // Always on: its session's records go out one by one, with no program at
    // every context switch of the host (bpf/lib/batch.h, on_switch).  The
    // session is up once its exec hook is linked (the node counter has none).
    for (int i = 0; i < 100 && count_links_of_programs({"on_exec"}) < 1; ++i) sleep_ms(100);
    ASSERT_GE(count_links_of_programs({"on_exec"}), 1) << "the --fsdp-checks session never started";
    EXPECT_EQ(count_links_of_programs({"on_switch"}), 0);
    for (const std::string mode : {"clean", "bad_prefetch", "pending_all_gather", "rank_divergence"}) {
        SCOPED_TRACE(mode);
        const std::string out = tmp.path(mode + ".json");
        auto r = run(concat({commdbg_bin(), "check", "--json", out, "--"}, job(mode)), kRootJobEnv, 300);
        ASSERT_EQ(r.status, mode == "clean" ? 0 : 3) << r.err.substr(0, 4000);
        auto plan = workload_lines(r.out, "mode");
        ASSERT_EQ(plan.size(), 1u) << r.out.substr(0, 2000);
        const auto pids = rank_pids(r.out);
        ASSERT_EQ(pids.size(), 2u) << r.out.substr(0, 2000);
        auto dump = read_json(out);
        auto ps = processes_of(dump);
        auto samples = settled(d.port(), pids, 3);
        long divergence = 0;
        for (int pid : pids) {
            SCOPED_TRACE("pid " + std::to_string(pid));
            const nlohmann::json* p = process_by_pid(ps, pid);
            ASSERT_NE(p, nullptr);
            ASSERT_TRUE(p->contains("fsdp")) << "commdbg check saw no lifecycle";
            EXPECT_EQ(pid_value(samples, "commdbg_fsdp_steps_total", pid), 3);
            EXPECT_EQ((*p)["fsdp"]["optimizer_steps"].get<long>(), 3);
            const Findings daemon = daemon_findings(samples, pid, &divergence);
            EXPECT_EQ(daemon, check_findings(*p)) << "the daemon and commdbg check disagree";
            if (mode != "rank_divergence") {
                EXPECT_EQ(daemon, planned(plan[0]["expect"])) << plan[0]["expect"].dump();
            }
            EXPECT_EQ(pid_value(samples, "commdbg_fsdp_unchecked_windows_total", pid), 0);
        }
        EXPECT_EQ(divergence, static_cast<long>(dump["cross_rank"].size())) << dump["cross_rank"].dump();
        EXPECT_EQ(divergence, mode == "rank_divergence" ? 1 : 0);
        // Both ranks exited in the middle of a window: the daemon goes on.
        ASSERT_TRUE(alive(d.pid())) << "commdbgd died after the " << mode << " job";
    }
    EXPECT_EQ(cli({"status", "--socket", d.socket()}).status, 0);
}

// A window ends every second and each rank pauses 1.5 s inside every step:
// a window's end cuts each of the 3 steps, so each rank is traced over 3
// windows at least; the records of each window are dropped, optimizer steps
// are still counted exactly once, and the cut steps give no finding.
TEST(DaemonFsdp, ShortWindowsDropRecordsAndCutStepsGiveNoFalseFinding) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--fsdp-checks", "--fsdp-window", "1"});
    auto r = run(job("clean", {"--pause", "1.5"}), kRootJobEnv, 300);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    const auto pids = rank_pids(r.out);
    ASSERT_EQ(pids.size(), 2u) << r.out.substr(0, 2000);
    auto samples = settled(d.port(), pids, 3);
    for (int pid : pids) {
        SCOPED_TRACE("pid " + std::to_string(pid));
        EXPECT_EQ(pid_value(samples, "commdbg_fsdp_steps_total", pid), 3);
        EXPECT_GE(pid_value(samples, "commdbg_fsdp_windows_total", pid), 3) << "each step spans a window's end";
        EXPECT_EQ(daemon_findings(samples, pid), Findings{});
    }
    long released = -1;
    for (const auto& s : samples)
        if (s.name == "commdbg_fsdp_records_released_total") released = static_cast<long>(s.value);
    EXPECT_GT(released, 0);
    ASSERT_TRUE(alive(d.pid()));
}

// Past --fsdp-max-records a window has lost records: it is not checked
// (counted as unchecked), so the lost records make no finding.
TEST(DaemonFsdp, WindowOverTheRecordBudgetIsUncheckedNotMisreported) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--fsdp-checks", "--fsdp-window", "1", "--fsdp-max-records", "100"});
    auto r = run(job("bad_prefetch"), kRootJobEnv, 300);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    const auto pids = rank_pids(r.out);
    ASSERT_EQ(pids.size(), 2u) << r.out.substr(0, 2000);
    // Its steps are not all in the records kept: wait for the windows.
    auto deadline = Clock::now() + std::chrono::seconds(30);
    std::vector<Sample> samples;
    do {
        samples = scrape(d.port());
        if (pid_value(samples, "commdbg_fsdp_unchecked_windows_total", pids[0]) > 0 &&
            pid_value(samples, "commdbg_fsdp_unchecked_windows_total", pids[1]) > 0)
            break;
        sleep_ms(200);
    } while (Clock::now() < deadline);
    for (int pid : pids) {
        SCOPED_TRACE("pid " + std::to_string(pid));
        EXPECT_GT(pid_value(samples, "commdbg_fsdp_unchecked_windows_total", pid), 0);
        EXPECT_EQ(daemon_findings(samples, pid), Findings{}) << "a window with lost records was counted";
    }
    double held = -1;
    for (const auto& s : samples)
        if (s.name == "commdbg_fsdp_window_records") held = s.value;
    EXPECT_GE(held, 0);
}

}  // namespace
}  // namespace daemon_fsdp
}  // namespace commdbg::e2e
