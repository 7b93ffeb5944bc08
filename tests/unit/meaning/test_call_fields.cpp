// SPDX-License-Identifier: Apache-2.0
// A call is decoded once (call_fields.hpp) and every output formats those
// fields.  Shown here from the spec end: a copy of the built-in NCCL spec
// gains a symbol with a stream argument in a register, and the stream reaches
// the table, the JSON dump and the trace with no renderer knowing the symbol.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "call_fields.hpp"
#include "model.hpp"
#include "probe_spec.hpp"
#include "render.hpp"

using namespace commdbg;
using namespace commdbg::meaning;

namespace {

constexpr uint32_t kPid = 777;

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The spec as a user would extend it: the shipped file plus one symbol.
capture::ProbeSpec spec_with_new_symbol() {
    auto j = nlohmann::json::parse(read_file(std::string(SOURCE_DIR) + "/specs/nccl.json"));
    j["symbols"].push_back({{"match", "ncclAllReduceOnStream"},
                            {"role", "collective"},
                            {"collective", "all_reduce"},
                            {"args", {{"count", 0}, {"dtype", 1}, {"comm", 2}, {"stream", 3}}}});
    auto spec = capture::parse_probe_spec(j.dump(), "test copy of nccl.json");
    EXPECT_TRUE(spec.ok()) << (spec.ok() ? "" : spec.error());
    return spec.value();
}

}  // namespace

TEST(CallFields, AStreamArgumentAddedInASpecReachesTableJsonAndTrace) {
    capture::ProbeSpec spec = spec_with_new_symbol();
    const capture::SymbolRule* rule = nullptr;
    for (const auto& r : spec.symbols)
        if (r.match == "ncclAllReduceOnStream") rule = &r;
    ASSERT_NE(rule, nullptr);
    capture::SymbolInfo info = rule->info;
    info.name = "ncclAllReduceOnStream";
    info.layer = spec.layer;
    info.return_probe = spec.return_probes;
    capture::SymbolTable syms;
    uint32_t id = syms.intern(info);

    model::TraceModel model(syms);
    capture::CallEnter e;
    e.tgid = e.tid = kPid;
    e.ts_ns = 1000;
    e.sp = 0x7000;
    e.cookie = make_cookie(id, *syms.find(id));
    e.args = {64, 7, 0x1000, 0xabc0, 0, 0, 0, 0};  // count, float32, comm, stream
    capture::CallExit x;
    x.tgid = x.tid = kPid;
    x.ts_ns = 3000;
    x.cookie = e.cookie;
    x.enter_ts_ns = e.ts_ns;
    model.on_event(capture::Call{e, x});
    snapshot::ProcessSnapshot p;
    p.pid = kPid;
    p.tree = model.process(kPid);
    ASSERT_NE(p.tree, nullptr);
    ASSERT_EQ(p.tree->records().size(), 1u);

    // Decoded once, typed.
    auto fields = call_fields(p.tree->records()[0], p, syms);
    auto stream = std::find_if(fields.begin(), fields.end(), [](const CallField& f) { return f.key == "stream"; });
    ASSERT_NE(stream, fields.end());
    EXPECT_EQ(stream->type, FieldType::Hex);
    EXPECT_EQ(stream->u, 0xabc0u);

    // Formatted by each output.
    std::string table = output::render_table(p, syms, 2, false);
    EXPECT_NE(table.find("ncclAllReduceOnStream count=64 float32 comm=0x1000 stream=0xabc0 ret=0"), std::string::npos)
        << table;
    EXPECT_EQ(output::render_table(p, syms, 1, false).find("stream="), std::string::npos) << "addresses are level 2";
    auto j = output::to_json(p, syms, 1);
    ASSERT_EQ(j["records"].size(), 1u);
    EXPECT_EQ(j["records"][0]["stream"], "0xabc0");
    EXPECT_EQ(j["records"][0]["dtype"], "float32");
    EXPECT_EQ(j["records"][0]["host_enqueue_ns"], 2000);
    auto trace = output::chrome_trace({p}, syms);
    const nlohmann::json* call = nullptr;
    for (const auto& ev : trace["traceEvents"])
        if (ev.value("ph", "") == "X") call = &ev;  // the rest name the process and thread
    ASSERT_NE(call, nullptr) << trace.dump();
    EXPECT_EQ((*call)["name"], "ncclAllReduceOnStream");
    EXPECT_EQ((*call)["args"]["stream"], "0xabc0");
    EXPECT_EQ((*call)["args"]["comm"], "0x1000");
}

// The table and the JSON show some fields differently (the table's raw
// count, the JSON's elements); each says which it is for.
TEST(CallFields, EachFieldSaysWhereItShows) {
    capture::SymbolInfo s;
    s.name = "ncclAllGather";
    s.layer = "nccl";
    s.role = CD_ROLE_COLLECTIVE;
    s.coll = CD_COLL_ALL_GATHER;
    s.slots = {2, 3, 4};
    s.return_probe = true;
    capture::SymbolTable syms;
    uint32_t id = syms.intern(s);
    model::Record r;
    r.sym = id;
    r.kind = model::RecordKind::Collective;
    r.coll = CD_COLL_ALL_GATHER;
    r.count = 10;
    r.dtype = 7;
    r.comm = 0x1000;
    r.flags = model::kHasCount | model::kHasDtype | model::kHasComm;
    snapshot::ProcessSnapshot p;
    snapshot::CommInfo c;
    c.ptr = 0x1000;
    c.nranks = 4;
    p.comms.push_back(c);
    auto fields = call_fields(r, p, syms);
    auto find = [&](std::string_view key, std::string_view table_key) -> const CallField* {
        for (const auto& f : fields)
            if (f.key == key && f.table_key == table_key) return &f;
        return nullptr;
    };
    const CallField* count = find("", "count");  // table only
    ASSERT_NE(count, nullptr);
    EXPECT_EQ(count->u, 10u);
    const CallField* out = find("output_elements", "");  // JSON only: needs nranks
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->u, 40u);
    EXPECT_EQ(out->show, TableShow::Never);
    const CallField* dtype = find("dtype", "dtype");
    ASSERT_NE(dtype, nullptr);
    EXPECT_EQ(dtype->show, TableShow::Bare);
    EXPECT_EQ(field_text(*dtype), "float32");
}

// op_name is the OpOverload's str() CommDebugMode keys its operations by:
// the default overload spelled out, a named one kept.
TEST(CallFields, OpNameIsTheOverloadsNameAsCommDebugModeKeysIt) {
    EXPECT_EQ(op_name("aten::mm"), "aten.mm.default");
    EXPECT_EQ(op_name("aten::add.Tensor"), "aten.add.Tensor");
    EXPECT_EQ(op_name("aten::arange.start_out"), "aten.arange.start_out");
    EXPECT_EQ(op_name("c10d::ProcessGroupGloo::allreduce"), std::nullopt);
    EXPECT_EQ(op_name("aten::"), std::nullopt);
}
