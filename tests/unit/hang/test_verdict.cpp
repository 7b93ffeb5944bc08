// SPDX-License-Identifier: Apache-2.0
// commdbg hang's verdict on samples of ranks (the e2e tests take them from
// hung jobs; here each verdict is made to order).
#include <gtest/gtest.h>

#include <sstream>

#include "hang.hpp"

namespace commdbg::hang {
namespace {

const Frame kStep{"step", "/job/train.py", 42, false};
const Frame kLoader{"fetch_shard", "/job/data.py", 88, false};

RankSample waiting(int pid, const std::string& kind, bool moved = false) {
    RankSample s;
    s.pid = pid;
    s.collective = InCollective{kind, kind, static_cast<uint32_t>(pid), kStep};
    s.at = Frame{kind, "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 2811, true};
    s.moved = moved;
    return s;
}

RankSample elsewhere(int pid, bool moved = false, const std::string& rank = "") {
    RankSample s;
    s.pid = pid;
    s.rank = rank;
    s.at = kLoader;
    s.moved = moved;
    return s;
}

// One Python thread in one frame, with `ticks` of CPU so far, and commdbgd's
// number `seq` on one communicator (0: none given).
RankSample look(uint64_t ticks, uint64_t seq, std::vector<uint64_t> where = {0x7f00, 12}) {
    RankSample s;
    s.pid = 7;
    ThreadSample t;
    t.tid = 7;
    t.python = true;
    t.cpu_ticks = ticks;
    t.where = std::move(where);
    s.threads.push_back(t);
    if (seq) s.comms.push_back(CommSeq{"0xabc", 0, 3, seq, {}});
    return s;
}

// A rank spinning in torch.cuda.synchronize (as CUDA waits for the GPU) uses
// CPU in one frame: with commdbgd's numbers, unchanged, it did not move.
TEST(HangMoved, CpuInOneFrameIsNoMovementWhereTheDaemonNumbersTheRank) {
    EXPECT_FALSE(rank_moved(look(100, 3), look(180, 3)));
    EXPECT_TRUE(rank_moved(look(100, 3), look(180, 4))) << "its number moved";
    EXPECT_TRUE(rank_moved(look(100, 3), look(100, 3, {0x7f00, 14}))) << "its frame moved";
    // Without numbers, CPU time is all there is: a Python loop in one line.
    EXPECT_TRUE(rank_moved(look(100, 0), look(180, 0)));
    EXPECT_FALSE(rank_moved(look(100, 0), look(100, 0)));
}

Verdict verdict_of(std::vector<RankSample> ranks) {
    Report r;
    r.interval_s = 1;
    r.ranks = std::move(ranks);
    decide(r);
    return r.verdict;
}

TEST(HangVerdict, RanksOutsideTheCollectiveTheOthersWaitInAreMissing) {
    Verdict v = verdict_of({waiting(10, "all_reduce"), waiting(11, "all_reduce"), elsewhere(12, true, "2")});
    EXPECT_EQ(v.kind, Verdict::Kind::missing);
    EXPECT_EQ(v.culprits, std::vector<int>{12});
    EXPECT_EQ(v.collective, "all_reduce");
    EXPECT_EQ(v.exit_code(), 3);
    EXPECT_EQ(v.message, "rank 2 (pid 12) never issued all_reduce, which pid 10, pid 11 wait in; rank 2 (pid 12) is "
                         "in fetch_shard at /job/data.py:88");
}

TEST(HangVerdict, RanksWaitingInDifferentKindsAreAMismatchNamingTheFewer) {
    Verdict v = verdict_of({waiting(10, "all_reduce"), waiting(11, "all_reduce"), waiting(12, "broadcast")});
    EXPECT_EQ(v.kind, Verdict::Kind::mismatch);
    EXPECT_EQ(v.culprits, std::vector<int>{12});
    EXPECT_EQ(v.exit_code(), 3);
    EXPECT_NE(v.message.find("broadcast (pid 12)"), std::string::npos) << v.message;
}

TEST(HangVerdict, EveryRankStillInTheSameCollectiveIsBelowTheHost) {
    Verdict v = verdict_of({waiting(10, "all_gather"), waiting(11, "all_gather")});
    EXPECT_EQ(v.kind, Verdict::Kind::below_host);
    EXPECT_TRUE(v.culprits.empty());
    EXPECT_EQ(v.exit_code(), 1);
}

// A rank in a collective that moved between the looks is not waiting: a
// healthy job caught mid-collective names no culprit.
TEST(HangVerdict, RanksThatMoveAreProgressingNotCulprits) {
    Verdict v = verdict_of({waiting(10, "all_reduce", true), elsewhere(11, true)});
    EXPECT_EQ(v.kind, Verdict::Kind::progressing);
    EXPECT_EQ(v.exit_code(), 0);
    Verdict still = verdict_of({elsewhere(10), elsewhere(11)});
    EXPECT_EQ(still.kind, Verdict::Kind::stuck);
    EXPECT_EQ(still.exit_code(), 1);
}

TEST(HangVerdict, GroupsMergeRanksByPlaceLargestFirstAndJsonRoundTrips) {
    Report r;
    r.interval_s = 0.5;
    r.ranks = {waiting(10, "all_reduce"), elsewhere(12), waiting(11, "all_reduce")};
    decide(r);
    ASSERT_EQ(r.groups.size(), 2u);
    EXPECT_EQ(r.groups[0].pids, (std::vector<int>{10, 11}));
    EXPECT_EQ(r.groups[0].what, "all_reduce at /job/train.py:42 in step");
    EXPECT_EQ(r.groups[1].what, "fetch_shard at /job/data.py:88");
    auto back = from_json(nlohmann::json::parse(to_json(r).dump()));
    ASSERT_TRUE(back) << back.error();
    decide(*back);
    EXPECT_EQ(to_json(*back), to_json(r));
    std::ostringstream table;
    render_table(r, table);
    EXPECT_NE(table.str().find("pid 10, pid 11: all_reduce at /job/train.py:42 in step"), std::string::npos)
        << table.str();
}

// commdbgd's evidence: the flight recorder's entries and the counts.
RankSample on_comm(int pid, int rank, uint64_t issued, uint64_t odd_count_at = 0) {
    RankSample s = elsewhere(pid);
    CommSeq c{"0x00000000000000ab", rank, 3, issued, {}};
    for (uint64_t seq = 1; seq <= issued; ++seq)
        c.last.push_back({seq, "all_reduce", seq == odd_count_at ? 512u : 1024u, "float32"});
    s.comms.push_back(c);
    return s;
}

TEST(HangVerdict, TheFirstCollectiveNumberWhoseSignaturesDifferIsTheMismatch) {
    Verdict v = verdict_of({on_comm(10, 0, 6), on_comm(11, 1, 6, 4), on_comm(12, 2, 5)});
    EXPECT_EQ(v.kind, Verdict::Kind::mismatch);
    EXPECT_EQ(v.seq, 4u);
    EXPECT_EQ(v.culprits, std::vector<int>{11});
    using Sigs = std::vector<std::pair<std::string, std::vector<int>>>;
    EXPECT_EQ(v.signatures, (Sigs{{"all_reduce count 1024 float32", {10, 12}}, {"all_reduce count 512 float32", {11}}}));
    EXPECT_EQ(v.message, "collective #4 of communicator 0x00000000000000ab differs between ranks: all_reduce count "
                         "1024 float32 (pid 10, pid 12) all_reduce count 512 float32 (pid 11)");
}

// The reduce op and the root are part of a signature: ranks reducing with
// another op, or broadcasting from another root, diverge there; a record
// keeps both through a report's JSON.
TEST(HangVerdict, AnOpOrARootThatDiffersIsADivergenceAndBothSurviveJson) {
    const std::vector<Issued> a = {{1, "all_reduce", 8, "float32", "sum", -1}, {2, "broadcast", 8, "float32", "", 0}};
    const std::vector<Issued> b = {{1, "all_reduce", 8, "float32", "max", -1}, {2, "broadcast", 8, "float32", "", 0}};
    const std::vector<Issued> c = {{1, "all_reduce", 8, "float32", "sum", -1}, {2, "broadcast", 8, "float32", "", 3}};
    const std::vector<Divergence> d = divergences({{10, &a}, {11, &b}, {12, &c}});
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].seq, 1u);
    EXPECT_EQ(d[0].odd, std::vector<int>{11});
    // The most ranks' signature first, the odd rank's after it.
    EXPECT_EQ(d[0].signatures.front(),
              (std::pair<std::string, std::vector<int>>{"all_reduce count 8 float32 sum", {10, 12}}));
    EXPECT_EQ(d[0].signatures.back(), (std::pair<std::string, std::vector<int>>{"all_reduce count 8 float32 max", {11}}));
    EXPECT_EQ(d[1].seq, 2u);
    EXPECT_EQ(d[1].odd, std::vector<int>{12});
    EXPECT_EQ(d[1].signatures.back().first, "broadcast count 8 float32 root 3");
    for (const Issued& e : {a[0], a[1], c[1]}) EXPECT_EQ(Issued::from_json(e.to_json()), e) << e.to_json().dump();
}

// A collective whose count is unknown (a c10d call made before commdbgd
// could read its process's tensors): its signature says none (never
// "count 0"), its kind still tells a divergence, and JSON keeps "no count"
// apart from a count of 0.
TEST(HangVerdict, ACollectiveWithoutACountShowsNoneAndStillDiverges) {
    const std::vector<Issued> a = {{1, "all_reduce", std::nullopt, "", "", -1}};
    const std::vector<Issued> b = {{1, "broadcast", std::nullopt, "", "", -1}};
    EXPECT_EQ(a[0].signature(), "all_reduce");
    EXPECT_FALSE(a[0].to_json().contains("count"));
    EXPECT_EQ(Issued::from_json(a[0].to_json()), a[0]);
    const Issued zero{1, "all_reduce", 0, "float32", "", -1};
    EXPECT_EQ(zero.signature(), "all_reduce count 0 float32");
    EXPECT_EQ(Issued::from_json(zero.to_json()), zero);
    const std::vector<Divergence> d = divergences({{10, &a}, {11, &a}, {12, &b}});
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].odd, std::vector<int>{12});
    // One rank's count unread is no divergence; counts that differ are; a
    // kind that differs still is where a count is missing.
    const std::vector<Issued> c16 = {{1, "all_reduce", 16, "", "", -1}};
    const std::vector<Issued> c8 = {{1, "all_reduce", 8, "", "", -1}};
    EXPECT_TRUE(divergences({{10, &c16}, {11, &a}, {12, &c16}}).empty());
    EXPECT_EQ(divergences({{10, &c16}, {11, &c8}, {12, &c16}}).at(0).odd, std::vector<int>{11});
    EXPECT_EQ(divergences({{10, &c16}, {11, &b}, {12, &c16}}).at(0).odd, std::vector<int>{11});
}

// A c10d call recorded before commdbgd could read its process's tensors and
// options has a kind only: what it left unread is no divergence where the
// others agree on it; where the others differ in it, they still diverge and
// the rank that left it unread is not named the odd one.
TEST(HangVerdict, WhatOneRankLeftUnreadIsComparedAmongTheRanksThatReadIt) {
    const std::vector<Issued> sum = {{1, "all_reduce", 16, "float32", "sum", -1}, {2, "broadcast", 16, "float32", "", 0}};
    const std::vector<Issued> max = {{1, "all_reduce", 16, "float32", "max", -1}, {2, "broadcast", 16, "float32", "", 0}};
    const std::vector<Issued> unread = {{1, "all_reduce", std::nullopt, "", "", -1}, {2, "broadcast", std::nullopt, "", "", -1}};
    const std::vector<Issued> root1 = {{1, "all_reduce", 16, "float32", "sum", -1}, {2, "broadcast", 16, "float32", "", 1}};
    EXPECT_TRUE(divergences({{10, &sum}, {11, &unread}, {12, &sum}}).empty());
    // The known ranks differ in the op: still a divergence, named by them.
    std::vector<Divergence> d = divergences({{10, &sum}, {11, &unread}, {12, &max}, {13, &sum}});
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].seq, 1u);
    EXPECT_EQ(d[0].odd, std::vector<int>{12});
    // What every rank that read it agrees on is shown by none.
    EXPECT_EQ(d[0].signatures.front(), (std::pair<std::string, std::vector<int>>{"all_reduce sum", {10, 13}}));
    EXPECT_EQ(d[0].signatures.back(), (std::pair<std::string, std::vector<int>>{"all_reduce", {11}}));
    // Two ranks unread outnumber neither reader: the reader against the
    // majority of readers is the odd one.
    d = divergences({{10, &unread}, {11, &unread}, {12, &root1}, {13, &sum}, {14, &sum}});
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].seq, 2u);
    EXPECT_EQ(d[0].odd, std::vector<int>{12});
    EXPECT_EQ(d[0].signatures.front().second, (std::vector<int>{13, 14}));
    // A kind that differs still differs, however little its rank read.
    const std::vector<Issued> other = {{1, "all_gather", std::nullopt, "", "", -1}};
    d = divergences({{10, &sum}, {11, &other}, {12, &sum}});
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].odd, std::vector<int>{11});
}

TEST(HangVerdict, ARankThatIssuedFewerWhileTheOthersWaitNeverIssuedTheNext) {
    Verdict v = verdict_of({on_comm(10, 0, 6), on_comm(11, 1, 6), on_comm(12, 2, 5)});
    EXPECT_EQ(v.kind, Verdict::Kind::missing);
    EXPECT_EQ(v.seq, 6u);
    EXPECT_EQ(v.culprits, std::vector<int>{12});
    // Ranks ahead that still move: the job goes on, nobody is named.
    RankSample ahead = on_comm(10, 0, 6);
    ahead.moved = true;
    Verdict moving = verdict_of({ahead, on_comm(11, 1, 6), on_comm(12, 2, 5)});
    EXPECT_EQ(moving.kind, Verdict::Kind::progressing);
    // The same numbers everywhere and nothing moves: below the host.
    EXPECT_EQ(verdict_of({on_comm(10, 0, 6), on_comm(11, 1, 6)}).kind, Verdict::Kind::below_host);
}

// What a return-probed collective returned: the first number that returned
// an error on a rank names that rank when nothing else differs; a call still
// inside NCCL is shown as such, and both survive a report's JSON.
TEST(HangVerdict, TheFirstCollectiveThatReturnedAnErrorNamesItsRanks) {
    std::vector<RankSample> ranks = {on_comm(10, 0, 6), on_comm(11, 1, 6), on_comm(12, 2, 6)};
    for (RankSample& s : ranks)
        for (Issued& e : s.comms[0].last) e.status = "ncclSuccess";
    ranks[1].comms[0].last[4].status = "ncclRemoteError";
    ranks[2].comms[0].last[5].status = "ncclSystemError";
    ranks[0].comms[0].last[5].status = "in_call";
    Report r;
    r.interval_s = 1;
    r.ranks = ranks;
    decide(r);
    const Verdict& v = r.verdict;
    EXPECT_EQ(v.kind, Verdict::Kind::failed);
    EXPECT_EQ(to_string(v.kind), "collective_error");
    EXPECT_EQ(v.seq, 5u);
    EXPECT_EQ(v.culprits, std::vector<int>{11});
    EXPECT_EQ(v.exit_code(), 3);
    EXPECT_EQ(v.message, "collective #5 of communicator 0x00000000000000ab (all_reduce count 1024 float32) returned "
                         "an error: ncclRemoteError on pid 11 (now in fetch_shard at /job/data.py:88)");
    std::ostringstream table;
    render_table(r, table);
    EXPECT_NE(table.str().find("#5 all_reduce count 1024 float32 returned ncclRemoteError\n"), std::string::npos)
        << table.str();
    EXPECT_NE(table.str().find("#6 all_reduce count 1024 float32 (still in the call)\n"), std::string::npos)
        << table.str();
    EXPECT_NE(table.str().find("#6 all_reduce count 1024 float32\n"), std::string::npos) << "success says nothing";
    auto back = from_json(nlohmann::json::parse(to_json(r).dump()));
    ASSERT_TRUE(back) << back.error();
    EXPECT_EQ(back->ranks[0].comms, r.ranks[0].comms);
    EXPECT_EQ(back->ranks[2].comms, r.ranks[2].comms);
    // An error is not a mismatch or a rank behind: those come first.
    ranks[2].comms[0].last[2].count = 512;
    EXPECT_EQ(verdict_of(ranks).kind, Verdict::Kind::mismatch);
    // Without statuses (returns not probed) nothing has failed.
    EXPECT_EQ(verdict_of({on_comm(10, 0, 6), on_comm(11, 1, 6)}).kind, Verdict::Kind::below_host);
}

TEST(HangVerdict, TorchDistributedFunctionsNameTheirCollectiveKinds) {
    EXPECT_EQ(collective_of_api("all_reduce"), "all_reduce");
    EXPECT_EQ(collective_of_api("all_gather_into_tensor"), "all_gather");
    EXPECT_EQ(collective_of_api("_reduce_scatter_base"), "reduce_scatter");
    EXPECT_EQ(collective_of_api("monitored_barrier"), "barrier");
    EXPECT_EQ(collective_of_api("init_process_group"), std::nullopt);
    EXPECT_FALSE(from_json(nlohmann::json::array()));
}

}  // namespace
}  // namespace commdbg::hang
