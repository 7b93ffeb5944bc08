// SPDX-License-Identifier: Apache-2.0
// comm_counts, comm_bytes and total_counts from the kernel's counter rows
// (issue 12, point 2): a framework collective issued inside another of its
// thread (gloo's _allgather_base calls allgather) is counted once, at the
// outermost call; a library collective (NCCL) under a framework one stays a
// call of its own layer; the per-symbol rows are untouched; records lost do
// not change any of it.
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "render.hpp"

using namespace commdbg;
using namespace commdbg::snapshot;

namespace {

capture::SymbolInfo coll(const char* name, const char* layer, cd_coll kind, bool return_probe) {
    return test::symbol(name, layer, CD_ROLE_COLLECTIVE, kind, {}, return_probe);
}

CounterRow row(uint32_t sym, uint64_t calls, uint64_t nested = 0, uint64_t bytes = 0, uint64_t nested_bytes = 0) {
    CounterRow r;
    r.sym = sym;
    r.calls = calls;
    r.nested = nested;
    r.bytes = bytes;
    r.nested_bytes = nested_bytes;
    return r;
}

// torch 2.6's ProcessGroupGloo, as the FSDP2 job of the issue drives it.
struct Gloo {
    capture::SymbolTable t;
    uint32_t ag_base = t.intern(coll("c10d::ProcessGroupGloo::_allgather_base", "c10d", CD_COLL_ALL_GATHER, false));
    uint32_t ag = t.intern(coll("c10d::ProcessGroupGloo::allgather", "c10d", CD_COLL_ALL_GATHER, false));
    uint32_t rs_base =
        t.intern(coll("c10d::ProcessGroupGloo::_reduce_scatter_base", "c10d", CD_COLL_REDUCE_SCATTER, false));
    uint32_t rs_coalesced = t.intern(
        coll("c10d::ProcessGroupGloo::reduce_scatter_tensor_coalesced", "c10d", CD_COLL_REDUCE_SCATTER, false));
    uint32_t ar = t.intern(coll("c10d::ProcessGroupGloo::allreduce", "c10d", CD_COLL_ALL_REDUCE, false));
    uint32_t barrier = t.intern(coll("c10d::ProcessGroupGloo::barrier", "c10d", CD_COLL_BARRIER, false));
    uint32_t nccl_ar = t.intern(coll("ncclAllReduce", "nccl", CD_COLL_ALL_REDUCE, true));

    // 56 all-gathers, 15 reduce-scatters (each through the coalesced one and
    // an allreduce), 3 all-reduces of its own and a barrier.
    ProcessSnapshot fsdp_job() const {
        ProcessSnapshot r;
        r.pid = 7;
        r.counters.push_back(row(ag_base, 56));
        r.counters.push_back(row(ag, 56, 56));
        r.counters.push_back(row(rs_base, 15));
        r.counters.push_back(row(rs_coalesced, 15, 15));
        r.counters.push_back(row(ar, 18, 15));
        r.counters.push_back(row(barrier, 1));
        return r;
    }
};

}  // namespace

TEST(CommCounts, FrameworkCollectiveCountsOnceAtItsOutermostCall) {
    Gloo g;
    auto r = g.fsdp_job();
    auto counts = comm_counts(r, g.t);
    EXPECT_EQ(counts.at("c10d.all_gather"), 56u);
    EXPECT_EQ(counts.at("c10d.reduce_scatter"), 15u);
    EXPECT_EQ(counts.at("c10d.all_reduce"), 3u) << "the 15 allreduces inside reduce-scatters are not all-reduces";
    EXPECT_EQ(counts.at("c10d.barrier"), 1u);
    EXPECT_EQ(total_counts(r, g.t), 75u);
    uint64_t sum = 0;
    for (const auto& [k, v] : counts) sum += v;
    EXPECT_EQ(sum, total_counts(r, g.t)) << "one layer: total_counts is the sum of comm_counts";
    // The per-symbol rows keep every call: the nesting is the kernel's to tell.
    EXPECT_EQ(r.counters[1].calls, 56u);
    EXPECT_EQ(r.counters[4].calls, 18u);
}

TEST(CommCounts, AKindOnlyCalledInsideAnotherHasNoKey) {
    Gloo g;
    auto r = g.fsdp_job();
    r.counters[4] = row(g.ar, 15, 15);  // FSDP2 issues no all-reduce: only reduce-scatter's
    EXPECT_EQ(comm_counts(r, g.t).count("c10d.all_reduce"), 0u) << "not issued: no key, not 0";
    EXPECT_EQ(comm_bytes(r, g.t).count("c10d.all_reduce"), 0u);
    EXPECT_EQ(total_counts(r, g.t), 72u);
}

TEST(CommCounts, WithoutNestedCallsEveryCallIsOutermost) {
    Gloo g;
    auto r = g.fsdp_job();
    for (auto& c : r.counters) c.nested = 0;
    EXPECT_EQ(comm_counts(r, g.t).at("c10d.all_gather"), 112u);
    EXPECT_EQ(total_counts(r, g.t), 161u);
}

TEST(CommCounts, LibraryCollectiveInsideAFrameworkOneKeepsItsOwnKeyButCountsOnceInTotal) {
    Gloo g;
    ProcessSnapshot r;
    r.pid = 7;
    // 4 c10d allreduces, each issuing one ncclAllReduce; 2 ncclAllReduce on their own.
    r.counters.push_back(row(g.ar, 4));
    r.counters.push_back(row(g.nccl_ar, 6, 4));
    auto counts = comm_counts(r, g.t);
    EXPECT_EQ(counts.at("c10d.all_reduce"), 4u);
    EXPECT_EQ(counts.at("nccl.all_reduce"), 6u) << "per-layer keys: every NCCL call counts under nccl.*";
    EXPECT_EQ(total_counts(r, g.t), 6u) << "4 logical collectives through both layers, 2 through NCCL alone";
}

// commdbgd --no-count-errors probes NCCL at entry only: still a library
// collective (its communicator is an argument), every call counted.
TEST(CommCounts, EntryOnlyNcclIsStillALibraryCollective) {
    capture::SymbolTable t;
    capture::SymbolInfo s = coll("ncclAllReduce", "nccl", CD_COLL_ALL_REDUCE, false);
    s.slots.count = 2, s.slots.dtype = 3, s.slots.comm = 5;
    uint32_t id = t.intern(s);
    ProcessSnapshot r;
    r.counters.push_back(row(id, 9, 4));
    EXPECT_EQ(comm_counts(r, t).at("nccl.all_reduce"), 9u);
    EXPECT_EQ(total_counts(r, t), 5u);
}

TEST(CommCounts, BytesAreTheOutermostCallsBytes) {
    Gloo g;
    ProcessSnapshot r;
    r.pid = 7;
    r.counters.push_back(row(g.ag_base, 2, 0, 2048));
    r.counters.push_back(row(g.ag, 3, 2, 3072, 2048));
    r.counters.push_back(row(g.nccl_ar, 5, 5, 500, 500));
    auto bytes = comm_bytes(r, g.t);
    EXPECT_EQ(bytes.at("c10d.all_gather"), 3072u) << "2 outer calls (2048) and an allgather of its own (1024)";
    EXPECT_EQ(bytes.at("nccl.all_reduce"), 500u);
    EXPECT_EQ(comm_counts(r, g.t).at("c10d.all_gather"), 3u);
    EXPECT_EQ(coll_summary(r, g.t).at("c10d.all_gather").bytes, 3072u);
}

TEST(CommCounts, JoinKeepsNestedAndMergesCoarseRows) {
    Gloo g;
    std::vector<capture::CounterEntry> entries(2);
    entries[0].key.tgid = 7;
    entries[0].key.sym = g.ag;
    entries[0].key.dtype = CD_DTYPE_NONE;
    entries[0].val.calls = 10;
    entries[0].val.nested = 9;
    entries[1] = entries[0];
    entries[1].coarse = true;  // counted after the fine keys ran out: the same row
    entries[1].val.calls = 4, entries[1].val.nested = 4;
    ProcessSnapshot r;
    r.pid = 7;
    join_kernel_state(7, entries, {}, {}, r);
    ASSERT_EQ(r.counters.size(), 1u);
    EXPECT_EQ(r.counters[0].calls, 14u);
    EXPECT_EQ(r.counters[0].nested, 13u);
    EXPECT_EQ(comm_counts(r, g.t).at("c10d.all_gather"), 1u);
}

// The kernel's count is exact; the model's (from records) is low when
// records were lost, and counts only where it saw more nesting.
TEST(CommCounts, TotalCountsTakeTheKernelsNestingOverTheModelsUnderRecordLoss) {
    Gloo g;
    model::TraceModel model(g.t);
    // Only one of the 56 nested allgathers reached the model as a record.
    auto call = [&](uint32_t sym, uint64_t sp, uint32_t depth) {
        capture::CallEnter e;
        e.tgid = 7;
        e.tid = 7;
        e.sp = sp;
        e.frame_depth = depth;
        e.cookie = make_cookie(sym, *g.t.find(sym));
        model.on_event(e);
    };
    call(g.ag_base, 0x7000, 0);
    call(g.ag, 0x6f00, 1);
    auto r = g.fsdp_job();
    r.tree = model.process(7);
    ASSERT_NE(r.tree, nullptr);
    ASSERT_EQ(r.tree->nested_collectives(), 1u);
    EXPECT_EQ(total_counts(r, g.t), 75u);
    // No records at all (counts only): the same.
    r.tree = nullptr;
    EXPECT_EQ(total_counts(r, g.t), 75u);
}
