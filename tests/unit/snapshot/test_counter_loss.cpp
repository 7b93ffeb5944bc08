// SPDX-License-Identifier: Apache-2.0
// A process whose kernel counter keys ran out (issue 13, finding 2): its
// per-symbol coarse counter adds to the per-kind counts, and the outputs say
// how many calls lost their communicator and datatype.
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "render.hpp"

using namespace commdbg;
using namespace commdbg::snapshot;

namespace {

struct Fixture {
    capture::SymbolTable t;
    uint32_t allreduce;
    Fixture() {
        allreduce = t.intern(test::symbol("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE));
    }
    // 5 calls with their breakdown, 7 counted coarsely (comm 0, no dtype).
    ProcessSnapshot report(uint64_t lost) const {
        ProcessSnapshot r;
        r.pid = 42;
        r.command = "flooder";
        r.counters.push_back({allreduce, 0x1000, 7, 5, 50, 200, 0});
        r.counters.push_back({allreduce, 0, 0xffffffffu, 7, 70, 0, 1});
        r.counter_breakdown_lost = lost;
        return r;
    }
};

}  // namespace

TEST(CounterLoss, CoarseCountersAddToTheCountsPerKind) {
    Fixture f;
    auto r = f.report(7);
    EXPECT_EQ(comm_counts(r, f.t).at("nccl.all_reduce"), 12u);
    EXPECT_EQ(coll_summary(r, f.t).at("nccl.all_reduce").errors, 1u);
}

TEST(CounterLoss, JsonSaysHowManyCallsLostTheirBreakdown) {
    Fixture f;
    auto j = output::to_json(f.report(7), f.t, 1);
    EXPECT_EQ(j["comm_counts"]["nccl.all_reduce"], 12);
    ASSERT_TRUE(j.contains("counter_breakdown_lost")) << j.dump();
    EXPECT_EQ(j["counter_breakdown_lost"], 7);
    // Nothing lost: no key (the golden dump stays as it was).
    EXPECT_FALSE(output::to_json(f.report(0), f.t, 1).contains("counter_breakdown_lost"));
}

TEST(CounterLoss, TableWarnsThatTheBreakdownIsIncompleteButCountsAreExact) {
    Fixture f;
    std::string text = output::render_table(f.report(7), f.t, 1, false);
    EXPECT_NE(text.find("7 calls counted without communicator and datatype"), std::string::npos) << text;
    EXPECT_EQ(output::render_table(f.report(0), f.t, 1, false).find("without communicator and datatype"),
              std::string::npos);
}
