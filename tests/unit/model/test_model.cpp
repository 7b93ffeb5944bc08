// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <tuple>

#include "fixtures.hpp"
#include "model.hpp"

using namespace commdbg;
using namespace commdbg::model;

namespace {

constexpr uint32_t kPid = 4242;
constexpr uint32_t kTid = 4242;

capture::SymbolInfo nccl(const char* name, cd_coll coll, capture::ArgSlots slots, cd_role role = CD_ROLE_COLLECTIVE) {
    return test::symbol(name, "nccl", role, coll, slots, /*return_probe=*/true);
}

capture::SymbolInfo frame_sym(const char* name, const char* layer, cd_role role, cd_coll coll = CD_COLL_NONE) {
    return test::symbol(name, layer, role, coll);
}

struct Fixture {
    capture::SymbolTable t;
    uint32_t allreduce = t.intern(nccl("ncclAllReduce", CD_COLL_ALL_REDUCE, [] {
        capture::ArgSlots s{2, 3, 5, 4};
        s.sendbuf = 0, s.recvbuf = 1, s.stream = 6;  // stream: the first stack word
        return s;
    }()));
    uint32_t send = t.intern(nccl("ncclSend", CD_COLL_SEND, [] {
        capture::ArgSlots s{1, 2, 4, CD_SLOT_NONE, 3};
        s.sendbuf = 0, s.stream = 5;
        return s;
    }()));
    uint32_t bcast_no_bufs = t.intern(nccl("ncclBroadcast", CD_COLL_BROADCAST,
                                           {2, 3, 5, CD_SLOT_NONE, 4}));
    uint32_t group_start = t.intern(nccl("ncclGroupStart", CD_COLL_NONE, {}, CD_ROLE_GROUP_START));
    uint32_t init = t.intern(nccl("ncclCommInitRank", CD_COLL_NONE,
                                  {CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE,
                                   CD_SLOT_NONE, 0},
                                  CD_ROLE_COMM_INIT));
    uint32_t c10d_allreduce = t.intern(frame_sym("c10d::ProcessGroupGloo::allreduce", "c10d",
                                                 CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE));
    uint32_t mm = t.intern(frame_sym("aten::mm", "aten", CD_ROLE_OP));
    uint32_t add = t.intern(frame_sym("aten::add.Tensor", "aten", CD_ROLE_OP));
    uint32_t module = t.intern(frame_sym("Linear", "python", CD_ROLE_ANNOTATION));

    capture::CallEnter enter(uint32_t sym, uint64_t ts, uint64_t sp, uint32_t tid = kTid,
                    uint32_t pid = kPid) const {
        capture::CallEnter e;
        e.tgid = pid;
        e.tid = tid;
        e.ts_ns = ts;
        e.sp = sp;
        e.cookie = make_cookie(sym, *t.find(sym));
        return e;
    }
    static capture::CallExit exit_of(const capture::CallEnter& e, uint64_t ts, int64_t ret = 0, uint64_t out = 0) {
        capture::CallExit x;
        x.tgid = e.tgid;
        x.tid = e.tid;
        x.ts_ns = ts;
        x.cookie = e.cookie;
        x.enter_ts_ns = e.ts_ns;
        x.ret = ret;
        x.out_value = out;
        return x;
    }
};

std::vector<uint32_t> children(const ProcessTree& p, uint32_t idx) {
    std::vector<uint32_t> out;
    for (uint32_t c = p.records()[idx].first_child; c != kNoRecord;
         c = p.records()[c].next_sibling)
        out.push_back(c);
    return out;
}

}  // namespace

// The kernel sends a return-probed call as one record at its return; the tree
// must be the one its entry and exit sent apart would build.
TEST(Model, OneCallRecordBuildsWhatItsEntryAndExitBuild) {
    Fixture f;
    auto feed = [&](TraceModel& m, bool combined) {
        m.on_event(f.enter(f.mm, 100, 1000));
        auto nc = f.enter(f.allreduce, 300, 800);
        nc.args[2] = 64, nc.args[3] = 7, nc.args[6] = 0x5000;
        if (combined) {
            m.on_event(capture::Call{nc, Fixture::exit_of(nc, 350, -3)});
        } else {
            m.on_event(nc);
            m.on_event(Fixture::exit_of(nc, 350, -3));
        }
        m.on_event(f.enter(f.add, 400, 1000));
    };
    TraceModel apart(f.t), one(f.t);
    feed(apart, false);
    feed(one, true);
    const auto& a = apart.process(kPid)->records();
    const auto& b = one.process(kPid)->records();
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), a.size());
    auto fields = [](const Record& r) {
        return std::make_tuple(r.start_ns, r.end_ns, r.count, r.comm, r.new_comm, r.ret, r.stream, r.sendbuf,
                               r.recvbuf, r.sym, r.tid, r.parent, r.first_child, r.next_sibling, r.dtype,
                               r.redop, r.peer, r.group_depth, r.flags, r.kind, r.coll);
    };
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(fields(a[i]), fields(b[i])) << "record " << i;
    EXPECT_EQ(b[1].parent, 0u);
    EXPECT_EQ(b[1].end_ns, 350u);
    EXPECT_EQ(b[1].ret, -3);
    EXPECT_EQ(b[1].stream, 0x5000u);
    EXPECT_EQ(one.process(kPid)->unmatched_exits(), 0u);
}

TEST(Model, NestsFramesBySpAndLinksNcclLeavesUnderTheOpenFrame) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000));
    m.on_event(f.enter(f.c10d_allreduce, 200, 900));
    auto nc = f.enter(f.allreduce, 300, 800);
    m.on_event(nc);
    m.on_event(Fixture::exit_of(nc, 350));
    m.on_event(f.enter(f.add, 400, 1000));  // same sp as mm: mm (and all above it) returned

    const ProcessTree* p = m.process(kPid);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(p->records().size(), 4u);
    ASSERT_EQ(p->roots(), (std::vector<uint32_t>{0, 3}));
    EXPECT_EQ(children(*p, 0), std::vector<uint32_t>{1});
    EXPECT_EQ(children(*p, 1), std::vector<uint32_t>{2});
    EXPECT_EQ(p->records()[2].parent, 1u);
    EXPECT_EQ(p->records()[0].kind, RecordKind::Op);
    EXPECT_EQ(p->records()[1].kind, RecordKind::Collective);
    // Closed by the sp rule: end is the popping entry's ts, marked inferred.
    EXPECT_EQ(p->records()[0].end_ns, 400u);
    EXPECT_TRUE(p->records()[0].has(kEndInferred));
    EXPECT_EQ(p->records()[1].end_ns, 400u);
    // The leaf's end came from its exit.
    EXPECT_EQ(p->records()[2].end_ns, 350u);
    EXPECT_FALSE(p->records()[2].has(kEndInferred));
    EXPECT_EQ(host_enqueue_ns(p->records()[2]), 50u);
    EXPECT_EQ(p->records()[3].end_ns, 0u);
    EXPECT_EQ(p->nested_collectives(), 1u);
    EXPECT_EQ(p->unmatched_exits(), 0u);
}

TEST(Model, LeavesAreNeverPushedSoTheNextCallIsASibling) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000));
    m.on_event(f.enter(f.allreduce, 200, 900));  // no exit yet
    m.on_event(f.enter(f.allreduce, 300, 900));
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(children(*p, 0), (std::vector<uint32_t>{1, 2}));
}

TEST(Model, CollectiveArgsAreDecodedFromTheSymbolSlots) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.allreduce, 100, 1000);
    e.args = {0x1000, 0x2000, 1024, 7, 0, 0xc0ffee, 0, 0};
    e.group_depth = 1;
    m.on_event(e);
    m.on_event(Fixture::exit_of(e, 3200, 0));
    const Record& r = m.process(kPid)->records()[0];
    EXPECT_TRUE(r.has(kHasCount) && r.has(kHasDtype) && r.has(kHasRedop) && r.has(kHasComm));
    EXPECT_FALSE(r.has(kHasPeer));
    EXPECT_EQ(r.count, 1024u);
    EXPECT_EQ(r.dtype, 7u);
    EXPECT_EQ(r.redop, 0u);
    EXPECT_EQ(r.comm, 0xc0ffeeu);
    EXPECT_EQ(r.group_depth, 1);
    EXPECT_EQ(r.coll, CD_COLL_ALL_REDUCE);
    EXPECT_TRUE(r.has(kHasRet));
    EXPECT_EQ(host_enqueue_ns(r), 3100u);
}

TEST(Model, StreamAndBuffersAreDecodedWhenTheirSlotsAreSet) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.allreduce, 100, 1000);
    e.args = {0x7f0000200000, 0x7f0000400000, 1024, 7, 0, 0xc0ffee, 0x5555a0000010, 0};
    m.on_event(e);
    e = f.enter(f.send, 200, 1000);
    e.args = {0x7f0000600000, 16, 7, 1, 0xc0ffee, 0, 0x99, 0x98};  // stream 0: the default stream
    m.on_event(e);
    e = f.enter(f.bcast_no_bufs, 300, 1000);
    e.args = {0x10, 0x20, 64, 7, 0, 0xc0ffee, 0x30, 0x40};
    m.on_event(e);
    const auto& recs = m.process(kPid)->records();
    ASSERT_EQ(recs.size(), 3u);
    EXPECT_TRUE(recs[0].has(kHasStream) && recs[0].has(kHasSendBuf) && recs[0].has(kHasRecvBuf));
    EXPECT_EQ(recs[0].stream, 0x5555a0000010u);
    EXPECT_EQ(recs[0].sendbuf, 0x7f0000200000u);
    EXPECT_EQ(recs[0].recvbuf, 0x7f0000400000u);
    // A set slot is a value even when it is 0 (the legacy default stream).
    EXPECT_TRUE(recs[1].has(kHasStream));
    EXPECT_EQ(recs[1].stream, 0u);
    EXPECT_TRUE(recs[1].has(kHasSendBuf));
    EXPECT_EQ(recs[1].sendbuf, 0x7f0000600000u);
    EXPECT_FALSE(recs[1].has(kHasRecvBuf));
    EXPECT_EQ(recs[1].recvbuf, 0u);
    // No slots in the symbol: nothing recorded, whatever the registers hold.
    EXPECT_FALSE(recs[2].has(kHasStream) || recs[2].has(kHasSendBuf) || recs[2].has(kHasRecvBuf));
    EXPECT_EQ(recs[2].stream, 0u);
    EXPECT_EQ(recs[2].sendbuf, 0u);
}

// A stack word the kernel did not read (no --stack-args: CD_ENTRY_STACK_ARGS
// clear) is no value: the record has no stream, not a stream of 0.  Register
// slots are values either way.
TEST(Model, StackSlotsTheKernelDidNotReadAreNotShown) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.allreduce, 100, 1000);
    e.args = {0x7f0000200000, 0x7f0000400000, 1024, 7, 0, 0xc0ffee, 0, 0};
    e.stack_args = false;
    m.on_event(e);
    e = f.enter(f.send, 200, 1000);
    e.args = {0x7f0000600000, 16, 7, 1, 0xc0ffee, 0x77, 0, 0};  // stream: a register
    e.stack_args = false;
    m.on_event(e);
    const auto& recs = m.process(kPid)->records();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_FALSE(recs[0].has(kHasStream));
    EXPECT_TRUE(recs[0].has(kHasSendBuf) && recs[0].has(kHasRecvBuf) && recs[0].has(kHasComm));
    EXPECT_EQ(recs[0].count, 1024u);
    EXPECT_TRUE(recs[1].has(kHasStream));
    EXPECT_EQ(recs[1].stream, 0x77u);
}

TEST(Model, CommInitExitRecordsTheNewCommunicator) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.init, 100, 1000);
    m.on_event(e);
    m.on_event(Fixture::exit_of(e, 900, 0, 0xabc0));
    const Record& r = m.process(kPid)->records()[0];
    EXPECT_EQ(r.kind, RecordKind::Collective);
    EXPECT_EQ(r.coll, CD_COLL_NONE);
    EXPECT_TRUE(r.has(kHasNewComm));
    EXPECT_EQ(r.new_comm, 0xabc0u);
}

TEST(Model, UnmatchedExitsAreCountedAndIgnored) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.allreduce, 100, 1000);
    m.on_event(e);
    auto wrong = Fixture::exit_of(e, 200);
    wrong.enter_ts_ns = 99;  // not the open call
    m.on_event(wrong);
    auto other_tid = Fixture::exit_of(e, 200);
    other_tid.tid = 7;
    m.on_event(other_tid);
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->unmatched_exits(), 2u);
    EXPECT_EQ(p->records()[0].end_ns, 0u);
    m.on_event(Fixture::exit_of(e, 300));
    EXPECT_EQ(p->records()[0].end_ns, 300u);
    m.on_event(Fixture::exit_of(e, 400));  // a second exit for the same call
    EXPECT_EQ(p->unmatched_exits(), 3u);
    EXPECT_EQ(p->records()[0].end_ns, 300u);
}

TEST(Model, MissingExitKeepsLeafEndUnknownAndALateExitIsUnmatched) {
    Fixture f;
    TraceModel m(f.t);
    auto lost = f.enter(f.allreduce, 100, 900);
    m.on_event(lost);
    m.on_event(f.enter(f.mm, 200, 1000));  // sp above the leaf: the leaf returned
    m.on_event(Fixture::exit_of(lost, 300));
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->records()[0].end_ns, 0u);
    EXPECT_FALSE(host_enqueue_ns(p->records()[0]));
    EXPECT_EQ(p->unmatched_exits(), 1u);
}

TEST(Model, GroupStartEndAreNotRecordsAndTheirExitsAreExpected) {
    Fixture f;
    TraceModel m(f.t);
    auto g = f.enter(f.group_start, 100, 1000);
    m.on_event(g);
    m.on_event(Fixture::exit_of(g, 110));
    const ProcessTree* p = m.process(kPid);
    EXPECT_TRUE(p->records().empty());
    EXPECT_EQ(p->unmatched_exits(), 0u);
    EXPECT_EQ(p->calls(f.group_start), 1u);
}

// Pin: the budget keeps the first 200,000 records and counts the rest; the
// per-symbol counts stay exact.
TEST(Model, DefaultBudgetRetains200kOf250kAndCountsStayExact) {
    Fixture f;
    TraceModel m(f.t);
    for (uint64_t i = 0; i < 250000; ++i) {
        auto e = f.enter(f.allreduce, 1000 + 10 * i, 5000);
        m.on_event(e);
        m.on_event(Fixture::exit_of(e, 1005 + 10 * i));
    }
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->records().size(), 200000u);
    EXPECT_EQ(p->dropped(DropCause::Budget), 50000u);
    EXPECT_EQ(p->dropped(DropCause::Depth), 0u);
    EXPECT_EQ(p->calls(f.allreduce), 250000u);
    EXPECT_EQ(p->coll_counts().at("nccl.all_reduce"), 250000u);
    EXPECT_EQ(p->unmatched_exits(), 0u);  // exits of dropped calls are consumed
    ASSERT_TRUE(p->incomplete_warning());
    EXPECT_NE(p->incomplete_warning()->find("50000 of 250000"), std::string::npos);
    EXPECT_LE(p->records().capacity(), 200000u);
}

TEST(Model, DepthLimitDropsDeepCallsButKeepsTheStackConsistent) {
    Fixture f;
    TraceModel m(f.t, ModelLimits{.max_records = 1000, .max_depth = 3});
    for (uint64_t d = 0; d < 5; ++d) m.on_event(f.enter(f.mm, 100 + d, 1000 - 100 * d));
    m.on_event(f.enter(f.allreduce, 200, 400));  // depth 5: dropped
    // Return to depth 1 (sp 900 pops depths 1..4): a sibling of record 1.
    m.on_event(f.enter(f.add, 300, 900));
    m.on_event(f.enter(f.add, 400, 1000));  // back at top level: a root
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->dropped(DropCause::Depth), 3u);
    ASSERT_EQ(p->records().size(), 5u);
    EXPECT_EQ(p->roots(), (std::vector<uint32_t>{0, 4}));
    EXPECT_EQ(children(*p, 0), (std::vector<uint32_t>{1, 3}));
    EXPECT_EQ(children(*p, 1), std::vector<uint32_t>{2});
    EXPECT_TRUE(children(*p, 2).empty());
    EXPECT_NE(p->incomplete_warning()->find("depth: 3"), std::string::npos);
}

TEST(Model, ADroppedCollectiveFrameStillCountsNesting) {
    Fixture f;
    TraceModel m(f.t, ModelLimits{.max_records = 1, .max_depth = 128});
    m.on_event(f.enter(f.mm, 100, 1000));              // retained
    m.on_event(f.enter(f.c10d_allreduce, 200, 1000));  // dropped (budget), pops mm
    m.on_event(f.enter(f.allreduce, 300, 900));        // dropped, nested in the placeholder
    m.on_event(f.enter(f.allreduce, 400, 1100));       // pops the placeholder: not nested
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->records().size(), 1u);
    EXPECT_EQ(p->dropped(DropCause::Budget), 3u);
    EXPECT_EQ(p->nested_collectives(), 1u);
    EXPECT_EQ(p->records()[0].end_ns, 200u);
}

TEST(Model, InterleavedThreadsKeepSeparateStacks) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000, 1));
    m.on_event(f.enter(f.mm, 110, 5000, 2));
    m.on_event(f.enter(f.allreduce, 120, 900, 1));
    m.on_event(f.enter(f.allreduce, 130, 4900, 2));
    m.on_event(f.enter(f.add, 140, 1000, 1));  // pops thread 1's mm only
    m.on_event(f.enter(f.allreduce, 150, 4900, 2));
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->threads(), (std::vector<uint32_t>{1, 2}));
    EXPECT_EQ(p->roots(), (std::vector<uint32_t>{0, 1, 4}));
    EXPECT_EQ(children(*p, 0), std::vector<uint32_t>{2});
    EXPECT_EQ(children(*p, 1), (std::vector<uint32_t>{3, 5}));
    EXPECT_EQ(p->records()[0].end_ns, 140u);
    EXPECT_EQ(p->records()[1].end_ns, 0u);
}

TEST(Model, KernelFrameDepthMakesADeeperLaterSiblingASiblingNotAChild) {
    // Python issues c10d allreduce, then allgather from a deeper native
    // frame: by sp alone the second looks nested.  The kernel saw the first
    // frame's return-address slot overwritten and says depth 0.
    Fixture f;
    TraceModel m(f.t);
    capture::CallEnter first = f.enter(f.c10d_allreduce, 100, 1000);
    first.frame_depth = 0;
    capture::CallEnter second = f.enter(f.c10d_allreduce, 200, 900);  // deeper sp
    second.frame_depth = 0;
    capture::CallEnter child = f.enter(f.allreduce, 300, 800);  // NCCL leaf inside the second
    child.frame_depth = 1;
    m.on_event(first);
    m.on_event(second);
    m.on_event(child);
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->roots(), (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(children(*p, 1), std::vector<uint32_t>{2});
    EXPECT_EQ(p->records()[0].end_ns, 200u);
    EXPECT_TRUE(p->records()[0].has(kEndInferred));
    EXPECT_EQ(p->nested_collectives(), 1u);  // only the NCCL call inside the second

    // Without the kernel's depth the same stream falls back to the sp rule.
    TraceModel by_sp(f.t);
    by_sp.on_event(f.enter(f.c10d_allreduce, 100, 1000));
    by_sp.on_event(f.enter(f.c10d_allreduce, 200, 900));
    EXPECT_EQ(by_sp.process(kPid)->roots(), std::vector<uint32_t>{0});
}

TEST(Model, FramesEnteredBeforeAttachLeaveTheirChildrenAsRoots) {
    Fixture f;
    TraceModel m(f.t);
    // We attached inside a frame at sp ~2000 that we never saw.
    m.on_event(f.enter(f.mm, 100, 1500));
    m.on_event(f.enter(f.add, 200, 1500));
    m.on_event(f.enter(f.mm, 300, 3000));  // above the unseen caller
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->roots(), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(Model, ProcExitClosesOpenFramesAndRecordsTheExitCode) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000));
    m.on_event(f.enter(f.add, 200, 900));
    m.on_event(f.enter(f.allreduce, 300, 800));
    m.on_event(capture::ProcExit{kPid, 1000, 256});
    const ProcessTree* p = m.process(kPid);
    EXPECT_EQ(p->records()[0].end_ns, 1000u);
    EXPECT_EQ(p->records()[1].end_ns, 1000u);
    EXPECT_TRUE(p->records()[1].has(kEndInferred));
    EXPECT_TRUE(p->records()[1].has(kEndAtExit)) << "the exit bounds it; it says nothing of when it returned";
    EXPECT_EQ(p->records()[2].end_ns, 0u);  // a leaf without exit stays unknown
    EXPECT_TRUE(p->exited());
    EXPECT_EQ(p->exit_code(), 256);
}

TEST(Model, AFrameClosedByALaterEntryIsNotMarkedEndAtExit) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000));
    m.on_event(f.enter(f.add, 200, 1000));  // mm returned before this entry
    m.on_event(capture::ProcExit{kPid, 1000, 0});
    const auto& recs = m.process(kPid)->records();
    EXPECT_EQ(recs[0].end_ns, 200u);
    EXPECT_FALSE(recs[0].has(kEndAtExit));
    EXPECT_TRUE(recs[1].has(kEndAtExit));
}

TEST(Model, ForkRecordsTheParentAndPidsAreSorted) {
    Fixture f;
    TraceModel m(f.t);
    m.on_event(f.enter(f.mm, 100, 1000, 9, 9));
    m.on_event(capture::ProcFork{5, 9, 150});
    EXPECT_EQ(m.pids(), (std::vector<uint32_t>{5, 9}));
    EXPECT_EQ(m.process(5)->parent_pid(), 9u);
    EXPECT_EQ(m.process(1), nullptr);
}

TEST(Model, UnknownSymbolsAreCountedNotRecorded) {
    Fixture f;
    TraceModel m(f.t);
    auto e = f.enter(f.mm, 100, 1000);
    e.cookie = 999;
    m.on_event(e);
    EXPECT_EQ(m.process(kPid)->unknown_symbols(), 1u);
    EXPECT_TRUE(m.process(kPid)->records().empty());
}

TEST(Model, WindowResetEmptiesTheModelKeepsLimitsAndOpenNesting) {
    Fixture f;
    TraceModel m(f.t, ModelLimits{.max_records = 2, .max_depth = 128});
    m.on_event(f.enter(f.c10d_allreduce, 100, 1000));
    m.on_event(f.enter(f.allreduce, 200, 900));
    m.on_event(f.enter(f.mm, 300, 5000, 1, 77));
    m.on_event(capture::ProcExit{77, 400, 0});
    m.reset();
    EXPECT_EQ(m.pids(), std::vector<uint32_t>{kPid});  // the exited process is forgotten
    const ProcessTree* p = m.process(kPid);
    EXPECT_TRUE(p->records().empty());
    EXPECT_TRUE(p->roots().empty());
    EXPECT_EQ(p->nested_collectives(), 0u);
    EXPECT_EQ(p->calls(f.allreduce), 0u);
    EXPECT_TRUE(p->threads().empty());
    // The c10d frame is still open: a collective inside it is nested, and a root now.
    m.on_event(f.enter(f.allreduce, 500, 900));
    EXPECT_EQ(p->nested_collectives(), 1u);
    EXPECT_EQ(p->roots(), std::vector<uint32_t>{0});
    m.on_event(f.enter(f.allreduce, 600, 900));
    m.on_event(f.enter(f.allreduce, 700, 900));
    EXPECT_EQ(p->records().size(), 2u);  // max_records kept across the reset
    EXPECT_EQ(p->dropped(DropCause::Budget), 1u);
    EXPECT_EQ(m.limits().max_records, 2u);
}

// A tensor whose numel is not the product of its sizes shows no shape, and
// without the process's layout no tensor shows a dtype: never a wrong value.
TEST(ModelTensors, ShapesAreShownOnlyWhenTheirFieldsAgreeAndTheLayoutIsKnown) {
    capture::SymbolTable t;
    uint32_t c10d = t.intern(test::symbol("c10d::ProcessGroupGloo::allreduce", "c10d", CD_ROLE_COLLECTIVE,
                                          CD_COLL_ALL_REDUCE));
    torch::TensorLayout layout;
    layout.itemsizes = {1, 1, 2, 4, 8, 2, 4, 8};
    layout.named = torch::named_scalar_types(layout.itemsizes);
    bool known = true;
    TraceModel m(t);
    m.set_tensor_layouts([&](uint32_t) { return known ? &layout : nullptr; });
    cd_tensors tn{};
    tn.kinds = CD_TPARAM_VECTOR, tn.status = CD_TENSORS_OK, tn.ntensors = 2, tn.total[0] = 2;
    tn.group_rank = 0, tn.group_size = 2;
    tn.t[0].sizes[0] = 3, tn.t[0].sizes[1] = 5, tn.t[0].numel = 15, tn.t[0].ndim = 2, tn.t[0].dtype = 6;
    tn.t[0].status = CD_TENSOR_OK;
    tn.t[1] = tn.t[0];
    tn.t[1].numel = 16;  // disagrees with 3 x 5
    auto enter = [&](uint64_t ts) {
        capture::CallEnter e;
        e.tgid = 7, e.tid = 7, e.ts_ns = ts, e.sp = 0x7000 - ts;
        e.cookie = capture::make_cookie(c10d, *t.find(c10d));
        e.tensors = tn;
        m.on_event(e);
    };
    enter(1);
    known = false;
    enter(2);
    const ProcessTree* p = m.process(7);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(p->records().size(), 2u);
    using S = ProcessTree::TensorStatus;
    const auto& first = p->tensor_set(p->records()[0]);
    ASSERT_EQ(first.n, 2);
    const auto& ok = p->tensor(first.first), &bad = p->tensor(first.first + 1);
    EXPECT_EQ(ok.status, S::Ok);
    EXPECT_EQ(std::vector<int64_t>(p->tensor_dims(ok).begin(), p->tensor_dims(ok).end()),
              (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(p->text(ok.dtype), "float32");
    EXPECT_EQ(ok.bytes, 60u);
    EXPECT_EQ(bad.status, S::Inconsistent);
    EXPECT_TRUE(p->tensor_dims(bad).empty());
    EXPECT_EQ(bad.bytes, 0u);
    const auto& second = p->tensor_set(p->records()[1]);
    EXPECT_EQ(p->tensor(second.first).status, S::NoLayout);
    EXPECT_TRUE(p->tensor_dims(p->tensor(second.first)).empty());
    EXPECT_EQ(second.group_size, 2);  // the group does not need the layout
}
