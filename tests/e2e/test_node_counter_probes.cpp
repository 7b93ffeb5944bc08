// SPDX-License-Identifier: Apache-2.0
// commdbgd --no-count-errors: the node counter puts entry probes alone on the
// collectives (each call traps once, not twice).  Counts stay exact, errors
// go uncounted, and communicators keep their ids, rank and size: their
// init/split/destroy calls keep the return probes that name them.
#include <regex>

#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace node_counter_probes {
namespace {

using namespace daemon_util;

const std::vector<std::pair<std::string, int>> kCalls = {{"all_reduce", 9}, {"broadcast", 4}, {"send", 2}};

TEST(NodeCounterProbes, NoCountErrorsCountsCallsExactlyWithEntryProbesOnly) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--no-count-errors", "--series-ttl", "60"});
    // No communicator: every call fails in the stub, and none may count as an error.
    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kCalls)}, nccl_env(false));
    ASSERT_STALLED(w);
    const auto want = expected_map(kCalls, "nccl.");
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), want), want);
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kCalls)), expected_map(kCalls));
    long errors = 0;
    for (const auto& [k, v] : sum_by_collective(scrape(d.port()), "commdbg_collective_errors_total", w.pid()))
        errors += v;
    EXPECT_EQ(errors, 0) << "a collective's return was probed";
    auto r = w.finish();
    ASSERT_EQ(r.status, 0) << r.err;
    auto rep = workload_report(r.out);
    ASSERT_TRUE(rep.is_object()) << r.out;
    EXPECT_EQ(rep["errors"].get<long>(), total_of(kCalls)) << "the stub should reject calls on no communicator";
}

TEST(NodeCounterProbes, NoCountErrorsStillNamesCommunicators) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--no-count-errors", "--series-ttl", "60"});
    auto h = run({testprog("nccl_workload"), "--no-nccl", "--init-seed", "5", "--print-id-hash"}, nccl_env(false));
    ASSERT_EQ(h.status, 0) << h.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(h.out, m, std::regex("id_hash=(0x[0-9a-f]{16})"))) << h.out;
    const std::string id_hash = m[1];
    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kCalls), "--init-seed", "5", "--nranks",
                       "4", "--rank", "1"},
                      nccl_env(false));
    ASSERT_STALLED(w);
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kCalls)), expected_map(kCalls));
    size_t series = 0;
    for (const auto& s : scrape(d.port())) {
        if (s.name != "commdbg_collective_calls_total" || s.labels.at("pid") != std::to_string(w.pid())) continue;
        ++series;
        EXPECT_EQ(s.labels.at("comm"), id_hash) << s.labels.at("collective");
        EXPECT_EQ(s.labels.at("rank"), "1");
        EXPECT_EQ(s.labels.at("nranks"), "4");
    }
    EXPECT_GT(series, 0u);
}

}  // namespace
}  // namespace node_counter_probes
}  // namespace commdbg::e2e
