// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "nccl.hpp"
#include "report.hpp"
#include "result.hpp"

using namespace commdbg;

namespace {

constexpr uint32_t kPid = 4242;
constexpr uint64_t kComm = 0x5555c0ffee00;

SymbolInfo sym(const char* name, const char* layer, cd_role role, cd_coll coll = CD_COLL_NONE,
               ArgSlots slots = {}, bool ret = false) {
    SymbolInfo s;
    s.name = name;
    s.layer = layer;
    s.role = role;
    s.coll = coll;
    s.slots = slots;
    s.return_probe = ret;
    return s;
}

// One synthetic window: a module with ops, a c10d collective issuing an NCCL
// one, trivial ops hiding a real one, a call whose exit never came, and a
// second thread.
struct Scenario {
    SymbolTable t;
    uint32_t init = t.intern(sym("ncclCommInitRank", "nccl", CD_ROLE_COMM_INIT, CD_COLL_NONE,
                                 {CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE, CD_SLOT_NONE,
                                  CD_SLOT_NONE, 0},
                                 true));
    uint32_t allreduce = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE,
                                      CD_COLL_ALL_REDUCE, {2, 3, 5, 4}, true));
    uint32_t allgather = t.intern(sym("ncclAllGather", "nccl", CD_ROLE_COLLECTIVE,
                                      CD_COLL_ALL_GATHER, {2, 3, 4}, true));
    uint32_t bcast = t.intern(sym("ncclBroadcast", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_BROADCAST,
                                  {2, 3, 5, CD_SLOT_NONE, 4}, true));
    uint32_t send = t.intern(sym("ncclSend", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_SEND,
                                 {1, 2, 4, CD_SLOT_NONE, 3}, true));
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
    TraceModel model;

    CallEnter enter(uint32_t s, uint64_t ts, uint64_t sp, uint32_t tid = kPid,
                    std::array<uint64_t, CD_NUM_ARGS> args = {}) {
        CallEnter e;
        e.tgid = kPid;
        e.tid = tid;
        e.ts_ns = ts;
        e.sp = sp;
        e.cookie = make_cookie(s, *t.find(s));
        e.args = args;
        model.on_event(e);
        return e;
    }
    void exit(const CallEnter& e, uint64_t ts, int64_t ret = 0, uint64_t out = 0) {
        CallExit x;
        x.tgid = e.tgid;
        x.tid = e.tid;
        x.ts_ns = ts;
        x.cookie = e.cookie;
        x.enter_ts_ns = e.ts_ns;
        x.ret = ret;
        x.out_value = out;
        model.on_event(x);
    }

    explicit Scenario(ModelLimits limits = {}) : model(t, limits) {
        for (int i = 0; i < CD_UNIQUE_ID_BYTES; ++i) uid[i] = static_cast<uint8_t>(i * 37);
        const uint64_t base = 1'000'000'000;
        auto e = enter(init, base + 1000, 0x7000);
        exit(e, base + 91000, 0, kComm);
        enter(module, base + 100000, 0x7000);
        enter(linear, base + 101000, 0x6f00);
        enter(tr, base + 102000, 0x6e00);
        enter(addmm, base + 103000, 0x6e00);
        enter(c10d, base + 110000, 0x6f00);
        e = enter(allreduce, base + 111000, 0x6e00, kPid, {0x10, 0x20, 1024, 7, 0, kComm, 0, 0});
        exit(e, base + 114100);
        enter(contiguous, base + 120000, 0x6f00);
        enter(clone, base + 121000, 0x6e00);
        enter(copy, base + 122000, 0x6d00);
        enter(view, base + 130000, 0x6f00);
        e = enter(allgather, base + 140000, 0x7000, kPid, {0x10, 0x20, 256, 9, kComm, 0, 0, 0});
        exit(e, base + 142500);
        // Exit lost: end unknown.
        enter(bcast, base + 150000, 0x7000, kPid, {0x10, 0x20, 64, 2, 0, kComm, 0, 0});
        // A second thread.
        enter(add, base + 105000, 0x9000, kPid + 1);
        e = enter(send, base + 106000, 0x8f00, kPid + 1, {0x30, 16, 2, 1, kComm, 0, 0, 0});
        exit(e, base + 107000, 4);
    }

    ProcessReport report() const {
        ProcessReport r;
        r.pid = kPid;
        r.command = "python3 train.py";
        r.libraries = {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/lib/libtorch_cpu.so"};
        r.counters = {{allreduce, kComm, 7, 1, 1024, 4096, 0}, {c10d, 0, 0xffffffff, 1, 0, 0, 0},
                      {allgather, kComm, 9, 1, 256, 512, 0},   {bcast, kComm, 2, 1, 64, 256, 0},
                      {send, kComm, 2, 1, 16, 64, 1},          {init, 0, 0xffffffff, 1, 0, 0, 0}};
        CommInfo c;
        c.ptr = kComm;
        c.id = nccl_comm_hash(uid);
        c.nranks = 2;
        c.rank = 0;
        c.origin = "init_rank";
        c.init_ret = 0;
        r.comms = {c};
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
        write_file_atomic(path, actual);
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
    std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<double, double>>> by_thread;
    for (const auto& ev : trace["traceEvents"]) {
        for (const char* k : {"ph", "ts", "pid", "tid", "name"})
            ASSERT_TRUE(ev.contains(k)) << k << " missing in " << ev.dump();
        if (ev["ph"] != "X") continue;
        double ts = ev["ts"].get<double>(), dur = ev["dur"].get<double>();
        ASSERT_GE(dur, 0.0) << ev.dump();
        by_thread[{ev["pid"].get<uint64_t>(), ev["tid"].get<uint64_t>()}].push_back({ts, ts + dur});
    }
    const double eps = 1e-6;
    for (auto& [key, spans] : by_thread) {
        std::stable_sort(spans.begin(), spans.end(), [](const auto& x, const auto& y) {
            return x.first < y.first || (x.first == y.first && x.second > y.second);
        });
        std::vector<double> open_ends;
        for (const auto& [s, e] : spans) {
            while (!open_ends.empty() && open_ends.back() <= s + eps) open_ends.pop_back();
            if (!open_ends.empty()) {
                ASSERT_LE(e, open_ends.back() + eps) << "partial overlap on tid " << key.second;
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
    Scenario s(ModelLimits{.max_records = 3, .max_depth = 128});
    auto r = s.report();
    r.kernel_dropped_records = 7;
    uint64_t model_drops = r.tree->dropped_total();
    ASSERT_EQ(model_drops, 12u);  // 15 calls seen (group calls excluded), 3 kept
    auto j = to_json(r, s.t, 1);
    EXPECT_EQ(j["dropped_records"], 19);
    EXPECT_EQ(j["dropped_by_cause"]["kernel_ringbuf"], 7);
    EXPECT_EQ(j["dropped_by_cause"]["budget"], 12);
    EXPECT_EQ(j["dropped_by_cause"]["depth"], 0);
    std::string table = render_table(r, s.t, 1, false);
    EXPECT_NE(table.find("dropped records: kernel ring buffer 7, model budget 12, model depth 0"),
              std::string::npos);
    EXPECT_NE(table.find("warning: the call tree below is incomplete: 19 calls missing, 3 shown"),
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
    auto multi = to_json(std::vector<ProcessReport>{a, b}, s.t, 1);
    ASSERT_EQ(multi["processes"].size(), 2u);
    EXPECT_EQ(multi["processes"][0]["process"]["pid"], 17);
    EXPECT_EQ(multi["processes"][1]["process"]["pid"], kPid);
    auto single = to_json(std::vector<ProcessReport>{a}, s.t, 1);
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

TEST(Render, ChromeTraceClampsUnknownEndsInsideParents) {
    // Open frames with children, leaves without exits, a process that never ends.
    SymbolTable t;
    uint32_t op = t.intern(sym("aten::mm", "aten", CD_ROLE_OP));
    uint32_t leaf = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, CD_COLL_ALL_REDUCE,
                                 {}, true));
    TraceModel m(t);
    auto ev = [&](uint32_t s, uint64_t ts, uint64_t sp, uint32_t tid) {
        CallEnter e;
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
    ProcessReport r;
    r.pid = 1;
    r.tree = m.process(1);
    auto trace = chrome_trace({r}, t);
    check_trace_structure(trace);
    // Stand-in ends are bounded by the next sibling: no start had to move.
    std::multiset<double> starts;
    for (const Record& rec : r.tree->records()) starts.insert(static_cast<double>(rec.start_ns) / 1000.0);
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
    write_file_atomic(path, "first");
    write_file_atomic(path, "second");
    std::ifstream in(path);
    std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(got, "second");
    std::remove(path.c_str());
    try {
        write_file_atomic("/nonexistent-dir-commdbg/x.json", "x");
        FAIL() << "expected CommdbgError";
    } catch (const CommdbgError& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-commdbg/x.json"), std::string::npos);
    }
}
