// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <variant>

#include "fixtures.hpp"
#include "nccl.hpp"
#include "output_file.hpp"
#include "perfetto_check.hpp"
#include "render.hpp"
#include "text.hpp"
#include "wait_status.hpp"
#include "result.hpp"

using namespace commdbg;
using namespace commdbg::output;

namespace {

constexpr uint32_t kPid = 4242;
constexpr uint64_t kComm = 0x5555c0ffee00;
constexpr uint64_t kSplitComm = 0x5555c0ffef00;
constexpr uint64_t kStream = 0x5555a0000010;
constexpr uint64_t kSend = 0x7f0000200000, kRecv = 0x7f0000400000;

capture::ArgSlots with_buffers(capture::ArgSlots s, uint8_t send, uint8_t recv, uint8_t stream) {
    s.sendbuf = send;
    s.recvbuf = recv;
    s.stream = stream;
    return s;
}

capture::SymbolInfo sym(const char* name, const char* layer, cd_role role, cd_coll coll = CD_COLL_NONE,
               capture::ArgSlots slots = {}, bool ret = false) {
    return test::symbol(name, layer, role, coll, slots, ret);
}

// One synthetic window: a module with ops, a c10d collective issuing an NCCL
// one, trivial ops hiding a real one, a call whose exit never came, and a
// second thread.
struct Scenario {
    capture::SymbolTable t;
    // The spec's layout (specs/nccl.json): init nranks/rank -> count/peer,
    // split key/color/parent -> count/peer/comm.
    uint32_t init = t.intern(sym("ncclCommInitRank", "nccl", CD_ROLE_COMM_INIT, CD_COLL_NONE,
                                 {1, CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE, 2, 0}, true));
    uint32_t split = t.intern(sym("ncclCommSplit", "nccl", CD_ROLE_COMM_SPLIT, CD_COLL_NONE,
                                  {2, CD_SLOT_NONE, 0, CD_SLOT_NONE, 1, 3}, true));
    uint32_t destroy = t.intern(sym("ncclCommDestroy", "nccl", CD_ROLE_COMM_END, CD_COLL_NONE,
                                    {CD_SLOT_NONE, CD_SLOT_NONE, 0}, true));
    uint32_t allreduce = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE,
                                      CD_COLL_ALL_REDUCE, with_buffers({2, 3, 5, 4}, 0, 1, 6), true));
    uint32_t allgather = t.intern(sym("ncclAllGather", "nccl", CD_ROLE_COLLECTIVE,
                                      CD_COLL_ALL_GATHER, with_buffers({2, 3, 4}, 0, 1, 5), true));
    uint32_t bcast = t.intern(sym("ncclBroadcast", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_BROADCAST,
                                  {2, 3, 5, CD_SLOT_NONE, 4}, true));
    uint32_t send = t.intern(sym("ncclSend", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_SEND,
                                 with_buffers({1, 2, 4, CD_SLOT_NONE, 3}, 0, CD_SLOT_NONE, 5),
                                 true));
    uint32_t c10d = t.intern(sym("c10d::ProcessGroupNCCL::allreduce", "c10d",
                                 CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE));
    uint32_t module = t.intern(sym("model.layers.0 (Linear)", "python", CD_ROLE_ANNOTATION));
    uint32_t linear = t.intern(sym("aten::linear", "aten", CD_ROLE_OP));
    uint32_t tr = t.intern(sym("aten::t", "aten", CD_ROLE_OP));
    uint32_t addmm = t.intern(sym("aten::addmm", "aten", CD_ROLE_OP));
    uint32_t view = t.intern(sym("aten::view", "aten", CD_ROLE_OP));
    uint32_t contiguous = t.intern(sym("aten::contiguous", "aten", CD_ROLE_OP));
    uint32_t clone = t.intern(sym("aten::clone", "aten", CD_ROLE_OP));
    uint32_t copy = t.intern(sym("aten::copy_", "aten", CD_ROLE_OP));
    uint32_t add = t.intern(sym("aten::add.Tensor", "aten", CD_ROLE_OP));

    std::array<uint8_t, CD_UNIQUE_ID_BYTES> uid{};
    model::TraceModel model;

    capture::CallEnter enter(uint32_t s, uint64_t ts, uint64_t sp, uint32_t tid = kPid,
                    std::array<uint64_t, CD_NUM_ARGS> args = {}, std::optional<cd_tensors> tensors = {}) {
        capture::CallEnter e;
        e.tensors = tensors;
        e.tgid = kPid;
        e.tid = tid;
        e.ts_ns = ts;
        e.sp = sp;
        e.cookie = make_cookie(s, *t.find(s));
        e.args = args;
        model.on_event(e);
        return e;
    }
    void exit(const capture::CallEnter& e, uint64_t ts, int64_t ret = 0, uint64_t out = 0) {
        capture::CallExit x;
        x.tgid = e.tgid;
        x.tid = e.tid;
        x.ts_ns = ts;
        x.cookie = e.cookie;
        x.enter_ts_ns = e.ts_ns;
        x.ret = ret;
        x.out_value = out;
        model.on_event(x);
    }

    // A libc10 whose element sizes are torch's first eight ScalarTypes'.
    torch::TensorLayout layout = [] {
        torch::TensorLayout l;
        l.itemsizes = {1, 1, 2, 4, 8, 2, 4, 8};
        l.named = torch::named_scalar_types(l.itemsizes);
        return l;
    }();

    explicit Scenario(model::ModelLimits limits = {}) : model(t, limits) {
        model.set_tensor_layouts([this](uint32_t) { return &layout; });
        for (int i = 0; i < CD_UNIQUE_ID_BYTES; ++i) uid[i] = static_cast<uint8_t>(i * 37);
        const uint64_t base = 1'000'000'000;
        auto e = enter(init, base + 1000, 0x7000, kPid, {0x7ffd1000, 2, 0, 0, 0, 0, 0, 0});
        exit(e, base + 91000, 0, kComm);
        enter(module, base + 100000, 0x7000);
        enter(linear, base + 101000, 0x6f00);
        enter(tr, base + 102000, 0x6e00);
        enter(addmm, base + 103000, 0x6e00);
        // The c10d call's tensor as the kernel reads it: one float32 [256, 4]
        // (1024 elements, what the NCCL call inside it moves), group rank 0 of 2.
        cd_tensors tn{};
        tn.group_rank = 0, tn.group_size = 2, tn.kinds = CD_TPARAM_VECTOR, tn.status = CD_TENSORS_OK;
        tn.ntensors = 1, tn.total[0] = 1;
        tn.t[0].sizes[0] = 256, tn.t[0].sizes[1] = 4, tn.t[0].numel = 1024, tn.t[0].ndim = 2;
        tn.t[0].dtype = 6, tn.t[0].status = CD_TENSOR_OK;  // ScalarType Float
        enter(c10d, base + 110000, 0x6f00, kPid, {}, tn);
        e = enter(allreduce, base + 111000, 0x6e00, kPid,
                  {kSend, kRecv, 1024, 7, 0, kComm, kStream, 0});
        exit(e, base + 114100);
        enter(contiguous, base + 120000, 0x6f00);
        enter(clone, base + 121000, 0x6e00);
        enter(copy, base + 122000, 0x6d00);
        enter(view, base + 130000, 0x6f00);
        e = enter(allgather, base + 140000, 0x7000, kPid,
                  {kSend, kRecv + 0x1000, 256, 9, kComm, kStream, 0, 0});
        exit(e, base + 142500);
        // Exit lost: end unknown.
        enter(bcast, base + 150000, 0x7000, kPid, {0x10, 0x20, 64, 2, 0, kComm, 0, 0});
        // Split (color 3, key 1; the key register's upper half is garbage: an
        // int argument), then destroy the child.
        e = enter(split, base + 160000, 0x7000, kPid,
                  {kComm, 3, 0xdead000000000001, 0x7ffd2000, 0, 0, 0, 0});
        exit(e, base + 165000, 0, kSplitComm);
        e = enter(destroy, base + 170000, 0x7000, kPid, {kSplitComm, 0, 0, 0, 0, 0, 0, 0});
        exit(e, base + 171000);
        // A second thread.
        enter(add, base + 105000, 0x9000, kPid + 1);
        e = enter(send, base + 106000, 0x8f00, kPid + 1, {0x30, 16, 2, 1, kComm, kStream + 8, 0, 0});
        exit(e, base + 107000, 4);
    }

    snapshot::ProcessSnapshot report() const {
        snapshot::ProcessSnapshot r;
        r.pid = kPid;
        r.command = "python3 train.py";
        r.libraries = {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/lib/libtorch_cpu.so"};
        r.counters = {{allreduce, kComm, 7, 1, 1024, 4096, 0}, {c10d, 0, 0xffffffff, 1, 0, 0, 0},
                      {allgather, kComm, 9, 1, 256, 512, 0},   {bcast, kComm, 2, 1, 64, 256, 0},
                      {send, kComm, 2, 1, 16, 64, 1},          {init, 0, 0xffffffff, 1, 0, 0, 0},
                      {split, kComm, 0xffffffff, 1, 0, 0, 0},  {destroy, kSplitComm, 0xffffffff, 1, 0, 0, 0}};
        snapshot::CommInfo c;
        c.ptr = kComm;
        c.id = capture::nccl_comm_hash(uid);
        c.nranks = 2;
        c.rank = 0;
        c.origin = snapshot::CommOrigin::InitRank;
        c.init_ret = 0;
        snapshot::CommInfo child;
        child.ptr = kSplitComm;
        child.id = 0x1234abcd5678ef00;
        child.origin = snapshot::CommOrigin::Split;
        child.parent_ptr = kComm;
        child.init_ret = 0;
        child.destroyed = true;
        r.comms = {c, child};
        r.tree = model.process(kPid);
        r.notes = {"synthetic stream for the golden files"};
        return r;
    }
};

std::string golden_path(const std::string& name) {
    return std::string(SOURCE_DIR) + "/tests/golden/" + name;
}

// Compares with tests/golden/<name>; COMMDBG_UPDATE_GOLDEN=1 rewrites it.
void expect_golden(const std::string& name, const std::string& actual) {
    std::string path = golden_path(name);
    const char* update = std::getenv("COMMDBG_UPDATE_GOLDEN");
    if (update && std::string(update) == "1") {
        host::write_file_atomic(path, actual);
        return;
    }
    std::ifstream in(path);
    ASSERT_TRUE(in) << "missing golden " << path << " (run with COMMDBG_UPDATE_GOLDEN=1)";
    std::stringstream ss;
    ss << in.rdbuf();
    std::string expected = ss.str();
    if (expected == actual) return;
    std::istringstream a(actual), b(expected);
    std::string la, lb;
    int line = 1;
    while (true) {
        bool ga = static_cast<bool>(std::getline(a, la));
        bool gb = static_cast<bool>(std::getline(b, lb));
        if (!ga && !gb) break;
        if (!ga || !gb || la != lb) {
            ADD_FAILURE() << path << " differs at line " << line << "\n  expected: "
                          << (gb ? lb : "<eof>") << "\n  actual:   " << (ga ? la : "<eof>")
                          << "\n(COMMDBG_UPDATE_GOLDEN=1 rewrites it)\nfull actual output:\n"
                          << actual;
            return;
        }
        ++line;
    }
    ADD_FAILURE() << path << " differs (trailing newline?)";
}

// Every event has ph/ts/pid/tid; X events have dur >= 0 and nest properly per
// thread (a child lies inside its parent; no partial overlaps).
void check_trace_structure(const nlohmann::json& trace) {
    ASSERT_TRUE(trace.contains("traceEvents"));
    // In integer ns: days after boot, a double in us has no room for an epsilon.
    auto ns = [](const nlohmann::json& us) { return std::llround(us.get<double>() * 1000.0); };
    std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<int64_t, int64_t>>> by_thread;
    for (const auto& ev : trace["traceEvents"]) {
        for (const char* k : {"ph", "ts", "pid", "tid", "name"})
            ASSERT_TRUE(ev.contains(k)) << k << " missing in " << ev.dump();
        if (ev["ph"] != "X") continue;
        int64_t ts = ns(ev["ts"]), dur = ns(ev["dur"]);
        ASSERT_GE(dur, 0) << ev.dump();
        by_thread[{ev["pid"].get<uint64_t>(), ev["tid"].get<uint64_t>()}].push_back({ts, ts + dur});
    }
    for (auto& [key, spans] : by_thread) {
        std::stable_sort(spans.begin(), spans.end(), [](const auto& x, const auto& y) {
            return x.first < y.first || (x.first == y.first && x.second > y.second);
        });
        std::vector<int64_t> open_ends;
        for (const auto& [s, e] : spans) {
            while (!open_ends.empty() && open_ends.back() <= s) open_ends.pop_back();
            if (!open_ends.empty()) {
                ASSERT_LE(e, open_ends.back()) << "partial overlap on tid " << key.second;
            }
            open_ends.push_back(e);
        }
    }
}

}  // namespace

TEST(Render, TableGoldenAtEveryNoiseLevel) {
    Scenario s;
    for (int level = 0; level <= 3; ++level)
        expect_golden("table_noise" + std::to_string(level) + ".txt",
                      render_table(s.report(), s.t, level, false));
}

TEST(Render, JsonGolden) {
    Scenario s;
    expect_golden("report.json", to_json(s.report(), s.t, 1).dump(2) + "\n");
}

TEST(Render, FileFormHasNoAnsiAndColorFormHas) {
    Scenario s;
    for (int level = 0; level <= 3; ++level)
        EXPECT_EQ(render_table(s.report(), s.t, level, false).find('\x1b'), std::string::npos);
    EXPECT_NE(render_table(s.report(), s.t, 1, true).find('\x1b'), std::string::npos);
}

TEST(Render, NoiseLevelsHideTrivialOpsAndHoistTheirChildren) {
    Scenario s;
    auto r = s.report();
    std::string l1 = render_table(r, s.t, 1, false);
    EXPECT_EQ(l1.find("aten::clone"), std::string::npos);
    EXPECT_EQ(l1.find("model.layers.0"), std::string::npos);
    // copy_ sat under contiguous -> clone, both hidden: it takes contiguous's level.
    EXPECT_NE(l1.find("Op          aten::copy_\n"), std::string::npos);
    std::string l3 = render_table(r, s.t, 3, false);
    EXPECT_NE(l3.find("      aten::copy_\n"), std::string::npos);
    std::string l0 = render_table(r, s.t, 0, false);
    EXPECT_EQ(l0.find("aten::"), std::string::npos);
    EXPECT_NE(l0.find("Collective    ncclAllReduce count=1024 float32 sum"), std::string::npos);
    EXPECT_TRUE(is_trivial_op("aten::view.dtype"));
    // CommDebugMode's trivial ops (its _comm_mode.trivial_ops), and the two every DTensor op dispatches.
    for (const char* op : {"aten::detach", "aten::t", "aten::view", "aten::_to_copy", "aten::as_strided",
                           "aten::transpose.int", "aten::resolve_conj", "aten::resolve_neg"})
        EXPECT_TRUE(is_trivial_op(op)) << op;
    EXPECT_FALSE(is_trivial_op("aten::mm"));
    EXPECT_FALSE(is_trivial_op("aten::viewer"));
    EXPECT_FALSE(is_trivial_op("view"));
}

TEST(Render, TotalCountsComeFromCountersMinusNestedCollectives) {
    Scenario s;
    auto r = s.report();
    auto counts = comm_counts(r, s.t);
    EXPECT_EQ(counts.at("nccl.all_reduce"), 1u);
    EXPECT_EQ(counts.at("c10d.all_reduce"), 1u);
    EXPECT_EQ(counts.count("nccl.none"), 0u);  // comm init is not a collective
    EXPECT_EQ(r.tree->nested_collectives(), 1u);
    EXPECT_EQ(total_counts(r, s.t), 4u);  // 5 counted calls, c10d -> nccl once
    // Counters, never records: more calls than records were retained.
    r.counters[0].calls = 1000;
    EXPECT_EQ(comm_counts(r, s.t).at("nccl.all_reduce"), 1000u);
    EXPECT_EQ(total_counts(r, s.t), 1003u);
}

TEST(Render, JsonDerivesElementsFromCollKindAndGroupSize) {
    Scenario s;
    auto r = s.report();
    auto j = to_json(r, s.t, 0);
    const auto* ag = &j["records"][0];
    for (const auto& rec : j["records"])
        if (rec["name"] == "ncclAllGather") ag = &rec;
    EXPECT_EQ((*ag)["input_elements"], 256);
    EXPECT_EQ((*ag)["output_elements"], 512);
    EXPECT_EQ((*ag)["group_size"], 2);
    EXPECT_EQ((*ag)["dtype"], "bfloat16");
    EXPECT_EQ((*ag)["bytes"], 512);
    r.comms.clear();  // nranks unknown: no guess
    j = to_json(r, s.t, 0);
    for (const auto& rec : j["records"])
        if (rec["name"] == "ncclAllGather") {
            EXPECT_FALSE(rec.contains("output_elements"));
            EXPECT_FALSE(rec.contains("group_size"));
        }
    EXPECT_FALSE(j.contains("dropped_records"));
}

TEST(Render, DropsAreReportedInTableAndJson) {
    Scenario s(model::ModelLimits{.max_records = 3, .max_depth = 128});
    auto r = s.report();
    r.kernel_dropped_records = 7;
    uint64_t model_drops = r.tree->dropped_total();
    ASSERT_EQ(model_drops, 14u);  // 17 calls seen (group calls excluded), 3 kept
    auto j = to_json(r, s.t, 1);
    EXPECT_EQ(j["dropped_records"], 21);
    EXPECT_EQ(j["dropped_by_cause"]["kernel_ringbuf"], 7);
    EXPECT_EQ(j["dropped_by_cause"]["budget"], 14);
    EXPECT_EQ(j["dropped_by_cause"]["depth"], 0);
    std::string table = render_table(r, s.t, 1, false);
    EXPECT_NE(table.find("dropped records: kernel ring buffer 7, model budget 14, model depth 0"),
              std::string::npos);
    EXPECT_NE(table.find("warning: the call tree below is incomplete: 21 calls missing, 3 shown"),
              std::string::npos);
    // Counts stay exact whatever the tree lost.
    EXPECT_EQ(total_counts(r, s.t), 4u);
}

TEST(Render, MultiProcessJsonIsOrderedByPidAndSingleIsFlat) {
    Scenario s;
    auto a = s.report();
    auto b = s.report();
    b.pid = 17;
    b.tree = nullptr;
    auto multi = to_json(std::vector<snapshot::ProcessSnapshot>{a, b}, s.t, 1);
    ASSERT_EQ(multi["processes"].size(), 2u);
    EXPECT_EQ(multi["processes"][0]["process"]["pid"], 17);
    EXPECT_EQ(multi["processes"][1]["process"]["pid"], kPid);
    auto single = to_json(std::vector<snapshot::ProcessSnapshot>{a}, s.t, 1);
    EXPECT_FALSE(single.contains("processes"));
    EXPECT_EQ(single.begin().key(), "comm_counts");
}

TEST(Render, ChromeTraceIsStructurallyValid) {
    Scenario s;
    auto trace = chrome_trace({s.report()}, s.t);
    check_trace_structure(trace);
    size_t x = 0, meta = 0;
    for (const auto& ev : trace["traceEvents"]) (ev["ph"] == "X" ? x : meta)++;
    EXPECT_EQ(x, s.model.process(kPid)->records().size());
    EXPECT_EQ(meta, 3u);  // process + two threads
}

TEST(Render, ThreadNamesNameTheTracksAndAreInTheDump) {
    Scenario s;
    auto r = s.report();
    r.thread_names = {{kPid + 1, "pt_autograd_0"}};  // the main thread's name unknown
    std::map<uint64_t, std::string> track;
    const auto trace = chrome_trace({r}, s.t);
    for (const auto& ev : trace["traceEvents"])
        if (ev["name"] == "thread_name") track[ev["tid"].get<uint64_t>()] = ev["args"]["name"];
    EXPECT_EQ(track[kPid + 1], "pt_autograd_0");
    EXPECT_EQ(track[kPid], "tid " + std::to_string(kPid));
    auto j = to_json(r, s.t, 1);
    ASSERT_TRUE(j.contains("thread_names"));
    EXPECT_EQ(j["thread_names"], nlohmann::ordered_json({{std::to_string(kPid + 1), "pt_autograd_0"}}));
    EXPECT_FALSE(to_json(s.report(), s.t, 1).contains("thread_names"));  // none known: no key
}

TEST(Render, FramesStillOpenAtExitEndWithTheirLastChildNotAtTheExit) {
    // The last op of a thread stays open until the process exits, seconds
    // later: drawn to the exit it would look that long.  Its children bound it.
    capture::SymbolTable t;
    uint32_t op = t.intern(sym("aten::add_.Tensor", "aten", CD_ROLE_OP));
    uint32_t leaf = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE, {}, true));
    model::TraceModel m(t);
    capture::CallEnter e;
    e.tgid = e.tid = 1;
    e.ts_ns = 1'000'000;
    e.sp = 1000;
    e.cookie = make_cookie(op, *t.find(op));
    m.on_event(e);
    capture::CallEnter c = e;
    c.ts_ns = 1'010'000;
    c.sp = 900;
    c.cookie = make_cookie(leaf, *t.find(leaf));
    m.on_event(c);
    capture::CallExit x;
    x.tgid = x.tid = 1;
    x.ts_ns = 1'030'000;
    x.cookie = c.cookie;
    x.enter_ts_ns = c.ts_ns;
    m.on_event(x);
    m.on_event(capture::ProcExit{1, 5'000'000'000, 0});  // ~5 s later
    snapshot::ProcessSnapshot r;
    r.pid = 1;
    r.tree = m.process(1);
    auto trace = chrome_trace({r}, t);
    check_trace_structure(trace);
    bool seen = false;
    for (const auto& ev : trace["traceEvents"]) {
        if (ev["name"] != "aten::add_.Tensor") continue;
        seen = true;
        EXPECT_DOUBLE_EQ(ev["ts"].get<double>(), 1000.0);
        EXPECT_DOUBLE_EQ(ev["dur"].get<double>(), 30.0) << "ends with its last child";
        EXPECT_TRUE(ev["args"].value("end_at_exit", false));
        EXPECT_TRUE(ev["args"].value("end_unknown", false));
    }
    EXPECT_TRUE(seen);
    // The dump keeps the bound and says what it is.
    auto j = to_json(r, t, 1);
    EXPECT_EQ(j["records"][0]["end_ns"], 5'000'000'000u);
    EXPECT_TRUE(j["records"][0].value("end_at_exit", false));
}

TEST(Render, ChromeTraceClampsUnknownEndsInsideParents) {
    // Open frames with children, leaves without exits, a process that never ends.
    capture::SymbolTable t;
    uint32_t op = t.intern(sym("aten::mm", "aten", CD_ROLE_OP));
    uint32_t leaf = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE,
                                 {}, true));
    model::TraceModel m(t);
    auto ev = [&](uint32_t s, uint64_t ts, uint64_t sp, uint32_t tid) {
        capture::CallEnter e;
        e.tgid = 1;
        e.tid = tid;
        e.ts_ns = ts;
        e.sp = sp;
        e.cookie = make_cookie(s, *t.find(s));
        m.on_event(e);
    };
    ev(op, 1000, 1000, 1);
    ev(leaf, 1100, 900, 1);
    ev(leaf, 1200, 900, 1);  // 100 ns after its sibling: the stand-in must not overlap
    ev(op, 1300, 900, 1);
    ev(leaf, 5000, 800, 1);
    ev(leaf, 1500, 100, 2);
    snapshot::ProcessSnapshot r;
    r.pid = 1;
    r.tree = m.process(1);
    auto trace = chrome_trace({r}, t);
    check_trace_structure(trace);
    // Stand-in ends are bounded by the next sibling: no start had to move.
    std::multiset<double> starts;
    for (const model::Record& rec : r.tree->records()) starts.insert(static_cast<double>(rec.start_ns) / 1000.0);
    for (const auto& ev : trace["traceEvents"]) {
        if (ev["ph"] != "X") continue;
        auto it = starts.find(ev["ts"].get<double>());
        ASSERT_NE(it, starts.end()) << "start moved: " << ev.dump();
        starts.erase(it);
    }
    EXPECT_TRUE(starts.empty());
}

TEST(Render, WriteFileAtomicReplacesAndReportsFailures) {
    std::string dir = ::testing::TempDir();
    std::string path = dir + "/commdbg_atomic_test.txt";
    host::write_file_atomic(path, "first");
    host::write_file_atomic(path, "second");
    std::ifstream in(path);
    std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(got, "second");
    std::remove(path.c_str());
    try {
        host::write_file_atomic("/nonexistent-dir-commdbg/x.json", "x");
        FAIL() << "expected CommdbgError";
    } catch (const CommdbgError& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-commdbg/x.json"), std::string::npos);
    }
}

namespace {

const nlohmann::ordered_json* find_record(const nlohmann::ordered_json& recs, const std::string& name) {
    for (const auto& r : recs) {
        if (r["name"] == name) return &r;
        if (const auto* c = find_record(r["children"], name)) return c;
    }
    return nullptr;
}

std::string line_with(const std::string& text, const std::string& needle) {
    auto at = text.find(needle);
    if (at == std::string::npos) return {};
    auto begin = text.rfind('\n', at);
    begin = begin == std::string::npos ? 0 : begin + 1;
    return text.substr(begin, text.find('\n', at) - begin);
}

}  // namespace

TEST(Render, NcclRecordsCarryStreamAndBuffersInJsonTraceAndVerboseTable) {
    Scenario s;
    auto r = s.report();
    auto j = to_json(r, s.t, 1);
    const auto* ar = find_record(j["records"], "ncclAllReduce");
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ((*ar)["stream"], "0x5555a0000010");
    EXPECT_EQ((*ar)["sendbuff"], "0x7f0000200000");
    EXPECT_EQ((*ar)["recvbuff"], "0x7f0000400000");
    const auto* send = find_record(j["records"], "ncclSend");
    ASSERT_NE(send, nullptr);
    EXPECT_EQ((*send)["stream"], "0x5555a0000018");
    EXPECT_EQ((*send)["sendbuff"], "0x30");
    EXPECT_FALSE(send->contains("recvbuff"));  // no slot: no key
    const auto* bc = find_record(j["records"], "ncclBroadcast");
    ASSERT_NE(bc, nullptr);
    EXPECT_FALSE(bc->contains("stream") || bc->contains("sendbuff") || bc->contains("recvbuff"));

    bool seen = false;
    auto trace = chrome_trace({r}, s.t);
    for (const auto& ev : trace["traceEvents"]) {
        if (ev["name"] != "ncclAllReduce") continue;
        seen = true;
        EXPECT_EQ(ev["args"]["stream"], "0x5555a0000010");
        EXPECT_EQ(ev["args"]["sendbuff"], "0x7f0000200000");
        EXPECT_EQ(ev["args"]["recvbuff"], "0x7f0000400000");
    }
    EXPECT_TRUE(seen);

    // The default table stays readable: addresses from noise level 2 on.
    for (int level : {0, 1})
        EXPECT_EQ(render_table(r, s.t, level, false).find("stream="), std::string::npos) << level;
    std::string l2 = render_table(r, s.t, 2, false);
    EXPECT_NE(line_with(l2, "ncclAllReduce count=")
                  .find(" stream=0x5555a0000010 sendbuff=0x7f0000200000 recvbuff=0x7f0000400000"),
              std::string::npos)
        << l2;
    EXPECT_EQ(line_with(l2, "ncclSend ").find("recvbuff="), std::string::npos);
}

TEST(Render, CommunicatorCallsAreShownWithTheMeaningOfTheirSlots) {
    Scenario s;
    auto r = s.report();
    std::string id = hex16(*r.comms[0].id);
    std::string table = render_table(r, s.t, 0, false);
    std::string init = line_with(table, "ncclCommInitRank");
    EXPECT_NE(init.find("ncclCommInitRank nranks=2 rank=0 new_comm=0x5555c0ffee00 id=" + id + " ret=0"),
              std::string::npos)
        << init;
    std::string split = line_with(table, "ncclCommSplit");
    EXPECT_NE(split.find("ncclCommSplit parent=0x5555c0ffee00 color=3 key=1 new_comm=0x5555c0ffef00 "
                         "id=0x1234abcd5678ef00 ret=0"),
              std::string::npos)
        << split;
    std::string destroy = line_with(table, "ncclCommDestroy");
    EXPECT_NE(destroy.find("ncclCommDestroy comm=0x5555c0ffef00 ret=0"), std::string::npos) << destroy;
    for (const std::string& l : {init, split, destroy})
        for (const char* generic : {"count=", "root=", "peer="})
            EXPECT_EQ(l.find(generic), std::string::npos) << l;

    auto j = to_json(r, s.t, 0);
    const auto* ji = find_record(j["records"], "ncclCommInitRank");
    ASSERT_NE(ji, nullptr);
    EXPECT_EQ((*ji)["nranks"], 2);
    EXPECT_EQ((*ji)["rank"], 0);
    EXPECT_EQ((*ji)["new_comm"], "0x5555c0ffee00");
    EXPECT_EQ((*ji)["new_comm_id"], id);
    const auto* js = find_record(j["records"], "ncclCommSplit");
    ASSERT_NE(js, nullptr);
    EXPECT_EQ((*js)["parent"], "0x5555c0ffee00");
    EXPECT_EQ((*js)["color"], 3);
    EXPECT_EQ((*js)["key"], 1);  // an int: the register's upper half is ignored
    EXPECT_EQ((*js)["new_comm"], "0x5555c0ffef00");
    EXPECT_EQ((*js)["new_comm_id"], "0x1234abcd5678ef00");
    const auto* jd = find_record(j["records"], "ncclCommDestroy");
    ASSERT_NE(jd, nullptr);
    EXPECT_EQ((*jd)["comm"], "0x5555c0ffef00");
    EXPECT_EQ((*jd)["comm_id"], "0x1234abcd5678ef00");
    for (const auto* rec : {ji, js, jd})
        for (const char* generic : {"input_elements", "output_elements", "root", "peer", "parent_comm"})
            EXPECT_FALSE(rec->contains(generic)) << generic << " in " << rec->dump();
    EXPECT_FALSE(ji->contains("comm"));
    EXPECT_FALSE(js->contains("comm"));

    // Unknown ids: no new_comm_id, no id=.
    r.comms.clear();
    j = to_json(r, s.t, 0);
    EXPECT_FALSE(find_record(j["records"], "ncclCommInitRank")->contains("new_comm_id"));
    EXPECT_FALSE(find_record(j["records"], "ncclCommSplit")->contains("new_comm_id"));
    EXPECT_EQ(line_with(render_table(r, s.t, 0, false), "ncclCommSplit").find(" id="), std::string::npos);
}

TEST(Render, CommInitAllShowsTheDeviceCount) {
    capture::SymbolTable t;
    capture::SymbolInfo all = sym("ncclCommInitAll", "nccl", CD_ROLE_COMM_INIT, CD_COLL_NONE,
                         {1, CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE, 0}, true);
    all.tail = CD_TAIL_COMM_LIST;
    uint32_t id = t.intern(all);
    model::TraceModel m(t);
    capture::CallEnter e;
    e.tgid = e.tid = 1;
    e.ts_ns = 100;
    e.sp = 0x1000;
    e.cookie = make_cookie(id, *t.find(id));
    e.args = {0x7ffd0000, 4, 0, 0, 0, 0, 0, 0};
    m.on_event(e);
    capture::CallExit x;
    x.tgid = x.tid = 1;
    x.ts_ns = 200;
    x.cookie = e.cookie;
    x.enter_ts_ns = e.ts_ns;
    x.out_value = 0xabc0;
    m.on_event(x);
    snapshot::ProcessSnapshot r;
    r.pid = 1;
    r.tree = m.process(1);
    EXPECT_NE(render_table(r, t, 0, false).find("ncclCommInitAll ndev=4 new_comm=0xabc0 ret=0"),
              std::string::npos)
        << render_table(r, t, 0, false);
    auto j = to_json(r, t, 0);
    EXPECT_EQ(j["records"][0]["ndev"], 4);
    EXPECT_FALSE(j["records"][0].contains("nranks"));
    EXPECT_FALSE(j["records"][0].contains("rank"));
    EXPECT_EQ(j["records"][0]["new_comm"], "0xabc0");
}

TEST(Render, JsonCountersAreExactAndSortedAndCommBytesSumsCollectives) {
    Scenario s;
    auto r = s.report();
    // Out of order on purpose; two rows with one key keep their input order.
    r.counters.push_back({s.allreduce, kComm, 0, 2, 20, 20, 0});
    r.counters.push_back({s.allreduce, 0x1, 7, 3, 30, 120, 2});
    r.counters.push_back({s.allreduce, kComm, 0, 4, 40, 40, 0});
    auto j = to_json(r, s.t, 1);
    // The CommDebugMode keys stay first.
    auto it = j.begin();
    EXPECT_EQ(it.key(), "comm_counts");
    EXPECT_EQ((++it).key(), "total_counts");
    EXPECT_EQ((++it).key(), "comm_bytes");
    EXPECT_EQ((++it).key(), "counters");
    EXPECT_EQ((++it).key(), "records");

    EXPECT_EQ(j["comm_bytes"]["nccl.all_reduce"], 4096 + 20 + 120 + 40);
    EXPECT_EQ(j["comm_bytes"]["nccl.all_gather"], 512);
    EXPECT_EQ(j["comm_bytes"]["nccl.send"], 64);
    EXPECT_EQ(j["comm_bytes"]["c10d.all_reduce"], 0);
    EXPECT_EQ(j["comm_bytes"].size(), j["comm_counts"].size());  // collective role only
    EXPECT_FALSE(j["comm_bytes"].contains("nccl.none"));
    EXPECT_EQ(comm_bytes(r, s.t).at("nccl.broadcast"), 256u);

    const auto& rows = j["counters"];
    ASSERT_EQ(rows.size(), r.counters.size());
    std::vector<std::string> names;
    for (const auto& row : rows) names.push_back(row["name"].get<std::string>());
    EXPECT_EQ(names, (std::vector<std::string>{
                         "c10d::ProcessGroupNCCL::allreduce", "ncclAllGather", "ncclAllReduce",
                         "ncclAllReduce", "ncclAllReduce", "ncclAllReduce", "ncclBroadcast",
                         "ncclCommDestroy", "ncclCommInitRank", "ncclCommSplit", "ncclSend"}));
    // ncclAllReduce rows: by comm, then dtype (int8 = 0 before float32 = 7), then input order.
    EXPECT_EQ(rows[2]["comm"], "0x1");
    EXPECT_EQ(rows[2]["calls"], 3);
    EXPECT_EQ(rows[2]["errors"], 2);
    EXPECT_FALSE(rows[2].contains("comm_id"));  // an unknown communicator
    EXPECT_EQ(rows[3]["dtype"], "int8");
    EXPECT_EQ(rows[3]["calls"], 2);
    EXPECT_EQ(rows[4]["calls"], 4);
    const auto& ar = rows[5];
    EXPECT_EQ(ar["layer"], "nccl");
    EXPECT_EQ(ar["collective"], "all_reduce");
    EXPECT_EQ(ar["comm"], "0x5555c0ffee00");
    EXPECT_EQ(ar["comm_id"], hex16(*r.comms[0].id));
    EXPECT_EQ(ar["dtype"], "float32");
    EXPECT_EQ(ar["calls"], 1);
    EXPECT_EQ(ar["elements"], 1024);
    EXPECT_EQ(ar["bytes"], 4096);
    EXPECT_EQ(ar["errors"], 0);
    const auto& init = rows[8];
    EXPECT_EQ(init["comm"], "0x0");
    EXPECT_FALSE(init.contains("collective"));
    EXPECT_FALSE(init.contains("dtype"));
    EXPECT_FALSE(init.contains("comm_id"));
    EXPECT_EQ(rows[7]["comm_id"], "0x1234abcd5678ef00");
    EXPECT_EQ(rows[10]["errors"], 1);
}

TEST(Render, TableSummaryShowsCallsBytesAndErrorsPerKind) {
    Scenario s;
    auto r = s.report();
    std::string table = render_table(r, s.t, 1, false);
    std::string ar = line_with(table, "  nccl.all_reduce ");
    EXPECT_NE(ar.find("calls=1 "), std::string::npos) << ar;
    EXPECT_NE(ar.find("bytes=4096"), std::string::npos) << ar;
    EXPECT_EQ(ar.find("errors="), std::string::npos) << ar;  // only when > 0
    std::string send = line_with(table, "  nccl.send ");
    EXPECT_NE(send.find("calls=1 "), std::string::npos) << send;
    EXPECT_NE(send.find("bytes=64"), std::string::npos) << send;
    EXPECT_NE(send.find("errors=1"), std::string::npos) << send;
    auto sum = coll_summary(r, s.t);
    EXPECT_EQ(sum.at("nccl.send").errors, 1u);
    EXPECT_EQ(sum.at("nccl.all_gather").bytes, 512u);
    EXPECT_EQ(sum.count("nccl.none"), 0u);
}

// ---- the trace in Perfetto --------------------------------------------------
// The file is loaded into Perfetto's own trace processor (the engine of the
// Perfetto UI) and what Perfetto then shows -- slices, their threads, depths,
// parents, times, names, args -- must be what the file says.

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
    std::string path = ::testing::TempDir() + "/commdbg_" + name;
    host::write_file_atomic(path, text);
    return path;
}

// A random stream as the kernel sends it: per thread, nested entry-only ops
// (each level 256 bytes deeper on the stack), NCCL collectives with entry and
// exit as leaves, one exit in ten lost; the threads of two processes
// interleaved in time, about ten days after boot, to the nanosecond.
struct RandomStream {
    using Ev = std::variant<capture::CallEnter, capture::CallExit>;
    capture::SymbolTable t;
    std::vector<uint32_t> ops, colls;
    std::mt19937_64 rng{20261129};
    model::TraceModel model;
    std::vector<Ev> events;

    static uint64_t ts_of(const Ev& e) {
        return std::visit([](const auto& x) { return x.ts_ns; }, e);
    }

    void gen(uint32_t pid, uint32_t tid, int depth, uint64_t sp, uint64_t& now) {
        int n = depth == 0 ? 60 : static_cast<int>(rng() % 4) + 1;
        for (int i = 0; i < n; ++i) {
            now += rng() % 5000 + 1;
            capture::CallEnter e;
            e.tgid = pid;
            e.tid = tid;
            e.ts_ns = now;
            e.sp = sp;
            if (depth < 6 && rng() % 3 != 0) {
                uint32_t s = ops[rng() % ops.size()];
                e.cookie = make_cookie(s, *t.find(s));
                events.push_back(e);
                gen(pid, tid, depth + 1, sp - 0x100, now);
            } else {
                uint32_t s = colls[rng() % colls.size()];
                e.cookie = make_cookie(s, *t.find(s));
                e.args = {0x7f0000200000, 0x7f0000400000, rng() % 100000 + 1, 7, 0, 0x5555c0ffee00, 0, 0};
                events.push_back(e);
                if (rng() % 10 != 0) {
                    now += rng() % 20000;
                    capture::CallExit x;
                    x.tgid = pid;
                    x.tid = tid;
                    x.ts_ns = now;
                    x.cookie = e.cookie;
                    x.enter_ts_ns = e.ts_ns;
                    events.push_back(x);
                }
            }
        }
    }

    RandomStream() : model(t) {
        for (const char* n : {"aten::linear", "aten::addmm", "aten::mm", "aten::add.Tensor", "aten::view"})
            ops.push_back(t.intern(sym(n, "aten", CD_ROLE_OP)));
        ops.push_back(t.intern(sym("c10d::ProcessGroupNCCL::allreduce", "c10d", CD_ROLE_COLLECTIVE,
                                   CD_COLL_ALL_REDUCE)));
        colls.push_back(t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE,
                                     with_buffers({2, 3, 5, 4}, 0, 1, 6), true)));
        colls.push_back(t.intern(sym("ncclAllGather", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_GATHER,
                                     with_buffers({2, 3, 4}, 0, 1, 5), true)));
        const uint64_t boot_plus_10d = 864'000'000'000'000 + 123'457;
        for (uint32_t pid : {7001u, 7002u}) {
            for (uint32_t tid : {pid, pid + 1, pid + 2}) {
                uint64_t now = boot_plus_10d + rng() % 1'000'000;
                gen(pid, tid, 0, 0x7ffd0000, now);
            }
        }
        std::stable_sort(events.begin(), events.end(),
                         [](const Ev& a, const Ev& b) { return ts_of(a) < ts_of(b); });
        for (const auto& e : events) std::visit([&](const auto& x) { model.on_event(x); }, e);
    }

    std::vector<snapshot::ProcessSnapshot> reports() const {
        std::vector<snapshot::ProcessSnapshot> out;
        for (uint32_t pid : {7001u, 7002u}) {
            snapshot::ProcessSnapshot r;
            r.pid = pid;
            r.command = "python3 train.py --rank " + std::to_string(pid - 7001);
            r.tree = model.process(pid);
            out.push_back(r);
        }
        return out;
    }
};

// The call tree as the model built it, in Perfetto's terms: each record's
// thread, start, name, depth and parent's name.  Perfetto must show this.
std::vector<perfetto_check::Slice> tree_as_slices(const std::vector<snapshot::ProcessSnapshot>& reports,
                                                 const capture::SymbolTable& syms) {
    std::vector<perfetto_check::Slice> out;
    for (const auto& r : reports) {
        const auto& recs = r.tree->records();
        for (const model::Record& rec : recs) {
            perfetto_check::Slice sl;
            sl.pid = r.pid;
            sl.tid = rec.tid;
            sl.ts = static_cast<int64_t>(rec.start_ns);
            sl.name = record_name(rec, syms);
            for (uint32_t p = rec.parent; p != model::kNoRecord; p = recs[p].parent) {
                if (sl.depth++ == 0) sl.parent = record_name(recs[p], syms);
            }
            out.push_back(sl);
        }
    }
    return out;
}

// Perfetto's slices against the model's tree, matched by thread, start and name.
std::vector<std::string> compare_with_tree(const perfetto_check::Loaded& got,
                                           std::vector<perfetto_check::Slice> want) {
    auto key = [](const perfetto_check::Slice& s) { return std::tie(s.pid, s.tid, s.ts, s.depth, s.name); };
    std::stable_sort(want.begin(), want.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
    std::vector<std::string> diffs;
    if (got.slices.size() != want.size())
        diffs.push_back(std::to_string(got.slices.size()) + " slices for " + std::to_string(want.size()) + " records");
    for (size_t i = 0; i < std::min(got.slices.size(), want.size()) && diffs.size() < 10; ++i) {
        const auto &g = got.slices[i], &w = want[i];
        if (g.pid != w.pid || g.tid != w.tid || g.ts != w.ts || g.name != w.name || g.depth != w.depth ||
            g.parent != w.parent)
            diffs.push_back("Perfetto: tid " + std::to_string(g.tid) + " ts " + std::to_string(g.ts) + " '" +
                            g.name + "' depth " + std::to_string(g.depth) + " under '" + g.parent +
                            "'; model: tid " + std::to_string(w.tid) + " ts " + std::to_string(w.ts) + " '" +
                            w.name + "' depth " + std::to_string(w.depth) + " under '" + w.parent + "'");
    }
    return diffs;
}

}  // namespace

TEST(Render, ChromeTraceOpensInPerfettoAsWritten) {
    REQUIRE_PERFETTO();
    Scenario s;
    auto trace = chrome_trace({s.report()}, s.t);
    auto loaded = perfetto_check::load_in_perfetto(write_temp("scenario.trace.json", trace.dump()));
    auto diffs = perfetto_check::compare_with_file(loaded, trace);
    EXPECT_TRUE(diffs.empty()) << "Perfetto " << loaded.perfetto_version << ":\n" << perfetto_check::lines(diffs);
    // Every record is a slice, and the nesting the table shows is Perfetto's.
    EXPECT_EQ(loaded.slices.size(), s.model.process(kPid)->records().size());
    diffs = compare_with_tree(loaded, tree_as_slices({s.report()}, s.t));
    EXPECT_TRUE(diffs.empty()) << perfetto_check::lines(diffs);
    auto parent_of = [&](const std::string& name) {
        for (const auto& sl : loaded.slices)
            if (sl.name == name) return sl.parent;
        return std::string("<no slice named " + name + ">");
    };
    EXPECT_EQ(parent_of("aten::addmm"), "aten::linear");
    EXPECT_EQ(parent_of("ncclAllReduce"), "c10d::ProcessGroupNCCL::allreduce");
    EXPECT_EQ(parent_of("aten::linear"), "model.layers.0 (Linear)");
}

TEST(Render, DeepInterleavedTraceOfTwoProcessesOpensInPerfettoAsWritten) {
    REQUIRE_PERFETTO();
    RandomStream rs;
    auto reports = rs.reports();
    size_t records = 0;
    int64_t deepest = 0;
    for (const auto& r : reports) records += r.tree->records().size();
    auto trace = chrome_trace(reports, rs.t);
    check_trace_structure(trace);
    auto loaded = perfetto_check::load_in_perfetto(write_temp("random.trace.json", trace.dump()));
    auto diffs = perfetto_check::compare_with_file(loaded, trace);
    EXPECT_TRUE(diffs.empty()) << "Perfetto " << loaded.perfetto_version << ":\n" << perfetto_check::lines(diffs);
    EXPECT_EQ(loaded.slices.size(), records);
    diffs = compare_with_tree(loaded, tree_as_slices(reports, rs.t));
    EXPECT_TRUE(diffs.empty()) << perfetto_check::lines(diffs);
    for (const auto& sl : loaded.slices) deepest = std::max(deepest, sl.depth);
    EXPECT_GE(deepest, 4) << "the stream is meant to nest deeply";
    std::set<std::pair<uint64_t, uint64_t>> threads;
    for (const auto& sl : loaded.slices) threads.insert({sl.pid, sl.tid});
    EXPECT_EQ(threads.size(), 6u);
}

TEST(Render, PerfettoCheckCatchesATraceTheViewerMisreads) {
    // The check itself must fail on a trace Perfetto shows wrongly: with
    // "displayTimeUnit": "ns" (what commdbg once wrote) this Perfetto build
    // reads ts/dur as ns, every slice 1000x early and short; a truncated file
    // loses slices.
    REQUIRE_PERFETTO();
    Scenario s;
    auto trace = chrome_trace({s.report()}, s.t);
    auto ns_unit = trace;
    ns_unit["displayTimeUnit"] = "ns";
    auto diffs = perfetto_check::compare_with_file(
        perfetto_check::load_in_perfetto(write_temp("ns_unit.trace.json", ns_unit.dump())), ns_unit);
    EXPECT_FALSE(diffs.empty());
    EXPECT_NE(perfetto_check::lines(diffs).find("Perfetto shows pid"), std::string::npos) << perfetto_check::lines(diffs);

    std::string text = trace.dump();
    auto cut = perfetto_check::load_in_perfetto(write_temp("cut.trace.json", text.substr(0, text.size() / 2)));
    EXPECT_FALSE(perfetto_check::compare_with_file(cut, trace).empty());
}

// ---- streamed text = the json value's text -----------------------------------
// The session writes the dump and the trace with to_json_text() and
// chrome_trace_text() (a record at a time); they must be byte for byte what
// the json values (which the golden files pin) dump to.

TEST(Render, StreamedJsonTextIsTheDumpOfTheJsonValue) {
    Scenario s;
    auto one = s.report();
    auto two = s.report();
    two.pid = 17;  // a second process; a third without a tree
    auto none = s.report();
    none.pid = 99;
    none.tree = nullptr;
    nlohmann::ordered_json extra = {{"kernel_drops", {{"ringbuf_full", 3}}}};
    for (int level = 0; level <= 3; ++level) {
        SCOPED_TRACE("noise level " + std::to_string(level));
        for (const auto& ps :
             {std::vector<snapshot::ProcessSnapshot>{one}, std::vector<snapshot::ProcessSnapshot>{one, two, none},
              std::vector<snapshot::ProcessSnapshot>{none}, std::vector<snapshot::ProcessSnapshot>{}}) {
            auto j = to_json(ps, s.t, level);
            EXPECT_EQ(to_json_text(ps, s.t, level), j.dump(2));
            for (const auto& [k, v] : extra.items()) j[k] = v;
            EXPECT_EQ(to_json_text(ps, s.t, level, extra), j.dump(2));
        }
    }
    RandomStream rs;
    EXPECT_EQ(to_json_text(rs.reports(), rs.t, 1), to_json(rs.reports(), rs.t, 1).dump(2));
}

TEST(Render, StreamedTraceTextIsTheDumpOfTheTraceValue) {
    Scenario s;
    auto none = s.report();
    none.pid = 1;
    none.tree = nullptr;
    EXPECT_EQ(chrome_trace_text({s.report(), none}, s.t), chrome_trace({s.report(), none}, s.t).dump());
    EXPECT_EQ(chrome_trace_text({}, s.t), chrome_trace({}, s.t).dump());
    RandomStream rs;
    EXPECT_EQ(chrome_trace_text(rs.reports(), rs.t), chrome_trace(rs.reports(), rs.t).dump());
}
