// SPDX-License-Identifier: Apache-2.0
// PyTorch 2.6 (Debian trixie's python3-torch, CPU, gloo) in another root: the
// job runs chrooted in the trixie root (tests/trixie_root.sh, `make
// trixie-root`) through tests/trixie_run.sh, the profiler on the host, as with
// a containerised job.  commdbg must find the job's libtorch through
// /proc/PID/root.  Exact c10d counts per rank; the job survives; the helper
// leaves no mount behind.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// Lines of our /proc/self/mountinfo that name a path under `root`.
std::vector<std::string> mounts_under(const std::string& root) {
    std::vector<std::string> v;
    std::ifstream in("/proc/self/mountinfo");
    for (std::string line; std::getline(in, line);)
        if (line.find(" " + root + "/") != std::string::npos || line.find(" " + root + " ") != std::string::npos)
            v.push_back(line);
    return v;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& l : v) s += "\n  " + l;
    return s;
}

constexpr int kSteps = 3, kAllReduce = 3, kBroadcast = 2;  // and no all-gather

TEST(Torch26, GlooRanksInTrixieRootGiveExactC10dCounts) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--probes", "torch-c10d", "--json", tmp.path("out.json"), "--", kRunScript,
                  "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/torch_gloo_workload.py",
                  "train", std::to_string(kSteps), std::to_string(kAllReduce), "0", std::to_string(kBroadcast)},
                 kRootJobEnv, 240);
    EXPECT_TRUE(mounts_under(root).empty()) << "mounts left behind:" << joined(mounts_under(root));
    ASSERT_EQ(r.status, 0) << "the traced job failed\n" << r.err.substr(0, 4000);
    ASSERT_TRUE(std::filesystem::exists(tmp.path("out.json"))) << r.err;

    auto plan = workload_lines(r.out, "mode");
    ASSERT_EQ(plan.size(), 1u) << r.out.substr(0, 2000);
    // It ran in the root, not on the host's python 3.11 / torch 1.13.
    EXPECT_EQ(plan[0]["python"], "3.13") << plan[0].dump();
    EXPECT_EQ(plan[0]["torch"].get<std::string>().rfind("2.", 0), 0u) << plan[0].dump();
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << r.out.substr(0, 2000);

    auto dump = read_json(tmp.path("out.json"));
    auto ps = processes_of(dump);
    ASSERT_NE(process_by_pid(ps, plan[0]["pid"].get<int>()), nullptr) << "launcher not in the dump";
    for_each_rank_process(ps, ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        // The workload's own account first: it issued what the plan says.
        const int want_ar = rank["calls"]["all_reduce"].get<int>();
        const int want_bc = rank["calls"]["broadcast"].get<int>();
        EXPECT_EQ(want_ar, kSteps * kAllReduce);
        EXPECT_EQ(want_bc, kSteps * kBroadcast);
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        const auto& counts = p["comm_counts"];
        EXPECT_EQ(counts.value("c10d.all_reduce", 0), want_ar)
            << "comm_counts " << counts.dump() << " — libtorch inside the root not probed, or a call counted twice";
        EXPECT_EQ(counts.value("c10d.broadcast", 0), want_bc) << "comm_counts " << counts.dump();
    });
}

// The helper's mounts live in its own mount namespace: a job that fails or
// is killed leaves nothing mounted on the host, and its status comes back.
TEST(Torch26, TrixieRunPassesStatusAndLeavesNoMounts) {
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    auto failed = run({kRunScript, root, "python3", "-c", "import sys; sys.exit(3)"}, {}, 60);
    EXPECT_EQ(failed.status, 3) << failed.err;
    auto killed = run({kRunScript, root, "sh", "-c", "kill -9 $$"}, {}, 60);
    EXPECT_EQ(killed.status, 128 + 9) << killed.err;
    auto shm = run({kRunScript, root, "awk", "$5 == \"/proc\" || $5 == \"/sys\" || $5 == \"/dev/shm\" { n++ } END { print n }",
                    "/proc/self/mountinfo"},
                   {}, 60);
    EXPECT_EQ(shm.out, "3\n") << "inside: /proc, /sys and /dev/shm mounted\n" << shm.err;
    EXPECT_TRUE(mounts_under(root).empty()) << "mounts left behind:" << joined(mounts_under(root));
}

}  // namespace
}  // namespace commdbg::e2e
