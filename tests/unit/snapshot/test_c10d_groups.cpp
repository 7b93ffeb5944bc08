// SPDX-License-Identifier: Apache-2.0
// c10d process groups from the kernel's notes (events.h, CD_TAIL_C10D_*):
// a group is named by the PrefixStore chain its constructor was given (the
// store keys its ranks meet under, the same on every rank), and the job by
// its rendezvous or launcher, so that one group has one id on every rank of
// one job and another id in another job.
#include <gtest/gtest.h>

#include <cstring>

#include "comm_registry.hpp"

using namespace commdbg;
using namespace commdbg::snapshot;

namespace {

capture::CommEntry store(uint32_t pid, uint64_t at, const char* prefix, uint64_t inner) {
    capture::CommEntry e{};
    e.key.tgid = pid;
    e.key.comm = at;
    e.val.origin = CD_COMM_C10D_STORE;
    e.val.parent = inner;
    e.val.rank = e.val.nranks = -1;
    std::strncpy(e.val.name, prefix, sizeof(e.val.name) - 1);
    return e;
}

capture::CommEntry group(uint32_t pid, uint64_t at, uint64_t its_store, int rank, int nranks) {
    capture::CommEntry e{};
    e.key.tgid = pid;
    e.key.comm = at;
    e.val.origin = CD_COMM_C10D_GROUP;
    e.val.parent = its_store;
    e.val.rank = rank;
    e.val.nranks = nranks;
    return e;
}

TEST(C10dGroups, NamedByTheirStoreChainInnermostFirst) {
    // torch 1.13: PrefixStore("0", PrefixStore("default_pg", TCPStore));
    // 2.6: its CPU backend gets PrefixStore("cpu/", PrefixStore("0/", ...)).
    const std::vector<capture::CommEntry> comms = {
        store(7, 0x100, "default_pg", 0x50), store(7, 0x200, "0", 0x100), group(7, 0x300, 0x200, 1, 3),
        store(7, 0x400, "0/", 0x100),        store(7, 0x500, "cpu/", 0x400), group(7, 0x600, 0x500, 1, 3),
        group(7, 0x700, 0x999, 0, 2),  // its store made before commdbg watched
        group(8, 0x800, 0x200, 0, 3),  // another process's: not pid 7's stores
    };
    const std::vector<C10dGroup> g = c10d_groups_of(7, comms);
    ASSERT_EQ(g.size(), 3u);
    EXPECT_EQ(g[0].ptr, 0x300u);
    EXPECT_EQ(g[0].name, "default_pg/0");
    EXPECT_EQ(g[0].rank, 1);
    EXPECT_EQ(g[0].nranks, 3);
    EXPECT_EQ(g[1].name, "default_pg/0/cpu");
    EXPECT_EQ(g[2].name, "") << "an unknown store names nothing";
    EXPECT_EQ(c10d_groups_of(8, comms).at(0).name, "");
    // Stores and groups are no NCCL communicators.
    EXPECT_TRUE(communicators_of(7, comms, {}).empty());
}

TEST(C10dGroups, AStoreChainThatLoopsEnds) {
    const std::vector<capture::CommEntry> comms = {store(7, 0x100, "a", 0x200), store(7, 0x200, "b", 0x100),
                                                   group(7, 0x300, 0x100, 0, 2)};
    const std::vector<C10dGroup> g = c10d_groups_of(7, comms);
    ASSERT_EQ(g.size(), 1u);
    EXPECT_LE(g[0].name.size(), std::string("a/b/a/b/a/b/a/b").size());
    EXPECT_TRUE(g[0].name.ends_with("b/a")) << g[0].name;
}

TEST(C10dGroups, TheJobIsItsRendezvousElseItsRunElseItsLauncher) {
    using Env = std::map<std::string, std::string>;
    EXPECT_EQ(c10d_job(Env{{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "r"}}, 42, 9),
              "10.0.0.1:29500");
    EXPECT_EQ(c10d_job(Env{{"MASTER_ADDR", "10.0.0.1"}, {"TORCHELASTIC_RUN_ID", "r"}}, 42, 9), "run:r");
    EXPECT_EQ(c10d_job(Env{}, 42, 9), "launcher:42.9");
    EXPECT_EQ(c10d_job(Env{}, 1, 9), "") << "init is no launcher";
    EXPECT_EQ(c10d_job(Env{}, 42, 0), "") << "a launcher without a start time may be another process";
    const C10dGroup g{0x300, "default_pg/0", 1, 3};
    EXPECT_EQ(c10d_comm_id(g, "10.0.0.1:29500"), "c10d:10.0.0.1:29500/default_pg/0");
    EXPECT_EQ(c10d_comm_id(g, ""), std::nullopt);
    EXPECT_EQ(c10d_comm_id(C10dGroup{0x300, "", 1, 3}, "10.0.0.1:29500"), std::nullopt);
}

}  // namespace
