// SPDX-License-Identifier: Apache-2.0
// c10d records carry the tensors the job passed: a 2-rank gloo job
// (tests/testprogs/c10d_shapes.py) issues collectives over tensors of several
// shapes and dtypes and prints, per rank and in issue order, what it passed
// and its rank and world size; every c10d record commdbg read from outside
// must say the same (shapes, dtype, element count, bytes, group rank and
// size), on torch 1.13 (host) and torch 2.6 (trixie root).  A libc10 whose
// layout cannot be derived gives the note and no shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"
#include "events.h"
#include "patch_code.hpp"

namespace commdbg::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kJob = "c10d_shapes.py";
constexpr size_t kKeptDims = CD_TENSOR_DIMS;

// The c10d collective records of a process, outermost first, in start order.
void c10d_records(const json& records, std::vector<json>& out) {
    for (const auto& r : records) {
        if (r["type"] == "collective" && r["layer"] == "c10d") {
            out.push_back(r);
            continue;
        }
        c10d_records(r["children"], out);
    }
}

// One side (inputs / outputs) of a record against what the job passed.
void expect_side(const json& rec, const json& passed, const char* list, const char* shape_key) {
    SCOPED_TRACE(list);
    if (passed.empty()) {
        EXPECT_FALSE(rec.contains(list)) << rec.dump();
        return;
    }
    ASSERT_TRUE(rec.contains(list)) << rec.dump();
    const json& got = rec[list];
    const size_t total = rec.value(std::string(list) + "_total", got.size());
    EXPECT_EQ(total, passed.size()) << rec.dump();
    ASSERT_GE(got.size(), 1u);
    for (size_t i = 0; i < got.size() && i < passed.size(); ++i) {
        const json& want = passed[i];
        if (want["shape"].size() <= kKeptDims) {
            EXPECT_EQ(got[i]["shape"], want["shape"]) << rec.dump();
        } else {  // more dims than the kernel keeps: no shape, never a cut one
            EXPECT_TRUE(got[i]["shape"].is_null()) << rec.dump();
            EXPECT_EQ(got[i].value("status", ""), "more dims than kept") << rec.dump();
        }
        EXPECT_EQ(got[i]["dtype"], want["dtype"]) << rec.dump();
        EXPECT_EQ(got[i]["numel"], want["numel"]) << rec.dump();
        EXPECT_EQ(got[i]["bytes"], want["bytes"]) << rec.dump();
    }
    EXPECT_EQ(rec[shape_key], got[0]["shape"]);
}

// A copy in `tmp` of the host's torch library whose file name starts with
// `prefix`, named as the loader looks for it (libtorch's DT_NEEDED:
// libX.so.MAJOR.MINOR, so LD_LIBRARY_PATH=tmp loads it), its function
// `symbol` overwritten with int3; "" or what went wrong.
std::string patched_copy(TempDir& tmp, const std::string& prefix, const char* symbol) {
    std::string lib;
    for (const auto& e : fs::directory_iterator("/usr/lib/x86_64-linux-gnu"))
        if (e.path().filename().string().rfind(prefix, 0) == 0 && !e.is_symlink()) lib = e.path().string();
    if (lib.empty()) return "torch imports but no " + prefix + "* in /usr/lib/x86_64-linux-gnu";
    std::string soname = fs::path(lib).filename().string();
    while (std::count(soname.begin(), soname.end(), '.') > 3) soname.erase(soname.rfind('.'));
    const std::string copy = tmp.path(soname);
    fs::copy_file(lib, copy);
    if (!test::patch_function_code(copy, symbol, [](std::vector<uint8_t>& code) {
            std::fill(code.begin(), code.end(), 0xcc);  // the whole function: int3
        }))
        return std::string("cannot patch ") + symbol + " in " + copy;
    return "";
}

// Every c10d record of every rank against the rank's own account.
void expect_records_carry_what_was_passed(const std::string& out, const json& dump) {
    auto ranks = workload_lines(out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << out.substr(0, 2000);
    for_each_rank_process(processes_of(dump), ranks, [&](const json& rank, const json& p) {
        std::vector<json> recs;
        c10d_records(p["records"], recs);
        const json& passed = rank["collectives"];
        ASSERT_EQ(recs.size(), passed.size()) << "c10d records and the job's collectives differ in number";
        for (size_t i = 0; i < recs.size(); ++i) {
            SCOPED_TRACE("collective " + std::to_string(i) + ": " + passed[i].dump());
            const json& rec = recs[i];
            EXPECT_EQ(rec["collective"], passed[i]["collective"]);
            EXPECT_EQ(rec["collective_type"], passed[i]["collective"]);
            EXPECT_EQ(rec.value("group_size", -1), rank["world"].get<int>()) << rec.dump();
            EXPECT_EQ(rec.value("group_rank", -1), rank["dist_rank"].get<int>()) << rec.dump();
            expect_side(rec, passed[i]["inputs"], "inputs", "input_shape");
            expect_side(rec, passed[i]["outputs"], "outputs", "output_shape");
            const json& first = passed[i]["inputs"].empty() ? passed[i]["outputs"] : passed[i]["inputs"];
            EXPECT_EQ(rec.value("dtype", ""), first[0]["dtype"]) << rec.dump();
            if (!passed[i]["inputs"].empty()) {
                uint64_t bytes = 0;
                for (const auto& t : passed[i]["inputs"]) bytes += t["bytes"].get<uint64_t>();
                EXPECT_EQ(rec.value("bytes", uint64_t{0}), bytes) << rec.dump();
            }
        }
    });
}

TEST(TensorRecords, Torch113C10dRecordsCarryTheTensorsTheJobPassed) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--probes", "torch-c10d", "--noise-level", "0", "--json", tmp.path("out.json"),
                  "--", py, kTestprogs + "/" + kJob},
                 {}, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    EXPECT_EQ(r.err.find("tensor shapes are not read"), std::string::npos) << r.err;
    expect_records_carry_what_was_passed(r.out, read_json(tmp.path("out.json")));
}

TEST(TensorRecords, Torch26C10dRecordsCarryTheTensorsTheJobPassed) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--probes", "torch-c10d", "--noise-level", "0", "--json", tmp.path("out.json"),
                  "--", kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/" + kJob},
                 kRootJobEnv, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto plan = workload_lines(r.out, "mode");
    ASSERT_EQ(plan.size(), 1u) << r.out.substr(0, 2000);
    EXPECT_EQ(plan[0]["torch"].get<std::string>().rfind("2.", 0), 0u) << plan[0].dump();
    expect_records_carry_what_was_passed(r.out, read_json(tmp.path("out.json")));
}

// The job loads a copy of its libc10 whose sizes reader is overwritten (a
// function only tensors with custom sizes call): its layout cannot be
// derived, so the records carry no tensors and the process a note saying why.
TEST(TensorRecords, ALibc10WhoseLayoutCannotBeDerivedGivesANoteAndNoShapes) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    ASSERT_EQ(patched_copy(tmp, "libc10.so.", "_ZNK3c1010TensorImpl12sizes_customEv"), "");
    auto r = run({commdbg_bin(), "run", "--probes", "torch-c10d", "--noise-level", "0", "--json", tmp.path("out.json"),
                  "--", py, kTestprogs + "/" + kJob},
                 {{"LD_LIBRARY_PATH", tmp.path("")}}, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << r.out.substr(0, 2000);
    const json dump = read_json(tmp.path("out.json"));
    for_each_rank_process(processes_of(dump), ranks, [&](const json& rank, const json& p) {
        std::vector<json> recs;
        c10d_records(p["records"], recs);
        ASSERT_EQ(recs.size(), rank["collectives"].size());
        for (const auto& rec : recs) {
            EXPECT_FALSE(rec.contains("inputs") || rec.contains("outputs") || rec.contains("input_shape") ||
                         rec.contains("group_size"))
                << "a record has tensors though the layout is unknown: " << rec.dump();
        }
        std::string notes = p.value("notes", json::array()).dump();
        EXPECT_NE(notes.find("tensor shapes are not read"), std::string::npos) << notes;
        EXPECT_NE(notes.find("sizes_custom"), std::string::npos) << notes;
    });
}

// The same with a copy of libtorch_python whose Tensor._cdata getter is
// overwritten: where a torch.Tensor object keeps its TensorImpl cannot be
// derived, so no parameters are read (the note says why) while the c10d
// records keep their tensors.
TEST(TensorRecords, ALibtorchPythonWhoseLayoutCannotBeDerivedGivesANoteAndNoParameters) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    ASSERT_EQ(patched_copy(tmp, "libtorch_python.so.", "_Z21THPVariable_get_cdataP11THPVariablePv"), "");
    auto r = run({commdbg_bin(), "run", "--probes", "torch-c10d", "--noise-level", "2", "--json", tmp.path("out.json"),
                  "--", py, kTestprogs + "/torch_module_workload.py"},
                 {{"LD_LIBRARY_PATH", tmp.path("")}}, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << r.out.substr(0, 2000);
    const json dump = read_json(tmp.path("out.json"));
    for_each_rank_process(processes_of(dump), ranks, [&](const json& rank, const json& p) {
        EXPECT_FALSE(rank["parameters"].empty()) << "the job's model has parameters";
        EXPECT_FALSE(p.contains("parameter_info")) << p["parameter_info"].dump();
        std::string notes = p.value("notes", json::array()).dump();
        EXPECT_NE(notes.find("module parameters are not read"), std::string::npos) << notes;
        EXPECT_NE(notes.find("THPVariable_get_cdata"), std::string::npos) << notes;
        std::vector<json> recs;
        c10d_records(p["records"], recs);
        ASSERT_FALSE(recs.empty());
        EXPECT_TRUE(recs[0].contains("inputs")) << "tensors of c10d records do not depend on libtorch_python";
    });
}

}  // namespace
}  // namespace commdbg::e2e
