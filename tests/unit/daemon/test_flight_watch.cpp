// SPDX-License-Identifier: Apache-2.0
// FlightWatch: the flight recorders of a communicator's ranks on one node,
// compared at each refresh — each collective number at which they differ is
// counted once however many refreshes still see it, a new one again; each
// rank's number and idle time are series; a communicator gone is forgotten.
#include <gtest/gtest.h>

#include <regex>

#include "flight_watch.hpp"

using namespace commdbg;
using namespace commdbg::daemon;
using namespace std::chrono_literals;

namespace {

using Clock = FlightWatch::Clock;
const Clock::time_point t0 = Clock::time_point{} + 1000h;
const std::string kComm = "0x00000000000000aa";

RankRecorder rank_of(uint32_t pid, int rank, std::vector<uint64_t> counts, uint64_t last_ns = 0) {
    RankRecorder r{{pid, 1}, kComm, rank, 3, counts.size(), last_ns, {}};
    for (size_t i = 0; i < counts.size(); ++i) r.last.push_back({i + 1, "all_reduce", counts[i], "float32", "", -1, ""});
    return r;
}

// The value of the one series of `name` whose labels hold `want` (a text
// such as rank="2"), from the registry's own exposition; nullopt: none.
std::optional<double> value_of(const MetricsRegistry& m, const std::string& name, const std::string& want = "") {
    std::istringstream in(m.render());
    std::string line;
    std::optional<double> out;
    while (std::getline(in, line)) {
        if (line.rfind(name + "{", 0) != 0 || line.find(want) == std::string::npos) continue;
        EXPECT_FALSE(out) << "two series match: " << line;
        out = std::stod(line.substr(line.rfind(' ') + 1));
    }
    return out;
}

TEST(FlightWatch, EachNumberWhereLocalRanksDifferIsCountedOnceAndTheFirstIsKept) {
    MetricsRegistry m;
    FlightWatch w(m, "node01");
    w.describe();
    w.observe({rank_of(10, 0, {8, 8}), rank_of(11, 1, {8, 8})}, 5'000'000'000, t0);
    EXPECT_EQ(value_of(m, "commdbg_collective_mismatch_total"), 0) << "exported from 0, for increase()";
    EXPECT_TRUE(w.mismatches().empty());
    // Rank 1's #3 differs: counted, and still once at the next refreshes.
    for (int i = 0; i < 3; ++i)
        w.observe({rank_of(10, 0, {8, 8, 8}), rank_of(11, 1, {8, 8, 4})}, 6'000'000'000, t0 + i * 1s);
    EXPECT_EQ(value_of(m, "commdbg_collective_mismatch_total", "comm=\"" + kComm + "\""), 1);
    // Rank 0 catches up to #4 differing from rank 1's #4: a second one.
    w.observe({rank_of(10, 0, {8, 8, 8, 2}), rank_of(11, 1, {8, 8, 4, 8})}, 7'000'000'000, t0 + 4s);
    EXPECT_EQ(value_of(m, "commdbg_collective_mismatch_total"), 2);
    const nlohmann::json st = w.mismatches();
    ASSERT_EQ(st.size(), 1u) << st.dump();
    EXPECT_EQ(st[0]["first_seq"], 3);
    EXPECT_EQ(st[0]["mismatches"], 2);
    EXPECT_EQ(st[0]["signatures"], nlohmann::json::parse(R"([{"signature": "all_reduce count 4 float32", "pids": [11]},
                                                             {"signature": "all_reduce count 8 float32", "pids": [10]}])"));
}

TEST(FlightWatch, EveryRankHasItsNumberAndIdleTimeAndOneRankAloneIsNotCompared) {
    MetricsRegistry m;
    FlightWatch w(m, "node01");
    w.observe({rank_of(10, 0, {8, 8, 8}, 1'000'000'000), rank_of(11, 1, {8, 8}, 2'500'000'000)}, 4'000'000'000, t0);
    EXPECT_EQ(value_of(m, "commdbg_comm_rank_seq", "rank=\"0\""), 3);
    EXPECT_EQ(value_of(m, "commdbg_comm_rank_seq", "rank=\"1\""), 2);
    EXPECT_EQ(value_of(m, "commdbg_comm_rank_idle_seconds", "rank=\"0\""), 3.0);
    EXPECT_EQ(value_of(m, "commdbg_comm_rank_idle_seconds", "rank=\"1\""), 1.5);

    MetricsRegistry alone;
    FlightWatch one(alone, "node01");
    one.observe({rank_of(10, 0, {8, 4})}, 4'000'000'000, t0);
    EXPECT_EQ(value_of(alone, "commdbg_collective_mismatch_total"), std::nullopt);
}

TEST(FlightWatch, ACommunicatorNoRankRecordsAnyMoreIsForgotten) {
    MetricsRegistry m;
    FlightWatch w(m, "node01");
    w.observe({rank_of(10, 0, {8}), rank_of(11, 1, {4})}, 1'000'000'000, t0);
    ASSERT_EQ(w.mismatches().size(), 1u);
    w.observe({}, 2'000'000'000, t0 + 1s);
    EXPECT_TRUE(w.mismatches().empty());
    // Seen again from scratch: the same number counts again for the new state.
    w.observe({rank_of(10, 0, {8}), rank_of(11, 1, {4})}, 3'000'000'000, t0 + 2s);
    EXPECT_EQ(w.mismatches().at(0)["mismatches"], 1);
}

}  // namespace
