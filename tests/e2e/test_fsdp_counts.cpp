// SPDX-License-Identifier: Apache-2.0
// A framework collective is counted once, at the outermost collective call of
// its thread (issue 12, point 2): torch 2.6's gloo implements _allgather_base
// with allgather and _reduce_scatter_base through
// reduce_scatter_tensor_coalesced and allreduce, and each of those is probed.
// comm_counts / comm_bytes / total_counts come from the kernel's counters,
// which tell the nested calls apart themselves, so they stay exact with
// records dropped or not taken at all; the per-symbol counters keep every
// call, the records keep the inner calls as children.
//
// First without torch: nested_collectives (tests/testprogs) has functions
// that call one another as gloo's do, probed through a spec of this file.
// Then the real FSDP2 job on torch 2.6 in the trixie root.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// ---- nested_collectives, probed through its own spec ----------------------------

const char* const kFakePgSpec = R"({
  "name": "fakepg", "layer": "fakepg", "library": ["nested_collectives"], "return_probes": false,
  "symbols": [
    {"match": "pg_allgather_base", "role": "collective", "collective": "all_gather", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_allgather", "role": "collective", "collective": "all_gather", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_reduce_scatter_base", "role": "collective", "collective": "reduce_scatter", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_reduce_scatter_coalesced", "role": "collective", "collective": "reduce_scatter", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_allreduce", "role": "collective", "collective": "all_reduce", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_allreduce_nccl", "role": "collective", "collective": "all_reduce", "args": {"count": 0, "dtype": 1}},
    {"match": "pg_broadcast_waiting", "role": "collective", "collective": "broadcast", "args": {"count": 0, "dtype": 1}}
  ]
})";

struct NestedRun {
    ProcResult r;
    nlohmann::json dump;
};

NestedRun run_nested(TempDir& tmp, long rounds, const std::vector<std::string>& extra) {
    std::ofstream(tmp.path("fakepg.json")) << kFakePgSpec;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--probes", "nccl," + tmp.path("fakepg.json"), "--json",
                                     tmp.path("out.json")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"--", testprog("nested_collectives"), std::to_string(rounds)});
    NestedRun n;
    n.r = run(argv, nccl_env(false), 300);
    if (std::filesystem::exists(tmp.path("out.json"))) n.dump = read_json(tmp.path("out.json"));
    return n;
}

long counter_calls(const nlohmann::json& p, const std::string& name) {
    long n = 0;
    for (const auto& c : p["counters"])
        if (c.value("name", "") == name) n += c["calls"].get<long>();
    return n;
}

// What nested_collectives issues in R rounds (its header says how), per kind
// at the outermost call: float32, 4 bytes an element.
void expect_outermost_counts(const nlohmann::json& p, long rounds) {
    const long R = rounds;
    const auto& counts = p["comm_counts"];
    SCOPED_TRACE("comm_counts " + counts.dump());
    EXPECT_EQ(counts.value("fakepg.all_gather", -1L), R);
    EXPECT_EQ(counts.value("fakepg.reduce_scatter", -1L), R);
    // main's direct and deep siblings, the NCCL wrapper, the other thread's:
    // not the allreduce inside each reduce-scatter.
    EXPECT_EQ(counts.value("fakepg.all_reduce", -1L), 4 * R);
    EXPECT_EQ(counts.value("fakepg.broadcast", -1L), 1);
    EXPECT_EQ(counts.value("nccl.all_reduce", -1L), 2 * R) << "the NCCL layer keeps every call under its own key";
    EXPECT_EQ(p["total_counts"].get<long>(), 7 * R + 1) << "the NCCL call inside pg_allreduce_nccl is the same collective";
    const auto& bytes = p["comm_bytes"];
    EXPECT_EQ(bytes.value("fakepg.all_gather", -1L), R * 256 * 4) << bytes.dump();
    EXPECT_EQ(bytes.value("fakepg.reduce_scatter", -1L), R * 128 * 4) << bytes.dump();
    EXPECT_EQ(bytes.value("fakepg.all_reduce", -1L), R * (64 + 64 + 32 + 8) * 4) << bytes.dump();
    EXPECT_EQ(bytes.value("nccl.all_reduce", -1L), R * (32 + 16) * 4) << bytes.dump();
    // The per-symbol counters keep every call, inner ones included.
    EXPECT_EQ(counter_calls(p, "pg_allgather_base"), R);
    EXPECT_EQ(counter_calls(p, "pg_allgather"), R);
    EXPECT_EQ(counter_calls(p, "pg_reduce_scatter_coalesced"), R);
    EXPECT_EQ(counter_calls(p, "pg_allreduce"), 4 * R);
    EXPECT_EQ(counter_calls(p, "ncclAllReduce"), 2 * R);
}

// (parent name, name) -> records; a root's parent is "".
std::map<std::pair<std::string, std::string>, long> record_edges(const nlohmann::json& p) {
    std::map<std::pair<std::string, std::string>, long> out;
    std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& recs,
                                                                              const std::string& parent) {
        for (const auto& rec : recs) {
            const std::string name = rec.value("name", "");
            ++out[{parent, name}];
            if (rec.contains("children")) walk(rec["children"], name);
        }
    };
    walk(p["records"], "");
    return out;
}

TEST(NestedCollectiveCounts, FrameworkCollectiveCountsOnceAtItsOutermostCallWithInnerCallsAsChildren) {
    REQUIRE_BPF();
    TempDir tmp;
    const long R = 50;
    auto n = run_nested(tmp, R, {});
    ASSERT_EQ(n.r.status, 0) << n.r.err;
    ASSERT_FALSE(n.dump.is_null()) << n.r.err;
    ASSERT_FALSE(n.dump.contains("dropped_records")) << "this run must see every record";
    expect_outermost_counts(n.dump, R);
    auto edges = record_edges(n.dump);
    EXPECT_EQ((edges[{"pg_allgather_base", "pg_allgather"}]), R);
    EXPECT_EQ((edges[{"pg_reduce_scatter_base", "pg_reduce_scatter_coalesced"}]), R);
    EXPECT_EQ((edges[{"pg_reduce_scatter_coalesced", "pg_allreduce"}]), R);
    EXPECT_EQ((edges[{"pg_allreduce_nccl", "ncclAllReduce"}]), R);
    // The siblings (one entered deeper than the calls before it) and the
    // other thread's calls are roots.
    EXPECT_EQ((edges[{"", "pg_allreduce"}]), 3 * R);
    EXPECT_EQ((edges[{"", "ncclAllReduce"}]), R);
}

TEST(NestedCollectiveCounts, CountsOnlyTellNestedCallsApartWithoutRecords) {
    REQUIRE_BPF();
    TempDir tmp;
    const long R = 50;
    auto n = run_nested(tmp, R, {"--counts-only"});
    ASSERT_EQ(n.r.status, 0) << n.r.err;
    ASSERT_FALSE(n.dump.is_null()) << n.r.err;
    EXPECT_TRUE(n.dump["records"].empty()) << "counts only: no records to nest by";
    expect_outermost_counts(n.dump, R);
}

TEST(NestedCollectiveCounts, TinyRingBufferDropsRecordsButNotTheOutermostCounts) {
    REQUIRE_BPF();
    TempDir tmp;
    const long R = 200000;
    auto n = run_nested(tmp, R, {"--ringbuf-kb", "16", "--noise-level", "0"});
    ASSERT_EQ(n.r.status, 0) << n.r.err.substr(0, 2000);
    ASSERT_FALSE(n.dump.is_null()) << n.r.err.substr(0, 2000);
    ASSERT_TRUE(n.dump.contains("kernel_drops")) << "the ring buffer must overflow for this test to mean anything";
    EXPECT_GT(n.dump["kernel_drops"].value("ringbuf_full", 0L), 0);
    expect_outermost_counts(n.dump, R);
}

// ---- the real FSDP2 job: torch 2.6 on CPU + gloo in the trixie root ---------------
// (e2e_util's trixie root: the job chrooted, the profiler on the host)

struct FsdpRun {
    ProcResult r;
    nlohmann::json dump;
    std::vector<nlohmann::json> ranks;  // the workload's own rank lines
};

FsdpRun run_fsdp_clean(TempDir& tmp, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {commdbg_bin(), "run", "--probes", "torch-c10d", "--json", tmp.path("out.json")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"--", kRunScript, "--bind", kTestprogs + ":" + kInRoot, trixie_root(), "python3",
                             kInRoot + "/fsdp2_workload.py", "clean"});
    FsdpRun f;
    f.r = run(argv, kRootJobEnv, 300);
    if (std::filesystem::exists(tmp.path("out.json"))) f.dump = read_json(tmp.path("out.json"));
    f.ranks = workload_lines(f.r.out, "issued");
    return f;
}

// Per rank: comm_counts are what the job issued, by kind, and nothing else;
// total_counts their sum; the per-symbol counters hold more calls than that
// (gloo's inner calls: the nesting is real and kept there).
void expect_issued_counts(const FsdpRun& f) {
    ASSERT_EQ(f.r.status, 0) << "the traced job failed\n" << f.r.err.substr(0, 4000);
    ASSERT_FALSE(f.dump.is_null()) << f.r.err.substr(0, 4000);
    ASSERT_EQ(f.ranks.size(), 2u) << f.r.out.substr(0, 2000);
    auto ps = processes_of(f.dump);
    for_each_rank_process(ps, f.ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        std::map<std::string, long> want;
        long issued = 0;
        for (const auto& [kind, n] : rank["issued"].items()) {
            if (n.get<long>() > 0) want["c10d." + kind] = n.get<long>();
            issued += n.get<long>();
        }
        EXPECT_GT(want["c10d.all_gather"], 0) << rank.dump();
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        std::map<std::string, long> got;
        for (const auto& [k, v] : p["comm_counts"].items()) got[k] = v.get<long>();
        EXPECT_EQ(got, want) << "comm_counts " << p["comm_counts"].dump()
                             << " — a collective counted once per gloo method it went through";
        EXPECT_EQ(p["total_counts"].get<long>(), issued);
        long per_symbol = 0;
        for (const auto& c : p["counters"])
            if (c.value("layer", "") == "c10d" && c.contains("collective")) per_symbol += c["calls"].get<long>();
        EXPECT_GT(per_symbol, issued) << "the counters must still show gloo's inner calls: " << p["counters"].dump();
        EXPECT_EQ(counter_calls(p, "c10d::ProcessGroupGloo::allgather"), want["c10d.all_gather"])
            << "each _allgather_base goes through allgather";
    });
}

TEST(FsdpCounts, Fsdp2RanksCountEachCollectiveOnceAsIssued) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    TempDir tmp;
    auto f = run_fsdp_clean(tmp, {});
    expect_issued_counts(f);
    // The records keep gloo's inner calls, as children of the call they serve.
    auto ps = processes_of(f.dump);
    for (const auto& rank : f.ranks) {
        const nlohmann::json* p = process_by_pid(ps, rank["pid"].get<int>());
        if (!p) continue;
        auto edges = record_edges(*p);
        EXPECT_EQ((edges[{"c10d::ProcessGroupGloo::_allgather_base", "c10d::ProcessGroupGloo::allgather"}]),
                  rank["issued"]["all_gather"].get<long>());
        EXPECT_EQ((edges[{"c10d::ProcessGroupGloo::reduce_scatter_tensor_coalesced",
                          "c10d::ProcessGroupGloo::allreduce"}]),
                  rank["issued"]["reduce_scatter"].get<long>());
    }
}

TEST(FsdpCounts, Fsdp2CountsOnlyGiveTheSameCounts) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    TempDir tmp;
    expect_issued_counts(run_fsdp_clean(tmp, {"--counts-only"}));
}

}  // namespace
}  // namespace commdbg::e2e
