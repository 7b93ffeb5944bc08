// SPDX-License-Identifier: Apache-2.0
// commdbg hang with commdbgd running from before the job: the daemon's exact
// counts per communicator say which rank is behind, and at which collective.
// 3 ranks of one NCCL communicator (the in-tree stub, one unique id): rank 2
// issues one all-reduce fewer, then every rank waits (blocked writing its
// report, as StalledWorkload holds it).
#include "daemon_util.hpp"

#include <regex>

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

TEST(HangDaemon, ARankOneCollectiveShortIsNamedWithTheNumberItNeverIssued) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    auto h = run({testprog("nccl_workload"), "--init-seed", "7", "--print-id-hash", "--calls", "all_reduce=0"});
    ASSERT_EQ(h.status, 0) << h.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(h.out, m, std::regex("id_hash=(0x[0-9a-f]{16})"))) << h.out;
    const std::string id_hash = m[1];

    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls - 1};
    CommRanks ranks = start_comm_ranks(calls);
    const std::vector<int>& pids = ranks.pids;
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    auto out = tmp.path("hang.json");
    auto r = run({commdbg_bin(), "hang", "--socket", d.socket(), "--json", out, std::to_string(pids[0]),
                  std::to_string(pids[1]), std::to_string(pids[2])});
    ASSERT_EQ(r.status, 3) << r.out << r.err;
    const json report = read_json(out);
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "missing_ranks") << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_EQ(v["comm_id"], id_hash) << v.dump();
    EXPECT_EQ(v["seq"], kCalls) << v.dump();
    EXPECT_NE(r.out.find("pid " + std::to_string(pids[2]) + " never issued collective #" + std::to_string(kCalls) +
                         " of communicator " + id_hash),
              std::string::npos)
        << r.out;
    // Each rank's own count, as the daemon has it, in the report.
    for (int i = 0; i < 3; ++i) {
        const json& rank = report["ranks"][i];
        ASSERT_EQ(rank["pid"], pids[i]);
        ASSERT_EQ(rank["communicators"].size(), 1u) << rank.dump();
        EXPECT_EQ(rank["communicators"][0]["rank"], i);
        EXPECT_EQ(rank["communicators"][0]["issued"], i == 2 ? kCalls - 1 : kCalls);
    }
    // The ranks are as they were: blocked, never stopped.
    for (int pid : pids) EXPECT_EQ(proc_state(pid), 'S') << pid;
}

// The flight recorder in the kernel keeps each communicator's last
// collectives: rank 2's last all-reduce passes another count, and hang names
// that collective's number with both signatures.
TEST(HangDaemon, ARankWhoseLastCollectiveDiffersIsAMismatchWithBothSignatures) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls};
    CommRanks ranks = start_comm_ranks(calls, {{}, {}, {"--last-count", "512"}});
    const std::vector<int>& pids = ranks.pids;
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    auto out = tmp.path("hang.json");
    auto r = run({commdbg_bin(), "hang", "--socket", d.socket(), "--json", out, std::to_string(pids[0]),
                  std::to_string(pids[1]), std::to_string(pids[2])});
    ASSERT_EQ(r.status, 3) << r.out << r.err;
    const json v = read_json(out)["verdict"];
    EXPECT_EQ(v["kind"], "collective_mismatch") << v.dump();
    EXPECT_EQ(v["seq"], kCalls) << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_EQ(v["signatures"], json::parse("[{\"signature\": \"all_reduce count 1024 float32\", \"pids\": [" +
                                           std::to_string(pids[0]) + ", " + std::to_string(pids[1]) +
                                           "]}, {\"signature\": \"all_reduce count 512 float32\", \"pids\": [" +
                                           std::to_string(pids[2]) + "]}]"))
        << v.dump();
    // Every rank's recorder holds its 6, numbered from 1, as the daemon answers it.
    const json report = read_json(out);
    for (const auto& rank : report["ranks"]) {
        const json last = rank["communicators"][0]["last"];
        ASSERT_EQ(last.size(), static_cast<size_t>(kCalls)) << rank.dump();
        for (int i = 0; i < kCalls; ++i) EXPECT_EQ(last[i]["seq"], i + 1);
    }
}

}  // namespace
}  // namespace commdbg::e2e
