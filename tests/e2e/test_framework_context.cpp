// SPDX-License-Identifier: Apache-2.0
// Framework context on real torch (issue 11, points 1 and 4): a 2-rank gloo
// job (tests/testprogs/torch_module_workload.py) traced by `commdbg run`
// with the c10d and record_function-scope specs, on the host's torch 1.13
// (Debian /usr/bin/python3.11) and on torch 2.6 chrooted in the trixie root
// (python 3.13).  Each rank reports what it issued from which module; the
// trace must agree exactly: module records with the right FQNs and classes
// nesting each collective (forward, and backward for the bound-method hook),
// module_comm_counts equal to the workload's own, `my_phase` scopes nesting
// their collective, one Optimizer.step#SGD.step / zero_grad scope per step,
// and a scope an exception left closed with the job alive.  A second job
// per torch runs the same steps under torch.profiler.profile: the
// dispatcher's own RecordFunctions (scope FUNCTION, an end() per op) fire
// around everything, and the user scopes must come out exactly as without.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

constexpr int kSteps = 3;
const std::string kWorkloadName = "torch_module_workload.py";
const std::string kInRootProgs = "/opt/commdbg-testprogs";
const std::map<std::string, std::string> kModuleClass = {
    {"<root>", "Model"},          {"encoder", "Encoder"},
    {"encoder.blocks.0", "Block"}, {"encoder.blocks.0.mixer", "Mixer"},
    {"encoder.blocks.1", "Block"}, {"encoder.blocks.1.mixer", "Mixer"},
};

struct Variant {
    std::string name;
    bool trixie;
};

// gtest names a parameter by this in its output.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::string unavailable_reason(const Variant& v) {
    if (!v.trixie) {
        auto r = run({"/usr/bin/python3.11", "-c", "import torch, torch.distributed as d; assert d.is_gloo_available()"},
                     {}, 60);
        return r.status == 0 ? "" : "/usr/bin/python3.11 does not import torch with gloo (apt install python3-torch)";
    }
    const std::string root = trixie_root();
    if (geteuid() != 0) return "needs root (mount, chroot)";
    if (!std::filesystem::exists(root + "/.commdbg-trixie-root"))
        return "no trixie root at " + root + " (build it: make trixie-root)";
    return {};
}

// One traced job per variant and profiler setting, shared by the tests
// that read it (a run takes ~15 s).
struct JobRun {
    ProcResult r;
    nlohmann::json dump;
    nlohmann::json plan;
    std::vector<nlohmann::json> ranks;  // the workload's own rank lines
};

JobRun run_job(const Variant& v, bool profiler) {
    JobRun j;
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--probes", "torch-c10d,torch-scopes,torch-modules,torch-autograd", "--noise-level", "2",
                                     "--json", tmp.path("out.json"), "--"};
    if (v.trixie)
        argv.insert(argv.end(), {std::string(SOURCE_DIR) + "/tests/trixie_run.sh", "--bind",
                                 std::string(SOURCE_DIR) + "/tests/testprogs:" + kInRootProgs, trixie_root(),
                                 "python3", kInRootProgs + "/" + kWorkloadName});
    else
        argv.insert(argv.end(), {"/usr/bin/python3.11", std::string(SOURCE_DIR) + "/tests/testprogs/" + kWorkloadName});
    argv.insert(argv.end(), {"train", std::to_string(kSteps)});
    if (profiler) argv.push_back("--profiler");
    j.r = run(argv, v.trixie ? kRootJobEnv : std::map<std::string, std::string>{}, 300);
    if (std::filesystem::exists(tmp.path("out.json"))) j.dump = read_json(tmp.path("out.json"));
    auto plans = workload_lines(j.r.out, "mode");
    if (!plans.empty()) j.plan = plans[0];
    j.ranks = workload_lines(j.r.out, "rank");
    return j;
}

const JobRun& job(const Variant& v, bool profiler = false) {
    static std::map<std::pair<std::string, bool>, std::unique_ptr<JobRun>> runs;
    auto& slot = runs[{v.name, profiler}];
    if (!slot) slot = std::make_unique<JobRun>(run_job(v, profiler));
    return *slot;
}

// A record and the records enclosing it, outermost first.
struct Placed {
    const nlohmann::json* rec;
    std::vector<const nlohmann::json*> up;
};

void walk(const nlohmann::json& records, std::vector<const nlohmann::json*>& up, std::vector<Placed>& out) {
    for (const auto& r : records) {
        out.push_back({&r, up});
        if (!r.contains("children")) continue;
        up.push_back(&r);
        walk(r["children"], up, out);
        up.pop_back();
    }
}

std::vector<Placed> placed_records(const nlohmann::json& proc) {
    std::vector<Placed> out;
    std::vector<const nlohmann::json*> up;
    walk(proc["records"], up, out);
    return out;
}

bool is_type(const nlohmann::json* r, const std::string& t) { return r->value("type", "") == t; }

// The collectives a user issued: collective records under no other one
// (the c10d method a Python call entered first, not what it called).
std::vector<Placed> outermost_collectives(const std::vector<Placed>& all) {
    std::vector<Placed> out;
    for (const auto& p : all) {
        if (!is_type(p.rec, "collective")) continue;
        bool nested = false;
        for (const auto* u : p.up) nested = nested || is_type(u, "collective");
        if (!nested) out.push_back(p);
    }
    return out;
}

// The workload function that issued a collective: the frame right under
// the workload's Tally.all_reduce in the record's stack ("" if none).
std::string issuing_function(const nlohmann::json& rec) {
    if (!rec.contains("py_stack")) return "";
    const auto& st = rec["py_stack"];
    for (size_t i = 0; i + 1 < st.size(); ++i)
        if (st[i].value("qualname", "") == "Tally.all_reduce") return st[i + 1].value("qualname", "");
    return "";
}

// {fqn: {side: {kind: n}}} without empty sides or zero counts, so "absent"
// and "0" read the same on both sides.
using Counts = std::map<std::string, std::map<std::string, std::map<std::string, int>>>;
Counts normalized(const nlohmann::json& j) {
    Counts c;
    if (!j.is_object()) return c;
    for (const auto& [fqn, sides] : j.items())
        for (const auto& [side, kinds] : sides.items())
            for (const auto& [kind, n] : kinds.items())
                if (n.get<int>() != 0) c[fqn][side][kind] = n.get<int>();
    return c;
}

std::map<std::string, int> int_map(const nlohmann::json& j) {
    std::map<std::string, int> m;
    for (const auto& [k, n] : j.items()) m[k] = n.get<int>();
    return m;
}

// The scope records of a process by name, the earliest scope's missing
// torch 1.13 label restored from the rank's own account.  torch 1.13 keeps
// labels in Python: the kernel reads them once userspace has seen one
// scope's record_function class, so the very first scope is named only if
// it was still open when userspace read it (docs/python.md, "Scopes").  That one may
// be "<unnamed>" -- never another scope, never a wrong name.
std::map<std::string, int> traced_scopes(const std::vector<Placed>& all, const nlohmann::json& rank, bool torch113) {
    std::map<std::string, int> scopes;
    const nlohmann::json* first = nullptr;  // the process's earliest scope
    for (const auto& s : all) {
        if (!is_type(s.rec, "scope")) continue;
        scopes[s.rec->value("name", "")]++;
        if (!first || s.rec->value("start_ns", 0ull) < first->value("start_ns", 0ull)) first = s.rec;
    }
    if (!torch113 || !scopes.count("<unnamed>")) return scopes;
    EXPECT_EQ(scopes["<unnamed>"], 1);
    EXPECT_EQ(first ? first->value("name", "") : "", "<unnamed>") << "an unnamed scope that is not the first";
    scopes.erase("<unnamed>");
    for (const auto& [label, n] : int_map(rank["scopes"])) {
        auto it = scopes.find(label);
        if ((it == scopes.end() ? 0 : it->second) == n - 1) {
            scopes[label] = n;  // the first scope's own label
            break;
        }
    }
    return scopes;
}

// The innermost scope or module record above a record (nullptr if none).
const nlohmann::json* innermost_context(const Placed& p) {
    const nlohmann::json* ctx = nullptr;
    for (const auto* u : p.up)
        if (is_type(u, "scope") || is_type(u, "module")) ctx = u;
    return ctx;
}

// Outermost collectives per scope name, counted where the scope is their
// innermost context.
std::map<std::string, int> collectives_in_scopes(const std::vector<Placed>& all) {
    std::map<std::string, int> in;
    for (const auto& c : outermost_collectives(all)) {
        const nlohmann::json* ctx = innermost_context(c);
        if (ctx && is_type(ctx, "scope")) in[ctx->value("name", "")]++;
    }
    return in;
}

// How often the tracer saw at::RecordFunction::end() in a process.
int record_function_ends(const nlohmann::json& proc) {
    int n = 0;
    for (const auto& c : proc.value("counters", nlohmann::json::array()))
        if (c.value("name", "") == "at::RecordFunction::end") n += c.value("calls", 0);
    return n;
}

class FrameworkContext : public ::testing::TestWithParam<Variant> {
protected:
    // The traced job of this variant, checked to have run everywhere;
    // nullptr (with a failure recorded) otherwise.
    const JobRun* job_or_fail(bool profiler = false) {
        const JobRun& j = job(GetParam(), profiler);
        EXPECT_EQ(j.r.status, 0) << "the traced job failed\n" << j.r.err.substr(0, 4000);
        EXPECT_FALSE(j.dump.is_null()) << "no JSON written\n" << j.r.err.substr(0, 4000);
        EXPECT_EQ(j.ranks.size(), 2u) << j.r.out.substr(0, 3000);
        if (j.r.status != 0 || j.dump.is_null() || j.ranks.size() != 2) return nullptr;
        return &j;
    }
};

#define REQUIRE_VARIANT()                                        \
    do {                                                         \
        REQUIRE_BPF();                                           \
        REQUIRE_NO_REASON(unavailable_reason(GetParam()));       \
    } while (0)

// Where the job ran: torch 1.13 on the host, 2.x in the root.
TEST_P(FrameworkContext, JobRanOnTheIntendedTorch) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    const std::string torch = j->plan.value("torch", "");
    if (GetParam().trixie) {
        EXPECT_EQ(j->plan["python"], "3.13");
        EXPECT_EQ(torch.rfind("2.", 0), 0u) << torch;
    } else {
        EXPECT_EQ(j->plan["python"], "3.11");
        EXPECT_EQ(torch.rfind("1.13", 0), 0u) << torch;
    }
}

// module_comm_counts is exactly what each rank counted as it issued:
// forward counts transitive over the modules running (<root> 4 per step,
// encoder 3, encoder.blocks.0[.mixer] 1, encoder.blocks.1[.mixer] 2), the
// hook's collective backward under encoder.blocks.1.mixer, the modules it was called from
// and encoder.blocks.1.mixer.proj, whose backward began last (as CommDebugMode counts it).
TEST_P(FrameworkContext, ModuleCommCountsExactPerRank) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    auto ps = processes_of(j->dump);
    for_each_rank_process(ps, j->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        const Counts want = normalized(rank["module_comm_counts"]);
        // The workload's plan, pinned here so a changed workload cannot pass by itself.
        ASSERT_EQ(want.at("encoder.blocks.1.mixer").at("backward").at("c10d.all_reduce"), kSteps);
        ASSERT_EQ(want.at("<root>").at("forward").at("c10d.all_reduce"), 4 * kSteps);
        ASSERT_TRUE(p.contains("module_comm_counts")) << "no module_comm_counts in the rank's JSON";
        EXPECT_EQ(normalized(p["module_comm_counts"]), want) << p["module_comm_counts"].dump(1);
        EXPECT_EQ(p["comm_counts"].value("c10d.all_reduce", 0), rank["calls"]["all_reduce"].get<int>())
            << p["comm_counts"].dump();
    });
}

// parameter_info holds every module's own parameters, shape and dtype, as
// the model itself lists them (named_parameters(recurse=False)); the Linear
// modules issue no record of their own and are read through their parents.
TEST_P(FrameworkContext, ParameterInfoIsTheModelsOwnParameters) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    for_each_rank_process(processes_of(j->dump), j->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        ASSERT_TRUE(p.contains("parameter_info")) << "no parameter_info in the rank's JSON";
        nlohmann::json got = nlohmann::json::object();
        for (const auto& [fqn, params] : p["parameter_info"].items())
            for (const auto& [name, info] : params.items()) {
                got[fqn][name] = {{"shape", info["shape"]}, {"dtype", info["dtype"]}};
                EXPECT_EQ(info["local_shape"], info["shape"]) << fqn << "." << name << ": not a DTensor";
            }
        EXPECT_EQ(got, rank["parameters"]) << p["parameter_info"].dump(1);
        EXPECT_TRUE(p.value("sharding_info", nlohmann::json::object()).empty());
    });
}

// Each collective sits under the module records of the modules that were
// running, with the right FQNs, classes and event types: Mixer.forward's
// under <root>/encoder/encoder.blocks.K/encoder.blocks.K.mixer forward,
// Model.forward's under <root> alone, the hook's under
// encoder.blocks.1.mixer backward; collectives outside any module have no
// module record above them.
TEST_P(FrameworkContext, CollectivesNestUnderTheirModuleRecords) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    auto ps = processes_of(j->dump);
    for_each_rank_process(ps, j->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        auto all = placed_records(p);
        for (const auto& m : all) {
            if (!is_type(m.rec, "module")) continue;
            const std::string fqn = m.rec->value("module_fqn", "");
            ASSERT_TRUE(kModuleClass.count(fqn)) << "unexpected module record " << m.rec->dump();
            EXPECT_EQ(m.rec->value("module_class", ""), kModuleClass.at(fqn)) << fqn;
        }
        std::map<std::string, int> by_site;  // "<issuer> in <innermost fqn> <event>"
        auto colls = outermost_collectives(all);
        for (const auto& c : colls) {
            std::vector<const nlohmann::json*> mods;
            for (const auto* u : c.up)
                if (is_type(u, "module")) mods.push_back(u);
            const std::string issuer = issuing_function(*c.rec);
            std::string key = issuer + " in " +
                              (mods.empty() ? "-" : mods.back()->value("module_fqn", "?") + " " +
                                                        mods.back()->value("event_type", "?"));
            by_site[key]++;
            if (mods.empty() || mods.back()->value("event_type", "") != "forward") continue;
            // A forward chain is the path from <root>: each FQN extends its parent's.
            std::vector<std::string> chain;
            for (const auto* m : mods) chain.push_back(m->value("module_fqn", ""));
            EXPECT_EQ(chain.front(), "<root>") << key;
            for (size_t i = 1; i < chain.size(); ++i) {
                const std::string parent = i == 1 ? "" : chain[i - 1] + ".";
                EXPECT_EQ(chain[i].rfind(parent, 0), 0u) << chain[i] << " under " << chain[i - 1];
                EXPECT_EQ(mods[i]->value("event_type", ""), "forward");
            }
        }
        const std::map<std::string, int> want = {
            {"Mixer.forward in encoder.blocks.0.mixer forward", kSteps},
            {"Mixer.forward in encoder.blocks.1.mixer forward", 2 * kSteps},
            {"Model.forward in <root> forward", kSteps},
            {"Mixer.on_backward in encoder.blocks.1.mixer backward", kSteps},
            {"step.<locals>.<lambda> in -", kSteps},
            {"failing in -", kSteps},
        };
        EXPECT_EQ(by_site, want) << "issuer in innermost module record, per outermost collective";
        EXPECT_EQ(static_cast<int>(colls.size()), rank["calls"]["all_reduce"].get<int>());
    });
}

// record_function scopes: `my_phase` nests its one collective, one scope
// per step; Optimizer.step#SGD.step and Optimizer.zero_grad#SGD.zero_grad
// once per step (torch 2.x names them at record_function_enter_new, 1.13
// through the record_function object on the stack).
TEST_P(FrameworkContext, RecordFunctionScopesNestTheirCollectives) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    auto ps = processes_of(j->dump);
    for_each_rank_process(ps, j->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        auto all = placed_records(p);
        const std::map<std::string, int> want_scopes = int_map(rank["scopes"]);
        const auto scopes = traced_scopes(all, rank, !GetParam().trixie);
        const auto collectives_in = collectives_in_scopes(all);
        ASSERT_EQ(want_scopes.at("my_phase"), kSteps);
        EXPECT_EQ(scopes, want_scopes);
        EXPECT_EQ(collectives_in, int_map(rank["scope_collectives"]))
            << "collectives whose innermost context is the scope";
    });
}

// The ValueError that leaves `failing_phase` closes the scope through
// record_function's __exit__ (end() fires): every such scope has its end,
// not an inferred one, and the ranks went on and exited 0.
TEST_P(FrameworkContext, ExceptionThroughScopeLeavesTargetAliveAndScopeClosed) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    auto ps = processes_of(j->dump);
    for_each_rank_process(ps, j->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        EXPECT_EQ(rank["failing_phase_caught"].get<int>(), kSteps);
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        int closed = 0;
        for (const auto& s : placed_records(p)) {
            if (!is_type(s.rec, "scope")) continue;
            EXPECT_FALSE(s.rec->value("end_inferred", false)) << "scope left open: " << s.rec->dump();
            if (s.rec->value("name", "") == "failing_phase" && s.rec->contains("end_ns")) ++closed;
        }
        EXPECT_EQ(closed, kSteps);
    });
}

// With torch.profiler on, every op runs inside a dispatcher RecordFunction
// (scope FUNCTION: a begin that opens nothing, an end() on a `this` that is
// no user scope), record_function's own enter op included.  The user scopes
// are exactly those of the same job with the profiler off: the same names
// and counts per rank, none for a dispatcher RecordFunction, each closed by
// its own end(), each `my_phase` nesting its one collective and each
// collective of a `my_phase` under one -- and the collectives themselves
// are all still there.
TEST_P(FrameworkContext, ProfilerOnLeavesUserScopesAsWithItOff) {
    REQUIRE_VARIANT();
    const JobRun* off = job_or_fail();
    const JobRun* on = job_or_fail(true);
    if (!off || !on) return;
    ASSERT_EQ(on->plan.value("profiler", false), true) << on->plan.dump();
    auto ps_on = processes_of(on->dump), ps_off = processes_of(off->dump);
    for_each_rank_process(ps_on, on->ranks, [&](const nlohmann::json& rank, const nlohmann::json& p) {
        EXPECT_GT(rank.value("profiler_ops", 0), 0) << "the profiler recorded no op: its RecordFunctions never ran";
        EXPECT_EQ(p["process"]["exit_code"].get<int>(), 0);
        const nlohmann::json* off_rank = nullptr;
        for (const auto& r : off->ranks)
            if (r["rank"] == rank["rank"]) off_rank = &r;
        ASSERT_NE(off_rank, nullptr);
        const nlohmann::json* p_off = process_by_pid(ps_off, (*off_rank)["pid"].get<int>());
        ASSERT_NE(p_off, nullptr);
        const bool torch113 = !GetParam().trixie;
        // torch 1.13: the ops' RecordFunctions reached the probes, an end()
        // each, on top of the scopes' and c10d's own (about 150 without the
        // profiler).  torch 2.6's Python exits a scope through
        // record_function_exit_new: no RecordFunction is probed at all.
        if (torch113)
            EXPECT_GT(record_function_ends(p), record_function_ends(*p_off) + rank["profiler_ops"].get<int>() / 2)
                << "on " << record_function_ends(p) << ", off " << record_function_ends(*p_off);
        else
            EXPECT_EQ(record_function_ends(p) + record_function_ends(*p_off), 0);
        auto all = placed_records(p);
        const auto scopes = traced_scopes(all, rank, torch113);
        ASSERT_EQ(int_map(rank["scopes"]).at("my_phase"), kSteps);
        EXPECT_EQ(scopes, int_map(rank["scopes"])) << "scope records by name, profiler on";
        EXPECT_EQ(scopes, traced_scopes(placed_records(*p_off), *off_rank, torch113))
            << "scope records by name, profiler on (left) and off (right)";
        EXPECT_EQ(collectives_in_scopes(all), int_map(rank["scope_collectives"]))
            << "collectives whose innermost context is the scope";
        std::map<const nlohmann::json*, int> per_my_phase;  // my_phase record -> its collectives
        for (const auto& s : all)
            if (is_type(s.rec, "scope") && s.rec->value("name", "") == "my_phase") per_my_phase[s.rec] = 0;
        auto colls = outermost_collectives(all);
        for (const auto& c : colls) {
            const nlohmann::json* ctx = innermost_context(c);
            if (ctx && per_my_phase.count(ctx)) per_my_phase[ctx]++;
            if (issuing_function(*c.rec) == "step.<locals>.<lambda>") {
                EXPECT_TRUE(ctx && per_my_phase.count(ctx)) << "my_phase's collective outside it: " << c.rec->dump();
            }
        }
        for (const auto& [rec, n] : per_my_phase) EXPECT_EQ(n, 1) << "my_phase " << rec->dump().substr(0, 400);
        for (const auto& s : all) {
            if (!is_type(s.rec, "scope")) continue;
            const std::string name = s.rec->value("name", "");
            EXPECT_EQ(name.find("::"), std::string::npos) << "a dispatcher RecordFunction as a scope: " << name;
            EXPECT_TRUE(s.rec->contains("end_ns")) << "scope without its end: " << s.rec->dump().substr(0, 400);
            EXPECT_FALSE(s.rec->value("end_inferred", false)) << "scope left open: " << s.rec->dump().substr(0, 400);
        }
        EXPECT_EQ(static_cast<int>(colls.size()), rank["calls"]["all_reduce"].get<int>());
        EXPECT_EQ(normalized(p["module_comm_counts"]), normalized(rank["module_comm_counts"]));
    });
}

// The table at noise level 2 shows the context rows.
TEST_P(FrameworkContext, TableShowsModuleAndScopeRows) {
    REQUIRE_VARIANT();
    const JobRun* j = job_or_fail();
    if (!j) return;
    for (const std::string row : {"module encoder.blocks.1.mixer (Mixer) forward",
                                  "module encoder.blocks.1.mixer (Mixer) backward", "scope my_phase",
                                  "scope Optimizer.step#SGD.step"})
        EXPECT_NE(j->r.out.find(row), std::string::npos) << "no '" << row << "' row\n" << j->r.out.substr(0, 6000);
}

INSTANTIATE_TEST_SUITE_P(Torch, FrameworkContext,
                         ::testing::Values(Variant{"torch1_13_host", false}, Variant{"torch2_6_trixie", true}),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

}  // namespace
}  // namespace commdbg::e2e
