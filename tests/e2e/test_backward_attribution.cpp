// SPDX-License-Identifier: Apache-2.0
// Backward attribution from outside (issue 24): tests/testprogs/
// backward_attribution.py issues collectives in backward from a custom
// autograd.Function in two sibling modules of one class, from a tensor hook
// and from a checkpointed block's recomputation.  Each rank counts what it
// issued where it issued it (module_comm_counts in CommDebugMode's terms);
// on torch 2.6 CommDebugMode itself runs in the job too.  Both are the
// expected values, per rank, per module, forward and backward; the
// recomputation is a record of its own ("checkpointing"), the sibling
// modules' backward records are apart, and each names its autograd node.
// torch 1.13 (host, reentrant checkpoint) and 2.6 (trixie root,
// non-reentrant).
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

using nlohmann::json;
using Counts = std::map<std::string, std::map<std::string, std::map<std::string, uint64_t>>>;  // fqn, side, kind

const std::string kJob = "backward_attribution.py";

// commdbg's module_comm_counts with the job's keys: "c10d.all_reduce" -> "all_reduce".
Counts commdbg_counts(const json& p) {
    Counts out;
    const json counts = p.value("module_comm_counts", json::object());
    for (const auto& [fqn, sides] : counts.items())
        for (const auto& [side, kinds] : sides.items())
            for (const auto& [k, n] : kinds.items()) out[fqn][side][k.substr(k.find('.') + 1)] = n.get<uint64_t>();
    return out;
}

Counts job_counts(const json& rank) {
    Counts out;
    for (const auto& [fqn, sides] : rank["module_comm_counts"].items())
        for (const auto& [side, kinds] : sides.items())
            for (const auto& [k, n] : kinds.items()) out[fqn][side][k] = n.get<uint64_t>();
    return out;
}

// CommDebugMode's: paths below its root's class name ("Model.ckpt" -> "ckpt",
// "Model" -> "<root>"), "Global" left out, "c10d.allreduce_" -> "all_reduce".
Counts commdebug_counts(const json& rank) {
    Counts out;
    for (const auto& [fqn, sides] : rank["commdebug"].items()) {
        if (fqn == "Global") continue;
        auto dot = fqn.find('.');
        const std::string path = dot == std::string::npos ? "<root>" : fqn.substr(dot + 1);
        for (const auto& [side, kinds] : sides.items())
            for (const auto& [k, n] : kinds.items()) {
                std::string kind = k.substr(k.rfind('.') + 1);
                while (!kind.empty() && kind.back() == '_') kind.pop_back();
                if (kind == "allreduce") kind = "all_reduce";
                out[path][side][kind] += n.get<uint64_t>();
            }
    }
    return out;
}

struct Backward {
    std::map<std::string, int> recompute_collectives;         // per recomputed module
    std::map<std::string, std::vector<std::string>> nodes;    // backward module -> autograd nodes of its records
    std::map<std::string, int> backward_records_with_collective;
};

// The nearest module record above each c10d collective says where it ran.
void walk(const json& records, const json* module, Backward& b) {
    for (const auto& r : records) {
        if (r["type"] == "module") {
            if (r["event_type"] == "backward" && r.contains("autograd_node"))
                b.nodes[r["module_fqn"].get<std::string>()].push_back(r["autograd_node"].get<std::string>());
            walk(r["children"], &r, b);
            continue;
        }
        if (r["type"] == "collective" && r["layer"] == "c10d" && module) {
            const std::string fqn = (*module)["module_fqn"].get<std::string>();
            if ((*module)["event_type"] == "checkpointing") ++b.recompute_collectives[fqn];
            if ((*module)["event_type"] == "backward") ++b.backward_records_with_collective[fqn];
            continue;
        }
        walk(r["children"], module, b);
    }
}

void expect_attributed(const std::vector<std::string>& job, const std::map<std::string, std::string>& env,
                       bool commdebug) {
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--noise-level", "2", "--json", tmp.path("out.json"), "--"};
    argv.insert(argv.end(), job.begin(), job.end());
    auto r = run(argv, env, 300);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << r.out.substr(0, 2000) << r.err.substr(0, 4000);
    for_each_rank_process(processes_of(read_json(tmp.path("out.json"))), ranks, [&](const json& rank, const json& p) {
        const Counts want = job_counts(rank);
        // The plan, pinned so a changed job cannot pass by itself: 2 steps,
        // 4 collectives in each backward, 1 in each forward.
        ASSERT_EQ(want.at("<root>").at("backward").at("all_reduce"), 8u);
        ASSERT_EQ(want.at("grove.1.canopy").at("backward").at("all_reduce"), 2u);
        SCOPED_TRACE("notes: " + p.value("notes", json::array()).dump());
        EXPECT_EQ(commdbg_counts(p), want) << p["module_comm_counts"].dump(1);
        if (commdebug) {
            ASSERT_TRUE(rank.contains("commdebug")) << "CommDebugMode did not run in the job";
            EXPECT_EQ(commdebug_counts(rank), want) << "the job's own count is not CommDebugMode's";
            EXPECT_EQ(commdbg_counts(p), commdebug_counts(rank));
        }
        Backward b;
        walk(p["records"], nullptr, b);
        // The recomputation is apart: the block's collective, once per step, in a "checkpointing" record.
        EXPECT_EQ(b.recompute_collectives, (std::map<std::string, int>{{"ckpt", 2}}));
        // Siblings of one class: each canopy's backward is its own record, each step.
        EXPECT_EQ(b.backward_records_with_collective["grove.0.canopy"], 2);
        EXPECT_EQ(b.backward_records_with_collective["grove.1.canopy"], 2);
        // The custom Function's node is a Python one, named as torch names it
        // in the job (grad_fn.name(): "AllReduceGradBackward", not "PyNode");
        // the tail's hook runs in its multiplication's.
        for (const char* m : {"grove.0.canopy", "grove.1.canopy"}) {
            ASSERT_FALSE(b.nodes[m].empty()) << m;
            const std::string torch_name = rank["nodes"].value(m, "");
            ASSERT_FALSE(torch_name.empty()) << "the job did not say its node's name: " << rank.dump();
            for (const auto& n : b.nodes[m]) EXPECT_EQ(n, torch_name) << m;
        }
        EXPECT_NE(std::find(b.nodes["tail"].begin(), b.nodes["tail"].end(), "MulBackward0"), b.nodes["tail"].end())
            << json(b.nodes["tail"]).dump();
        EXPECT_GT(p.value("autograd_nodes_run", 0), 0) << "no autograd node counted";
    });
}

TEST(BackwardAttribution, Torch113CustomFunctionHookAndCheckpointCountedWhereTheJobCountsThem) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    expect_attributed({py, kTestprogs + "/" + kJob}, {}, false);
}

TEST(BackwardAttribution, Torch26CustomFunctionHookAndCheckpointCountedAsCommDebugModeCountsThem) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    expect_attributed({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/" + kJob},
                      kRootJobEnv, true);
}

}  // namespace
}  // namespace commdbg::e2e
