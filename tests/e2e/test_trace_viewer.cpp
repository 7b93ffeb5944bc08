// SPDX-License-Identifier: Apache-2.0
// Acceptance: the --trace file of a real traced run opens in Perfetto (its own
// trace processor, the engine of the Perfetto UI) and Perfetto shows what
// commdbg recorded: one slice per retained record on the thread that made the
// call, with the collective's args, under the process's name.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "e2e_util.hpp"
#include "perfetto_check.hpp"

namespace commdbg::e2e {
namespace {

size_t count_records(const nlohmann::json& records) {
    size_t n = 0;
    for (const auto& r : records) n += 1 + (r.contains("children") ? count_records(r["children"]) : 0);
    return n;
}

class TraceInPerfetto : public ::testing::TestWithParam<bool> {};

TEST_P(TraceInPerfetto, RunTraceShowsEveryRecordOnItsThreadWithItsArgs) {
    REQUIRE_BPF();
    REQUIRE_PERFETTO();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    TempDir tmp;
    const std::vector<std::pair<std::string, int>> pattern = {
        {"all_reduce", 40}, {"all_gather", 20}, {"reduce_scatter", 10}, {"broadcast", 6}};
    std::vector<std::string> argv = {commdbg_bin(), "run", "--trace", tmp.path("out.trace.json"), "--json",
                                     tmp.path("out.json"), "--table", "/dev/null", "--",
                                     testprog("nccl_workload"), "--calls", pattern_arg(pattern), "--threads", "3"};
    // Real NCCL gets a NULL comm and rejects each call at once: still a call.
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv, nccl_env(real));
    ASSERT_EQ(r.status, 0) << r.err;
    auto dump = read_json(tmp.path("out.json"));
    auto trace = read_json(tmp.path("out.trace.json"));

    auto loaded = perfetto_check::load_in_perfetto(tmp.path("out.trace.json"));
    auto diffs = perfetto_check::compare_with_file(loaded, trace);
    EXPECT_TRUE(diffs.empty()) << "Perfetto " << loaded.perfetto_version << ":\n" << perfetto_check::lines(diffs);

    // One slice per record the dump retained, per collective kind as counted.
    EXPECT_EQ(loaded.slices.size(), count_records(dump["records"]));
    std::map<std::string, int> per_kind;
    std::set<uint64_t> tids;
    const int pid = dump["process"]["pid"].get<int>();
    for (const auto& s : loaded.slices) {
        EXPECT_EQ(s.pid, static_cast<uint64_t>(pid)) << s.name;
        if (!s.collective.empty()) ++per_kind["nccl." + s.collective];
        tids.insert(s.tid);
    }
    for (const auto& [kind, n] : pattern) {
        EXPECT_EQ(per_kind["nccl." + kind], n) << kind;
        EXPECT_EQ(dump["comm_counts"]["nccl." + kind].get<int>(), n) << kind;
    }
    // The three calling threads have tracks of their own.
    std::set<uint64_t> dump_tids;
    for (const auto& t : dump["threads"]) dump_tids.insert(t.get<uint64_t>());
    for (uint64_t t : tids) EXPECT_TRUE(dump_tids.count(t)) << "tid " << t;
    EXPECT_GE(tids.size(), 3u);
    // The process track is named after the command and pid.
    ASSERT_TRUE(loaded.process_names.count(pid));
    EXPECT_NE(loaded.process_names[pid].find("nccl_workload"), std::string::npos) << loaded.process_names[pid];
    EXPECT_NE(loaded.process_names[pid].find("(" + std::to_string(pid) + ")"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, TraceInPerfetto, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

}  // namespace
}  // namespace commdbg::e2e
