// SPDX-License-Identifier: Apache-2.0
// PyTorch (Debian python3-torch 1.13, CPU, gloo): `commdbg run` follows a
// torch.multiprocessing.spawn job; exact c10d counts per rank; ATen op records
// nested from entry probes only; an ATen op that throws 1000 times under our
// entry probes does not hurt the process; attach time of the torch-aten spec.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_util.hpp"
#include "perfetto_check.hpp"

namespace commdbg::e2e {
namespace {

const std::string kWorkload = std::string(SOURCE_DIR) + "/tests/testprogs/torch_gloo_workload.py";

void count_names(const nlohmann::json& records, std::map<std::string, int>& out) {
    for (const auto& r : records) {
        out[r["name"].get<std::string>()]++;
        if (r.contains("children")) count_names(r["children"], out);
    }
}

// Column where "aten::"/"c10d::" starts on a table line, or npos.
size_t name_column(const std::string& line) {
    size_t a = line.find("aten::"), c = line.find("c10d::");
    return std::min(a, c);
}

constexpr int kSteps = 3, kAllReduce = 3, kAllGather = 2, kBroadcast = 1;

struct TrainRun {
    ProcResult r;
    nlohmann::json dump;
    std::vector<nlohmann::json> ranks;  // the workload's own rank lines
};

// With a trace file when `trace` names one.
TrainRun run_train(const std::string& py, TempDir& tmp, const std::string& trace = "") {
    TrainRun t;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--probes", "nccl,torch-c10d,torch-aten", "--json",
                                     tmp.path("out.json"), "--noise-level", "1"};
    if (!trace.empty()) argv.insert(argv.end(), {"--trace", trace});
    argv.insert(argv.end(), {"--", py, kWorkload, "train", std::to_string(kSteps), std::to_string(kAllReduce),
                             std::to_string(kAllGather), std::to_string(kBroadcast)});
    t.r = run(argv, {}, 240);
    if (std::filesystem::exists(tmp.path("out.json"))) t.dump = read_json(tmp.path("out.json"));
    t.ranks = workload_lines(t.r.out, "rank");
    return t;
}

TEST(Torch, SpawnedGlooRanksGiveExactC10dCounts) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto t = run_train(py, tmp);
    ASSERT_EQ(t.r.status, 0) << t.r.err;
    ASSERT_FALSE(t.dump.is_null()) << "no JSON written\n" << t.r.err;
    ASSERT_EQ(t.ranks.size(), 2u) << t.r.out;
    auto ps = processes_of(t.dump);
    // The launcher, multiprocessing's resource tracker and the two ranks.
    EXPECT_GE(ps.size(), 3u) << t.dump.dump(1).substr(0, 2000);
    auto plan = workload_lines(t.r.out, "mode");
    ASSERT_EQ(plan.size(), 1u);
    const nlohmann::json* launcher = process_by_pid(ps, plan[0]["pid"].get<int>());
    ASSERT_NE(launcher, nullptr) << "launcher pid " << plan[0]["pid"] << " not in the dump";
    EXPECT_TRUE((*launcher)["comm_counts"].empty()) << (*launcher)["comm_counts"].dump();

    const std::map<std::string, int> want = {{"c10d.all_reduce", kSteps * kAllReduce},
                                             {"c10d.all_gather", kSteps * kAllGather},
                                             {"c10d.broadcast", kSteps * kBroadcast}};
    for_each_rank_process(ps, t.ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        // The workload's own account first.
        EXPECT_EQ(rank["calls"]["all_reduce"].get<int>(), kSteps * kAllReduce);
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        std::map<std::string, int> got;
        for (const auto& [k, v] : p["comm_counts"].items()) got[k] = v.get<int>();
        EXPECT_EQ(got, want) << "exact kernel counters per kind; nothing else (no barrier, no nccl)";
        // Records: one collective record per call, named by the method.
        std::map<std::string, int> names;
        count_names(p["records"], names);
        EXPECT_EQ(names["c10d::ProcessGroupGloo::allreduce"], kSteps * kAllReduce);
        EXPECT_EQ(names["c10d::ProcessGroupGloo::allgather"], kSteps * kAllGather);
        EXPECT_EQ(names["c10d::ProcessGroupGloo::broadcast"], kSteps * kBroadcast);
        EXPECT_GE(names["aten::linear"], kSteps);
        EXPECT_GE(names["aten::addmm"], kSteps);
    });
}

// total_counts counts each logical collective once: with c10d only (no
// NCCL underneath) that is the sum of the kinds.  Sibling collectives issued
// from Python at different C stack depths must not be taken for nested ones.
// (By the stack pointer alone a later sibling entered at a deeper sp looks
// nested; the kernel's return-address check tells them apart.)
TEST(Torch, TotalCountsEqualSumOfKinds) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto t = run_train(py, tmp);
    ASSERT_EQ(t.r.status, 0) << t.r.err;
    ASSERT_EQ(t.ranks.size(), 2u) << t.r.out;
    auto ps = processes_of(t.dump);
    for_each_rank_process(ps, t.ranks, [&](const nlohmann::json&, const nlohmann::json& p) {
        EXPECT_EQ(p["total_counts"].get<int>(), kSteps * (kAllReduce + kAllGather + kBroadcast))
            << "comm_counts " << p["comm_counts"].dump()
            << " — a collective record was nested under a sibling collective (stack-pointer nesting)";
    });
}

TEST(Torch, TableNestsAddmmUnderLinear) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto t = run_train(py, tmp);
    ASSERT_EQ(t.r.status, 0) << t.r.err;
    // The table (noise level 1) on stdout: ops shown, addmm one level under linear.
    std::vector<std::string> lines;
    std::istringstream in(t.r.out);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    int linear = 0, nested = 0;
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
        if (lines[i].find("aten::linear") == std::string::npos) continue;
        ++linear;
        size_t col = name_column(lines[i]);
        const std::string& next = lines[i + 1];
        if (next.find("aten::addmm") != std::string::npos && name_column(next) > col) ++nested;
    }
    EXPECT_GE(linear, 2 * kSteps) << t.r.out.substr(0, 4000);
    EXPECT_EQ(nested, linear) << "each aten::linear has aten::addmm indented under it\n" << t.r.out.substr(0, 4000);
}

TEST(Torch, TraceOpensInPerfettoWithOpsNestedPerRank) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    REQUIRE_PERFETTO();
    TempDir tmp;
    auto t = run_train(py, tmp, tmp.path("out.trace.json"));
    ASSERT_EQ(t.r.status, 0) << t.r.err;
    ASSERT_EQ(t.ranks.size(), 2u) << t.r.out;
    auto trace = read_json(tmp.path("out.trace.json"));
    auto loaded = perfetto_check::load_in_perfetto(tmp.path("out.trace.json"));
    auto diffs = perfetto_check::compare_with_file(loaded, trace);
    EXPECT_TRUE(diffs.empty()) << "Perfetto " << loaded.perfetto_version << ":\n" << perfetto_check::lines(diffs);
    for (const auto& rank : t.ranks) {
        const uint64_t pid = rank["pid"].get<uint64_t>();
        SCOPED_TRACE("rank pid " + std::to_string(pid));
        std::map<std::string, int> c10d;
        int linear = 0, addmm_under_linear = 0;
        for (const auto& s : loaded.slices) {
            if (s.pid != pid) continue;
            if (s.name.rfind("c10d::ProcessGroupGloo::", 0) == 0) ++c10d[s.name];
            if (s.name == "aten::linear") ++linear;
            if (s.name == "aten::addmm" && s.parent == "aten::linear") ++addmm_under_linear;
        }
        // In Perfetto as in the table: each forward's addmm one level under its linear.
        EXPECT_GE(linear, kSteps);
        EXPECT_EQ(addmm_under_linear, linear);
        EXPECT_EQ(c10d["c10d::ProcessGroupGloo::allreduce"], kSteps * kAllReduce);
        EXPECT_EQ(c10d["c10d::ProcessGroupGloo::allgather"], kSteps * kAllGather);
        EXPECT_EQ(c10d["c10d::ProcessGroupGloo::broadcast"], kSteps * kBroadcast);
    }
}

TEST(Torch, ThrowingAtenOpSurvivesEntryProbes) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--probes", "torch-aten", "--json", tmp.path("out.json"), "--", py,
                  kWorkload, "throw", "1000"},
                 {}, 240);
    ASSERT_EQ(r.status, 0) << "the traced process died: " << r.err;
    auto lines = workload_lines(r.out, "caught");
    ASSERT_EQ(lines.size(), 1u) << r.out.substr(0, 2000);
    EXPECT_EQ(lines[0]["caught"].get<int>(), 1000);
    auto ps = processes_of(read_json(tmp.path("out.json")));
    const nlohmann::json* p = process_by_pid(ps, lines[0]["pid"].get<int>());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ((*p)["process"]["exit_code"].get<int>(), 0);
    std::map<std::string, int> names;
    count_names((*p)["records"], names);
    EXPECT_GE(names["aten::mm"], 1000);
}

// Each outermost c10d collective record below `records`.
void c10d_collectives(const nlohmann::json& records, std::vector<nlohmann::json>& out) {
    for (const auto& r : records) {
        if (r.value("type", "") == "collective" && r.value("layer", "") == "c10d") {
            out.push_back(r);
            continue;
        }
        c10d_collectives(r.value("children", nlohmann::json::array()), out);
    }
}

// A child forked from a torch process holds its parent's image until it
// execs; commdbg sets up what it reads of torch and Python (tensor layout,
// process-group classes, the interpreter) at the fork, from that image.  The
// exec must drop it: the new interpreter maps torch elsewhere, and what it
// was told of the old image would name no process group and walk no stack.
// The child here waits 2 s before its exec, so the fork is handled while it
// still has the old image (in CI a spawned rank once lost every tensor so).
TEST(Torch, WhatAForkedImageTaughtIsForgottenAtExec) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    const std::string job = std::string(SOURCE_DIR) + "/tests/testprogs/fork_exec_job.py";
    auto r = run({commdbg_bin(), "run", "--probes", "nccl,torch-c10d", "--json", tmp.path("out.json"), "--", py, job,
                  "2", "4"},
                 {}, 240);
    ASSERT_EQ(r.status, 0) << r.err;
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 1u) << r.out;
    const nlohmann::json& rank = ranks[0];
    auto ps = processes_of(read_json(tmp.path("out.json")));
    const nlohmann::json* p = process_by_pid(ps, rank["pid"].get<int>());
    ASSERT_NE(p, nullptr) << "rank pid " << rank["pid"] << " not in the dump";
    std::vector<nlohmann::json> recs;
    c10d_collectives((*p)["records"], recs);
    ASSERT_EQ(recs.size(), rank["issued"].get<size_t>());
    for (const auto& rec : recs) {
        SCOPED_TRACE(rec.dump().substr(0, 1500));
        EXPECT_FALSE(rec.contains("tensors_status"));
        EXPECT_EQ(rec.value("group_size", -1), 1);
        ASSERT_TRUE(rec.contains("inputs"));
        ASSERT_EQ(rec["inputs"].size(), 1u);
        EXPECT_EQ(rec["inputs"][0]["shape"], nlohmann::json::array({rank["numel"]}));
        EXPECT_EQ(rec["inputs"][0]["dtype"], rank["dtype"]);
        // The new interpreter's stack: the job's own function issued it.
        bool in_job = false;
        for (const auto& f : rec.value("py_stack", nlohmann::json::array()))
            in_job = in_job || f.value("qualname", "") == "do_all_reduces";
        EXPECT_TRUE(in_job) << "no do_all_reduces frame on the record's Python stack";
    }
}

}  // namespace
}  // namespace commdbg::e2e
