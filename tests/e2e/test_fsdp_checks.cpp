// SPDX-License-Identifier: Apache-2.0
// `commdbg check` on the real FSDP2 job (issue 12): tests/testprogs/
// fsdp2_workload.py, 2 ranks on torch 2.6 (CPU + gloo) in the trixie root,
// one injected fault per mode.  What each check must find comes from the
// workload itself: its plan line ("units", "expect": what the in-process
// reference would report) and each rank's own account ("issued" collectives,
// "micro_steps": the unit order its module hooks saw).  Each mode runs once,
// traced from its start; several tests read one run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

using nlohmann::json;

#define REQUIRE_FSDP_JOB()                           \
    do {                                             \
        REQUIRE_BPF();                               \
        REQUIRE_TRIXIE_ROOT(trixie_root());          \
    } while (0)


std::vector<std::string> job_argv(const std::string& mode, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> v = {kRunScript, "--bind", kTestprogs + ":" + kInRoot, trixie_root(), "python3",
                                  kInRoot + "/fsdp2_workload.py", mode};
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
}

// ---- one traced run per mode --------------------------------------------------

struct ModeRun {
    ProcResult r;
    json plan;
    std::vector<json> ranks;  // the workload's rank lines, by rank
    json dump, trace;
    std::vector<json> ps;
    std::string problem;  // why the run cannot be checked; empty: it can
};

ModeRun traced_run(const TempDir& tmp, const std::string& mode) {
    ModeRun m;
    const std::string j = tmp.path(mode + ".json"), t = tmp.path(mode + ".trace.json");
    std::vector<std::string> argv = {commdbg_bin(), "check", "--json", j, "--trace", t, "--"};
    auto job = job_argv(mode);
    argv.insert(argv.end(), job.begin(), job.end());
    m.r = run(argv, kRootJobEnv, 240);
    auto plans = workload_lines(m.r.out, "mode");
    m.ranks = workload_lines(m.r.out, "issued");
    std::sort(m.ranks.begin(), m.ranks.end(),
              [](const json& a, const json& b) { return a["rank"].get<int>() < b["rank"].get<int>(); });
    if (plans.size() != 1 || m.ranks.size() != 2 || !std::filesystem::exists(j) || !std::filesystem::exists(t)) {
        m.problem = "the traced job did not run to its end (status " + std::to_string(m.r.status) + ")\nstdout:\n" +
                    m.r.out.substr(0, 3000) + "\nstderr:\n" + m.r.err.substr(0, 4000);
        return m;
    }
    m.plan = plans[0];
    m.dump = read_json(j);
    m.trace = read_json(t);
    m.ps = processes_of(m.dump);
    for (const auto& rank : m.ranks) {
        const json* p = process_by_pid(m.ps, rank["pid"].get<int>());
        if (!p || !p->contains("fsdp"))
            m.problem += "rank " + rank["rank"].dump() + " (pid " + rank["pid"].dump() +
                         (p ? ") has no \"fsdp\" section\n" : ") is not in the dump\n");
    }
    return m;
}

// Several tests read one mode's run: each mode runs once per test binary.
const ModeRun& mode_run(const std::string& mode) {
    static TempDir tmp;
    static std::map<std::string, ModeRun> runs;
    auto it = runs.find(mode);
    if (it == runs.end()) it = runs.emplace(mode, traced_run(tmp, mode)).first;
    return it->second;
}

const json& fsdp_of(const ModeRun& m, const json& rank) {
    return (*process_by_pid(m.ps, rank["pid"].get<int>()))["fsdp"];
}

int steps_of(const json& plan) { return plan["steps"].get<int>(); }
int micro_steps_of(const json& plan) { return plan["micro_steps"].get<int>(); }

// ---- findings as comparable keys ---------------------------------------------

// "a, b" and "b, a" name the same units.
std::string sorted_units(const std::string& units) {
    std::vector<std::string> v;
    for (size_t at = 0; at <= units.size();) {
        size_t comma = units.find(", ", at);
        if (comma == std::string::npos) comma = units.size();
        v.push_back(units.substr(at, comma - at));
        at = comma + 2;
    }
    std::sort(v.begin(), v.end());
    std::string s;
    for (const auto& u : v) s += (s.empty() ? "" : ", ") + u;
    return s;
}

std::string key(const std::string& check, int g, int m, const std::string& phase, const std::string& unit) {
    return check + " step " + std::to_string(g) + "." + (m < 0 ? "*" : std::to_string(m)) + " " + phase + " " +
           sorted_units(unit);
}

// micro_step null: the whole step.
std::string key_of(const json& f) {
    const bool whole = !f.contains("micro_step") || f["micro_step"].is_null();
    return key(f.value("check", ""), f.value("global_step", -99), whole ? -1 : f["micro_step"].get<int>(),
               f.value("phase", ""), f.value("unit", ""));
}

std::vector<std::string> keys_of(const json& findings) {
    std::vector<std::string> v;
    for (const auto& f : findings) v.push_back(key_of(f));
    std::sort(v.begin(), v.end());
    return v;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
}

// The prefetch_target_not_run a plan entry lists as a side effect
// ({"forward": [[src, target]], "backward": [...]}), in micro-step m of step g.
void add_side_effects(std::vector<std::string>& v, const json& edges_by_phase, int g, int m) {
    for (const auto& [phase, edges] : edges_by_phase.items())
        for (const auto& e : edges) v.push_back(key("prefetch_target_not_run", g, m, phase, e[0]));
}

// The target a prefetch_target_not_run / prefetch_order finding names, by its
// source unit and phase, from the same plan entries.
using Targets = std::map<std::string, std::string>;  // "phase src" -> target
void add_targets(Targets& t, const json& edges_by_phase) {
    for (const auto& [phase, edges] : edges_by_phase.items())
        for (const auto& e : edges) t[phase + " " + e[0].get<std::string>()] = e[1];
}

// Each prefetch finding names its target in the message and its records
// are the source's prefetch scope of that target.
void expect_prefetch_evidence(const json& findings, const Targets& targets) {
    for (const auto& f : findings) {
        if (f["check"] != "prefetch_target_not_run" && f["check"] != "prefetch_order") continue;
        SCOPED_TRACE(f.dump());
        auto it = targets.find(f["phase"].get<std::string>() + " " + f["unit"].get<std::string>());
        ASSERT_NE(it, targets.end());
        EXPECT_NE(f["message"].get<std::string>().find(it->second), std::string::npos);
        ASSERT_FALSE(f["records"].empty());
        for (const auto& r : f["records"])
            EXPECT_EQ(r["name"], "FSDP::" + f["phase"].get<std::string>() + "_prefetch for " + it->second);
    }
}

// The model's orders per micro-step, as the job's own hooks saw them.
void expect_orders_of_workload(const json& fsdp, const json& rank) {
    json got = json::array();
    for (const auto& ms : fsdp["micro_steps"])
        got.push_back({{"global_step", ms["global_step"]}, {"micro_step", ms["micro_step"]},
                       {"forward", ms["forward"]}, {"backward", ms["backward"]}});
    EXPECT_EQ(got, rank["micro_steps"]) << "commdbg: " << got.dump() << "\nworkload: " << rank["micro_steps"].dump();
}

#define REQUIRE_MODE(var, mode)                              \
    REQUIRE_FSDP_JOB();                                      \
    const ModeRun& var = mode_run(mode);                     \
    ASSERT_TRUE(var.problem.empty()) << var.problem;         \
    ASSERT_EQ(var.plan["mode"], mode) << var.plan.dump()

// ---- the modes ------------------------------------------------------------------

TEST(FsdpChecks, CleanRunPassesWithTheUnitOrdersTheModelRan) {
    REQUIRE_MODE(m, "clean");
    EXPECT_EQ(m.r.status, 0) << m.r.err.substr(0, 3000);
    EXPECT_EQ(m.plan["expect"], json::object()) << "the clean plan expects a finding";
    const int blocks = m.plan["blocks"].get<int>();
    // The model as the plan describes it: the root, then layers 0..B-1 in
    // forward, the reverse in backward.
    json forward = {"<root>"}, backward = {"<root>"};
    for (int i = 0; i < blocks; ++i) forward.push_back("layers." + std::to_string(i));
    for (int i = blocks - 1; i >= 0; --i) backward.push_back("layers." + std::to_string(i));
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        EXPECT_EQ(f["violations"], json::array()) << f["violations"].dump(1);
        EXPECT_EQ(f["warnings"], json::array()) << f["warnings"].dump(1);
        expect_orders_of_workload(f, rank);
        ASSERT_EQ(rank["micro_steps"].size(), size_t(steps_of(m.plan) * micro_steps_of(m.plan)));
        for (const auto& ms : f["micro_steps"]) {
            EXPECT_EQ(ms["forward"], forward) << ms.dump();
            EXPECT_EQ(ms["backward"], backward) << ms.dump();
        }
        EXPECT_EQ(f["units"], m.plan["units"]);
        EXPECT_EQ(f["optimizer_steps"], steps_of(m.plan));
        EXPECT_EQ(f["window"], "from_start");
    }
    EXPECT_TRUE(!m.dump.contains("cross_rank") || m.dump["cross_rank"].empty()) << m.dump["cross_rank"].dump(1);
}

TEST(FsdpChecks, BadPrefetchGivesPrefetchOrderAndTargetNotRunInEveryMicroStep) {
    REQUIRE_MODE(m, "bad_prefetch");
    EXPECT_EQ(m.r.status, 3) << m.r.err.substr(0, 3000);
    // Top-level pairs of the plan hold in every micro-step; both edges are
    // forward-prefetch edges (the workload's docstring).
    std::vector<std::string> want;
    Targets targets;
    for (const auto& [check, edges] : m.plan["expect"].items())
        for (const auto& e : edges) {
            targets["forward " + e[0].get<std::string>()] = e[1];
            for (int g = 0; g < steps_of(m.plan); ++g)
                for (int ms = 0; ms < micro_steps_of(m.plan); ++ms) want.push_back(key(check, g, ms, "forward", e[0]));
        }
    ASSERT_EQ(want.size(), size_t(2 * steps_of(m.plan) * micro_steps_of(m.plan))) << m.plan.dump();
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        EXPECT_EQ(keys_of(f["violations"]), sorted(want));
        EXPECT_EQ(f["warnings"], json::array()) << f["warnings"].dump(1);
        expect_prefetch_evidence(f["violations"], targets);
        expect_orders_of_workload(f, rank);
        EXPECT_EQ(f["units"], m.plan["units"]) << "the never-run unit is a unit too";
    }
    EXPECT_TRUE(m.dump["cross_rank"].empty()) << m.dump["cross_rank"].dump(1);
}

TEST(FsdpChecks, PendingAllGatherNamesTheUnitAtEachOptimizerStep) {
    REQUIRE_MODE(m, "pending_all_gather");
    EXPECT_EQ(m.r.status, 3) << m.r.err.substr(0, 3000);
    std::vector<std::string> want;
    for (const auto& e : m.plan["expect"]["pending_all_gather"])
        want.push_back(key("pending_all_gather", e["global_step"].get<int>(), -1, "optimizer", e["unit"]));
    ASSERT_EQ(want.size(), size_t(steps_of(m.plan))) << m.plan.dump();
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        EXPECT_EQ(keys_of(f["violations"]), sorted(want));
        EXPECT_EQ(f["warnings"], json::array()) << f["warnings"].dump(1);
        for (const auto& v : f["violations"]) {
            SCOPED_TRACE(v.dump());
            const std::string unit = v["unit"];
            EXPECT_NE(v["message"].get<std::string>().find(unit), std::string::npos);
            // The proof: the unit's all-gather, then the optimizer step it was left pending at.
            ASSERT_EQ(v["records"].size(), 2u);
            EXPECT_EQ(v["records"][0]["name"], "FSDP::all_gather (" + unit + ")");
            EXPECT_EQ(v["records"][1]["name"].get<std::string>().rfind("Optimizer.step", 0), 0u);
            EXPECT_LT(v["records"][0]["start_ns"].get<uint64_t>(), v["records"][1]["start_ns"].get<uint64_t>());
        }
        expect_orders_of_workload(f, rank);
    }
    EXPECT_TRUE(m.dump["cross_rank"].empty()) << m.dump["cross_rank"].dump(1);
}

TEST(FsdpChecks, NoSyncWarnsWithTheExtraReduceScattersAndPasses) {
    REQUIRE_MODE(m, "no_sync");
    EXPECT_EQ(m.r.status, 0) << "warnings do not fail\n" << m.r.err.substr(0, 3000);
    const ModeRun& clean = mode_run("clean");
    ASSERT_TRUE(clean.problem.empty()) << clean.problem;
    const auto& expect = m.plan["expect"]["unsynced_reduce"];
    ASSERT_FALSE(expect.empty()) << m.plan.dump();
    std::vector<std::string> want;
    for (const auto& e : expect) {
        std::string units;
        for (const auto& u : e["units"]) units += (units.empty() ? "" : ", ") + u.get<std::string>();
        want.push_back(key("grad_sync_non_final_micro_step", e["global_step"].get<int>(), e["micro_step"].get<int>(),
                           "backward", units));
    }
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        EXPECT_EQ(f["violations"], json::array()) << f["violations"].dump(1);
        EXPECT_EQ(keys_of(f["warnings"]), sorted(want));
        // The reduce-scatters this job issued beyond the clean (synced) job's,
        // per unsynced micro-step: one per unit the plan says was reduced.
        const int extra = rank["issued"]["reduce_scatter"].get<int>() -
                          clean.ranks[rank["rank"].get<int>()]["issued"]["reduce_scatter"].get<int>();
        ASSERT_EQ(extra % int(expect.size()), 0);
        for (const auto& w : f["warnings"]) {
            SCOPED_TRACE(w.dump());
            EXPECT_EQ(w["extra_collectives"].get<int>(), extra / int(expect.size()));
            EXPECT_EQ(w["extra_collectives"].get<size_t>(), expect[0]["units"].size());
            EXPECT_FALSE(w["records"].empty());
        }
        expect_orders_of_workload(f, rank);
    }
    EXPECT_TRUE(m.dump["cross_rank"].empty()) << m.dump["cross_rank"].dump(1);
}

TEST(FsdpChecks, BypassedChildFromStepOneWithItsPrefetchSideEffects) {
    REQUIRE_MODE(m, "bypassed_child");
    EXPECT_EQ(m.r.status, 3) << m.r.err.substr(0, 3000);
    std::vector<std::string> want;
    Targets targets;
    for (const auto& e : m.plan["expect"]["bypassed_child"]) {
        const int g = e["global_step"].get<int>();
        EXPECT_GE(g, 1) << "the bypass begins in step 1";
        want.push_back(key("bypassed_child", g, -1, "backward", e["unit"]));
        for (int ms = 0; ms < micro_steps_of(m.plan); ++ms) add_side_effects(want, e["prefetch_target_not_run"], g, ms);
        add_targets(targets, e["prefetch_target_not_run"]);
    }
    ASSERT_EQ(m.plan["expect"]["bypassed_child"].size(), size_t(steps_of(m.plan) - 1)) << m.plan.dump();
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        EXPECT_EQ(keys_of(f["violations"]), sorted(want));
        EXPECT_EQ(f["warnings"], json::array()) << f["warnings"].dump(1);
        expect_prefetch_evidence(f["violations"], targets);
        for (const auto& v : f["violations"])
            if (v["check"] == "bypassed_child") {
                EXPECT_NE(v["message"].get<std::string>().find(v["unit"].get<std::string>()), std::string::npos);
                EXPECT_FALSE(v["records"].empty()) << v.dump();
            }
        expect_orders_of_workload(f, rank);
    }
    EXPECT_TRUE(m.dump["cross_rank"].empty()) << m.dump["cross_rank"].dump(1);
}

// The first forward position where the ranks' own accounts differ in micro-step
// (g, m): {rank 0's unit, rank 1's unit}.
std::pair<std::string, std::string> first_forward_difference(const std::vector<json>& ranks, int g, int m) {
    auto at = [&](const json& rank) {
        for (const auto& ms : rank["micro_steps"])
            if (ms["global_step"] == g && ms["micro_step"] == m) return ms["forward"];
        return json::array();
    };
    json a = at(ranks[0]), b = at(ranks[1]);
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        if (a[i] != b[i]) return {a[i], b[i]};
    return {};
}

// The per-rank violations the plan lists for rank_divergence: the divergent
// rank's prefetch side effects in the divergent micro-step, none elsewhere.
std::vector<std::string> divergence_side_effects(const json& plan, int rank, Targets* targets) {
    std::vector<std::string> v;
    for (const auto& e : plan["expect"]["rank_divergence"]) {
        if (e["rank"] != rank) continue;
        add_side_effects(v, e["prefetch_target_not_run"], e["global_step"].get<int>(), e["micro_step"].get<int>());
        if (targets) add_targets(*targets, e["prefetch_target_not_run"]);
    }
    return sorted(v);
}

bool has_thread(const json& process, uint32_t tid) {
    for (const auto& t : process["threads"])
        if (t.get<uint32_t>() == tid) return true;
    return false;
}

TEST(FsdpChecks, RankDivergenceIsOneCrossRankFindingAtTheFirstDifference) {
    REQUIRE_MODE(m, "rank_divergence");
    EXPECT_EQ(m.r.status, 3) << m.r.err.substr(0, 3000);
    const auto& expect = m.plan["expect"]["rank_divergence"];
    ASSERT_EQ(expect.size(), 1u) << m.plan.dump();
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const json& f = fsdp_of(m, rank);
        Targets targets;
        EXPECT_EQ(keys_of(f["violations"]), divergence_side_effects(m.plan, rank["rank"].get<int>(), &targets));
        EXPECT_EQ(f["warnings"], json::array()) << f["warnings"].dump(1);
        expect_prefetch_evidence(f["violations"], targets);
        expect_orders_of_workload(f, rank);
    }
    const int g = expect[0]["global_step"].get<int>(), ms = expect[0]["micro_step"].get<int>();
    const auto [unit0, unit1] = first_forward_difference(m.ranks, g, ms);
    ASSERT_EQ(unit0, expect[0]["skipped"]) << "the workload's own orders differ elsewhere";
    const auto& cross = m.dump["cross_rank"];
    ASSERT_EQ(cross.size(), 1u) << cross.dump(1);
    const json& c = cross[0];
    EXPECT_EQ(keys_of(cross), std::vector<std::string>{key("rank_divergence", g, ms, "forward", unit1)});
    const std::string msg = c["message"];
    const std::string pid0 = m.ranks[0]["pid"].dump(), pid1 = m.ranks[1]["pid"].dump();
    for (const std::string& s : {unit0, unit1, "pid " + pid0, "pid " + pid1})
        EXPECT_NE(msg.find(s), std::string::npos) << "message lacks '" << s << "': " << msg;
    // Evidence from both ranks' threads.
    std::set<int> ranks_seen;
    for (const auto& r : c["records"])
        for (const auto& rank : m.ranks)
            if (has_thread(*process_by_pid(m.ps, rank["pid"].get<int>()), r["tid"].get<uint32_t>()))
                ranks_seen.insert(rank["rank"].get<int>());
    EXPECT_EQ(ranks_seen, (std::set<int>{0, 1})) << c["records"].dump();
}

TEST(FsdpChecks, TraceHasOneInstantEventPerViolationOnItsLastRecordsThread) {
    REQUIRE_MODE(m, "bad_prefetch");
    for (const auto& rank : m.ranks) {
        SCOPED_TRACE("rank " + rank["rank"].dump());
        const int pid = rank["pid"].get<int>();
        const json& f = fsdp_of(m, rank);
        ASSERT_FALSE(f["violations"].empty());
        std::vector<std::string> want, got;
        for (const auto& v : f["violations"]) {
            ASSERT_FALSE(v["records"].empty()) << v.dump();
            const json& last = v["records"].back();
            want.push_back(v["check"].get<std::string>() + " tid " + last["tid"].dump() + " at " + last["start_ns"].dump() +
                           " " + key_of(v));
        }
        for (const auto& e : m.trace["traceEvents"]) {
            if (e.value("ph", "") != "i" || e.value("cat", "") != "fsdp" || e.value("pid", -1) != pid) continue;
            json a = e["args"];
            a["check"] = e["name"];  // the event is named after its check
            const long long ts_ns = std::llround(e["ts"].get<double>() * 1000.0);
            got.push_back(e["name"].get<std::string>() + " tid " + e["tid"].dump() + " at " + std::to_string(ts_ns) +
                          " " + key_of(a));
        }
        EXPECT_EQ(sorted(got), sorted(want));
    }
}

// ---- --from on dumps written separately ---------------------------------------

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string cmdline_of(int pid) {
    std::string s = read_text("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(s.begin(), s.end(), '\0', ' ');
    return s;
}

// The launcher's two rank processes (multiprocessing's spawn_main, not its
// resource tracker), once both have loaded libtorch: the probes attach at
// once instead of at a later loader event.
std::vector<int> rank_processes(int launcher, int timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
        std::vector<int> ranks;
        for (const auto& [pid, state] : children_of(launcher))
            if (cmdline_of(pid).find("spawn_main") != std::string::npos &&
                read_text("/proc/" + std::to_string(pid) + "/maps").find("libtorch_cpu") != std::string::npos)
                ranks.push_back(pid);
        if (ranks.size() == 2) return ranks;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return {};
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// A file the workload waits for, inside the root (ROOT/var/tmp/NAME is
// /var/tmp/NAME there); removed at the end.
struct RootWaitFile {
    std::string name = "commdbg-fsdp-checks-" + std::to_string(getpid());
    std::string host = trixie_root() + "/var/tmp/" + name;
    std::string in_root = "/var/tmp/" + name;
    RootWaitFile() { std::filesystem::remove(host); }
    ~RootWaitFile() { std::filesystem::remove(host); }
};

TEST(FsdpChecks, FromDumpsWrittenSeparatelyGivesTheTracedRunsCrossRankVerdict) {
    REQUIRE_MODE(traced, "rank_divergence");
    ASSERT_EQ(traced.dump["cross_rank"].size(), 1u) << "no cross-rank verdict to compare with";
    TempDir tmp;
    RootWaitFile wait;
    Background job(job_argv("rank_divergence", {"--wait-file", wait.in_root}), kRootJobEnv);
    const std::string plan_line = job.wait_for_line("\"mode\"", 120);
    ASSERT_FALSE(plan_line.empty()) << "no plan line\n" << job.wait(5).err.substr(0, 3000);
    const int launcher = json::parse(plan_line)["pid"].get<int>();
    const std::vector<int> pids = rank_processes(launcher, 120);
    ASSERT_EQ(pids.size(), 2u) << "the ranks of launcher " << launcher << " did not start";

    // One commdbg check per rank, as on two nodes, each attached before the ranks' first step.
    std::vector<std::unique_ptr<Background>> checks;
    for (int pid : pids) {
        checks.push_back(std::make_unique<Background>(std::vector<std::string>{
            commdbg_bin(), "check", "--json", tmp.path(std::to_string(pid) + ".json"), std::to_string(pid)}));
        ASSERT_FALSE(checks.back()->wait_for_err_line("tracing", 60).empty())
            << "commdbg check " << pid << " did not start\n" << checks.back()->wait(5).err;
    }
    touch(wait.host);
    auto jr = job.wait(240);
    ASSERT_EQ(jr.status, 0) << jr.err.substr(0, 3000);
    auto ranks = workload_lines(jr.out, "issued");
    ASSERT_EQ(ranks.size(), 2u) << jr.out.substr(0, 2000);
    std::map<int, int> rank_of;  // pid -> rank
    for (const auto& r : ranks) rank_of[r["pid"].get<int>()] = r["rank"].get<int>();
    std::vector<std::string> dumps(2);
    std::vector<std::string> names(2);  // each rank's name in the traced run's message
    for (size_t i = 0; i < pids.size(); ++i) {
        const int pid = pids[i];
        ASSERT_EQ(rank_of.count(pid), 1u) << "pid " << pid << " is not a rank";
        const int rank = rank_of[pid];
        SCOPED_TRACE("rank " + std::to_string(rank) + " pid " + std::to_string(pid));
        auto cr = checks[i]->wait(120);
        // Per rank: rank 1 has the divergence's side effects, rank 0 nothing.
        const auto want = divergence_side_effects(traced.plan, rank, nullptr);
        EXPECT_EQ(cr.status, want.empty() ? 0 : 3) << cr.err.substr(0, 3000);
        dumps[rank] = tmp.path(std::to_string(pid) + ".json");
        ASSERT_TRUE(std::filesystem::exists(dumps[rank])) << cr.err.substr(0, 3000);
        auto ps = processes_of(read_json(dumps[rank]));
        const json* p = process_by_pid(ps, pid);
        ASSERT_TRUE(p && p->contains("fsdp")) << "rank not checked in its dump";
        EXPECT_EQ(keys_of((*p)["fsdp"]["violations"]), want);
        names[rank] = "pid " + traced.ranks[rank]["pid"].dump();
    }

    const std::string combined = tmp.path("combined.json");
    auto fr = run({commdbg_bin(), "check", "--from", dumps[0], dumps[1], "--json", combined}, {}, 60);
    EXPECT_EQ(fr.status, 3) << fr.out.substr(0, 3000) << fr.err;
    ASSERT_TRUE(std::filesystem::exists(combined)) << fr.err;
    const json cross = read_json(combined)["cross_rank"];
    EXPECT_EQ(keys_of(cross), keys_of(traced.dump["cross_rank"])) << cross.dump(1);
    ASSERT_EQ(cross.size(), 1u);
    // The same words; the ranks are named by pid there, by file and pid here.
    std::string traced_msg = traced.dump["cross_rank"][0]["message"], from_msg = cross[0]["message"];
    for (int rank = 0; rank < 2; ++rank) {
        replace_all(traced_msg, names[rank], "RANK" + std::to_string(rank));
        for (const auto& [pid, r] : rank_of)
            if (r == rank) replace_all(from_msg, dumps[rank] + " (pid " + std::to_string(pid) + ")", "RANK" + std::to_string(rank));
    }
    EXPECT_EQ(from_msg, traced_msg) << "as written: " << cross[0]["message"];
}

// ---- usage errors ---------------------------------------------------------------------

TEST(FsdpChecks, FromRejectsDumpsWithoutScopesAndMissingFiles) {
    TempDir tmp;
    const std::string bare = tmp.path("bare.json");
    std::ofstream(bare) << R"({"records": []})" << "\n";
    auto r = run({commdbg_bin(), "check", "--from", bare}, {}, 30);
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("commdbg check --json"), std::string::npos) << "says how to write a dump: " << r.err;

    const std::string missing = tmp.path("no-such-dump.json");
    auto m = run({commdbg_bin(), "check", "--from", bare, missing}, {}, 30);
    EXPECT_EQ(m.status, 1) << m.out << m.err;
    EXPECT_NE(m.err.find(missing), std::string::npos) << "names the file: " << m.err;
}

TEST(FsdpChecks, CheckWithoutTargetOrWithCountsOnlyIsAUsageError) {
    auto none = run({commdbg_bin(), "check"}, {}, 30);
    EXPECT_EQ(none.status, 2) << none.out << none.err;
    for (const char* hint : {"PID", "--from", "--help"})
        EXPECT_NE(none.err.find(hint), std::string::npos) << "usage hint lacks " << hint << ": " << none.err;
    auto counts = run({commdbg_bin(), "check", "--counts-only", "--", "true"}, {}, 30);
    EXPECT_EQ(counts.status, 2) << counts.out << counts.err;
    EXPECT_NE(counts.err.find("--counts-only"), std::string::npos) << counts.err;
}

// The documented form, `commdbg check PID [--duration S]`: the options after
// the PID are commdbg's, not a command line to run.
TEST(FsdpChecks, CheckPidTakesItsOptionsAfterThePid) {
    REQUIRE_BPF();
    Background sleeper({testprog("plain_sleeper"), "20000"});
    auto r = run({commdbg_bin(), "check", std::to_string(sleeper.pid()), "--duration", "1"}, {}, 60);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("tracing pid " + std::to_string(sleeper.pid())), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("cannot execute"), std::string::npos) << "the PID and its options run as a command: " << r.err;
}

}  // namespace
}  // namespace commdbg::e2e
