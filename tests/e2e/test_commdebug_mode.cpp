// SPDX-License-Identifier: Apache-2.0
// Side by side with torch's own CommDebugMode: a 2-rank job in the trixie
// root (torch 2.6, tests/testprogs/tp_commdebug.py) runs CommDebugMode
// in-process, one window per step, and prints per rank what it counted and
// saw, with every c10d collective op's tensor arguments as the dispatcher
// passed them; commdbg traces the same job from outside.  CommDebugMode's
// numbers are the expected values: collective counts, per-module forward
// and backward counts, the c10d records' tensors, and
// parameter_info / sharding_info.
// Module paths differ only in their root: CommDebugMode's start with the
// root's class name ("TPModel.blocks.0.up"), commdbg's below the root
// ("blocks.0.up").
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

using nlohmann::json;

const std::string kJob = "tp_commdebug.py";

// CommDebugMode's op key ("c10d_functional.all_reduce",
// "c10d._allgather_base_") as commdbg names the collective ("all_reduce").
std::string collective_of(std::string op) {
    op = op.substr(op.rfind('.') + 1);
    while (!op.empty() && op.front() == '_') op.erase(0, 1);
    while (!op.empty() && op.back() == '_') op.pop_back();
    for (const std::string suffix : {"_into_tensor", "_tensor", "_base"})
        if (op.size() > suffix.size() && op.ends_with(suffix)) op.resize(op.size() - suffix.size());
    if (op == "allreduce") return "all_reduce";
    if (op == "allgather") return "all_gather";
    return op;
}

// CommDebugMode's module path as commdbg names it: without the root's class.
std::string commdbg_path(const std::string& fqn) {
    auto dot = fqn.find('.');
    return dot == std::string::npos ? "<root>" : fqn.substr(dot + 1);
}

const std::string kStepScope = "commdebug_step";  // the job's scope around each CommDebugMode window

// The outermost c10d collective records inside the job's step scopes (its
// setup's collectives are outside CommDebugMode's windows), in start order.
void c10d_records(const json& records, std::vector<json>& out, bool in_step = false) {
    for (const auto& r : records) {
        if (in_step && r["type"] == "collective" && r["layer"] == "c10d") {
            out.push_back(r);
            continue;
        }
        c10d_records(r["children"], out, in_step || (r["type"] == "scope" && r.value("name", "") == kStepScope));
    }
}

using TensorKey = std::tuple<std::string, std::string, uint64_t, uint64_t>;  // shape, dtype, numel, bytes
TensorKey key_of(const json& t) {
    return {t["shape"].dump(), t["dtype"].get<std::string>(), t["numel"].get<uint64_t>(), t["bytes"].get<uint64_t>()};
}

void expect_counts_match(const json& rank, const json& p) {
    std::map<std::string, uint64_t> want;  // "c10d.<collective>"
    for (const auto& step : rank["steps"])
        for (const auto& [op, n] : step["comm_counts"].items()) want["c10d." + collective_of(op)] += n.get<uint64_t>();
    ASSERT_FALSE(want.empty()) << "CommDebugMode counted no collective";
    std::map<std::string, uint64_t> got;
    std::vector<json> recs;
    c10d_records(p["records"], recs);
    for (const auto& r : recs) ++got["c10d." + r["collective_type"].get<std::string>()];
    EXPECT_EQ(got, want);
    // The exact counters hold them too, with the setup's and the final barrier.
    for (const auto& [k, n] : want) EXPECT_GE(p["comm_counts"].value(k, uint64_t{0}), n) << k;
}

// Per module, per collective: CommDebugMode's counts of one side (forward,
// backward) against commdbg's; `only`: that collective only ("c10d.all_gather").
void expect_module_counts_match(const json& rank, const json& p, const std::string& side,
                                const std::string& only = "") {
    SCOPED_TRACE(side + " " + only);
    std::map<std::string, std::map<std::string, uint64_t>> want;
    for (const auto& step : rank["steps"])
        for (const auto& [fqn, sides] : step["module_counts"].items()) {
            if (fqn == "Global" || !sides.contains(side)) continue;
            for (const auto& [op, n] : sides[side].items())
                if (only.empty() || "c10d." + collective_of(op) == only)
                    want[commdbg_path(fqn)]["c10d." + collective_of(op)] += n.get<uint64_t>();
        }
    ASSERT_FALSE(want.empty());
    std::map<std::string, std::map<std::string, uint64_t>> got;
    const json counts = p.value("module_comm_counts", json::object());
    for (const auto& [fqn, sides] : counts.items())
        if (sides.contains(side))
            for (const auto& [k, n] : sides[side].items())
                if (only.empty() || k == only) got[fqn][k] = n.get<uint64_t>();
    EXPECT_EQ(got, want);
}

// FSDP2's gradient reductions, by FSDP's own account: each backward
// reduce-scatter (outermost collective) sits in a "FSDP::post_backward_reduce
// (unit)" scope ("FSDP::post_backward_reduce": the root) and under the
// backward record of that unit's module, the innermost module record around it.
// Returns how many were checked.
size_t expect_reductions_under_their_unit(const json& records, const std::string& unit = "",
                                          const std::string& module = "", bool in_collective = false) {
    static const std::string kReduce = "FSDP::post_backward_reduce";
    size_t n = 0;
    for (const auto& r : records) {
        std::string u = unit, m = module;
        const std::string type = r.value("type", ""), name = r.value("name", "");
        if (type == "scope" && name.rfind(kReduce, 0) == 0)
            u = name == kReduce ? "<root>" : name.substr(kReduce.size() + 2, name.size() - kReduce.size() - 3);
        if (type == "module") m = r.value("event_type", "") == "backward" ? r.value("module_fqn", "") : "";
        const bool collective = type == "collective";
        if (collective && !in_collective && r.value("collective_type", "") == "reduce_scatter" && !m.empty()) {
            EXPECT_EQ(m, u) << "a backward reduce-scatter under " << m << ", FSDP reduces for " << u << ": "
                            << r.value("start_ns", uint64_t{0});
            ++n;
        }
        n += expect_reductions_under_their_unit(r.value("children", json::array()), u, m, in_collective || collective);
    }
    return n;
}

// Each c10d record holds exactly the tensors the job passed to that collective.
void expect_records_carry_the_tensors(const json& rank, const json& p) {
    std::vector<json> passed;
    for (const auto& step : rank["steps"])
        for (const auto& c : step["collectives"]) passed.push_back(c);
    std::vector<json> recs;
    c10d_records(p["records"], recs);
    ASSERT_EQ(recs.size(), passed.size()) << "c10d records and the job's collectives differ in number";
    SCOPED_TRACE("process notes: " + p.value("notes", json::array()).dump() +
                 " kernel drops: " + p.value("kernel_drops", json::object()).dump());
    for (size_t i = 0; i < recs.size(); ++i) {
        SCOPED_TRACE("collective " + std::to_string(i) + ": " + passed[i].dump());
        const json& rec = recs[i];
        EXPECT_EQ(rec["collective_type"], collective_of(passed[i]["op"]));
        EXPECT_EQ(rec.value("group_size", -1), rank["world"].get<int>()) << rec.dump();
        std::set<TensorKey> want, got;
        for (const auto& t : passed[i]["tensors"]) want.insert(key_of(t));
        for (const char* side : {"inputs", "outputs"})
            if (rec.contains(side))
                for (const auto& t : rec[side]) got.insert(key_of(t));
        EXPECT_EQ(got, want) << rec.dump();
    }
}

// parameter_info: CommDebugMode's of the first step (every step's is the
// same module tree); `local` also compares the local shards' shapes.
void expect_parameter_info_matches(const json& rank, const json& p, bool local) {
    const json& cdm = rank["steps"][0]["parameter_info"];
    ASSERT_FALSE(cdm.empty()) << "CommDebugMode saw no parameters";
    ASSERT_TRUE(p.contains("parameter_info"))
        << "commdbg read no parameters; process notes: " << p.value("notes", json::array()).dump()
        << " modules unread: " << p.value("parameter_modules_unread", json()).dump();
    const json& got = p["parameter_info"];
    std::set<std::string> want_modules, got_modules;
    for (const auto& [fqn, params] : cdm.items()) {
        const std::string path = commdbg_path(fqn);
        want_modules.insert(path);
        SCOPED_TRACE(path);
        ASSERT_TRUE(got.contains(path)) << got.dump();
        std::set<std::string> want_names, got_names;
        for (const auto& [name, info] : params.items()) {
            want_names.insert(name);
            ASSERT_TRUE(got[path].contains(name)) << got[path].dump();
            const json& g = got[path][name];
            EXPECT_EQ(g["shape"], info["shape"]) << name;
            EXPECT_EQ(g["dtype"], info["dtype"]) << name;
            if (local) {
                EXPECT_EQ(g["local_shape"], info["local_shape"]) << name;
            }
        }
        for (const auto& [name, info] : got[path].items()) got_names.insert(name);
        EXPECT_EQ(got_names, want_names);
    }
    for (const auto& [fqn, params] : got.items()) got_modules.insert(fqn);
    EXPECT_EQ(got_modules, want_modules);
}

void expect_sharding_info_matches(const json& rank, const json& p) {
    std::map<std::string, std::string> want, got;
    for (const auto& [key, placements] : rank["steps"][0]["sharding_info"].items())
        want[commdbg_path(key)] = placements.get<std::string>();
    const json sharding = p.value("sharding_info", json::object());
    for (const auto& [key, placements] : sharding.items()) got[key] = placements.get<std::string>();
    EXPECT_EQ(got, want);
}

// A script written against CommDebugMode (testprogs/commdebug_script.py),
// run through the commdbg Python package on commdbg's dump of the job,
// answers what it answered on CommDebugMode inside the job, step by step
// summed (one window each there; their record_function scope here).
void expect_the_script_answers_alike(const json& rank, const json& dump) {
    auto add = [](json& slot, const json& n) { slot = (slot.is_null() ? 0 : slot.get<uint64_t>()) + n.get<uint64_t>(); };
    json want = {{"total", 0}, {"counts", json::object()}, {"modules", json::object()}};
    for (const auto& step : rank["steps"]) {
        const json s = step["script"];
        add(want["total"], s["total"]);
        for (const auto& [k, n] : s["counts"].items()) add(want["counts"][k], n);
        for (const auto& [fqn, sides] : s["modules"].items())
            for (const auto& [side, c] : sides.items())
                for (const auto& [k, n] : c.items()) add(want["modules"][fqn][side][k], n);
    }
    want["parameters"] = rank["steps"][0]["script"]["parameters"];
    want["sharding"] = rank["steps"][0]["script"]["sharding"];
    ASSERT_GT(want["total"].get<uint64_t>(), 0u);
    TempDir tmp;
    std::ofstream(tmp.path("out.json")) << dump.dump();
    auto r = run({kRunScript, "--bind", kTestprogs + ":" + kInRoot, "--bind",
                  std::string(SOURCE_DIR) + "/python:/commdbg-python", "--bind", tmp.path("") + ":/dump", trixie_root(),
                  "env", "PYTHONPATH=/commdbg-python", "python3", kInRoot + "/commdebug_script.py", "/dump/out.json",
                  std::to_string(rank["pid"].get<int>()), kStepScope},
                 kRootJobEnv, 120);
    ASSERT_EQ(r.status, 0) << r.err;
    const json got = json::parse(r.out, nullptr, false);
    EXPECT_EQ(got, want) << "through the package: " << r.out << "\nCommDebugMode: " << want.dump();
}

struct Traced {
    std::vector<json> ranks;
    json dump;
};

Traced trace_job(const std::vector<std::string>& job_args) {
    const std::string root = trixie_root();
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--noise-level", "2", "--json", tmp.path("out.json"), "--",
                                     kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3",
                                     kInRoot + "/" + kJob};
    argv.insert(argv.end(), job_args.begin(), job_args.end());
    auto r = run(argv, kRootJobEnv, 300);
    EXPECT_EQ(r.status, 0) << r.err.substr(0, 4000);
    Traced t;
    t.ranks = workload_lines(r.out, "rank");
    EXPECT_EQ(t.ranks.size(), 2u) << r.out.substr(0, 2000) << r.err.substr(0, 4000);
    if (r.status == 0) t.dump = read_json(tmp.path("out.json"));
    return t;
}

TEST(CommDebugModeSideBySide, TensorParallelJobCountsTensorsParametersAndShardingEqualCommDebugModes) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    Traced t = trace_job({});
    ASSERT_EQ(t.ranks.size(), 2u);
    for_each_rank_process(processes_of(t.dump), t.ranks, [&](const json& rank, const json& p) {
        ASSERT_FALSE(rank["steps"][0]["sharding_info"].empty()) << "CommDebugMode saw no DTensor parameter";
        expect_counts_match(rank, p);
        expect_module_counts_match(rank, p, "forward");
        // The backward all-reduces (the Colwise modules' input gradients,
        // issued by DTensor's autograd functions) under the modules whose
        // forward made their nodes.
        expect_module_counts_match(rank, p, "backward");
        expect_records_carry_the_tensors(rank, p);
        expect_parameter_info_matches(rank, p, true);
        expect_sharding_info_matches(rank, p);
        expect_the_script_answers_alike(rank, t.dump);
    });
}

// FSDP2: a unit's parameters are registered unsharded while its forward runs
// (what CommDebugMode's hook sees: plain tensors, no placements) and sharded
// DTensors otherwise; commdbg reads them some time after the module's first
// record, in either state, and shows the forward's view from FSDP2's own
// state.  The job runs twice: the read's timing differs, the result may not.
TEST(CommDebugModeSideBySide, Fsdp2JobCountsTensorsParametersAndShardingEqualCommDebugModes) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    for (int run = 0; run < 2; ++run) {
        SCOPED_TRACE("run " + std::to_string(run));
        Traced t = trace_job({"--fsdp"});
        ASSERT_EQ(t.ranks.size(), 2u);
        for_each_rank_process(processes_of(t.dump), t.ranks, [&](const json& rank, const json& p) {
            expect_counts_match(rank, p);
            expect_module_counts_match(rank, p, "forward");
            // Backward, every collective per module as CommDebugMode counts
            // it: a unit's all-gathers (its pre-backward, the prefetch of the
            // next) under the unit; its reduce-scatter also under the module
            // whose backward began last (CommDebugMode's full-backward
            // pre-hook: blocks.N.up, and blocks.0.up for the root's and
            // blocks.0's, reduced from the root's final callback).
            expect_module_counts_match(rank, p, "backward");
            // In the tree, each reduce-scatter stays under the unit FSDP's
            // label names (docs/design/backward.md); as many as CommDebugMode's.
            const size_t reductions = expect_reductions_under_their_unit(p["records"]);
            uint64_t want_total = 0;
            for (const auto& step : rank["steps"]) {
                const json global = step["module_counts"].value("Global", json::object());
                const json backward = global.value("backward", json::object());
                for (const auto& [op, n] : backward.items())
                    if (collective_of(op) == "reduce_scatter") want_total += n.get<uint64_t>();
            }
            EXPECT_GT(want_total, 0u);
            EXPECT_EQ(reductions, want_total);
            expect_records_carry_the_tensors(rank, p);
            expect_parameter_info_matches(rank, p, true);
            expect_sharding_info_matches(rank, p);
        });
    }
}

// FSDP2 makes a unit's unsharded parameters at its first all-gather.  A job
// that ends before any (inside the root's first forward, before FSDP2's
// pre-hook, having made one record there) still shows each module's
// parameters as its forward would see them: torch's own, printed by the job
// from the model before fully_shard.  Before, commdbg waited for the
// unsharded ones, and a short job's end could come first (a CI failure).
TEST(CommDebugModeSideBySide, Fsdp2ParametersAreReadBeforeTheirFirstAllGather) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    Traced t = trace_job({"--fsdp", "--exit-in-first-forward", "3"});
    ASSERT_EQ(t.ranks.size(), 2u);
    for_each_rank_process(processes_of(t.dump), t.ranks, [&](const json& rank, const json& p) {
        ASSERT_FALSE(rank["parameter_info"].empty());
        EXPECT_EQ(p.value("parameter_info", json()), rank["parameter_info"])
            << "process notes: " << p.value("notes", json::array()).dump();
        EXPECT_EQ(p.value("sharding_info", json::object()), json::object());
        EXPECT_FALSE(p.contains("parameters_unread")) << p["parameters_unread"].dump();
    });
}

}  // namespace
}  // namespace commdbg::e2e
