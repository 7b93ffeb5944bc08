// SPDX-License-Identifier: Apache-2.0
// skip_hidden_ops on the real libtorch_cpu: below noise level 3 the trivial
// ops (what only level 3 shows) get no probe and every other op keeps its
// own; at 0 no op is probed; collectives are probed at every level.  Without
// records (--counts-only) only what the counters count is probed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "probe_attach.hpp"
#include "render.hpp"
#include "trace_session.hpp"

using namespace commdbg;
using namespace commdbg::capture;

namespace {

std::string libtorch_cpu() {
    for (const char* p : {"/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0", "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so"})
        if (std::filesystem::exists(p)) return std::filesystem::canonical(p).string();
    return {};
}

// The names a spec's plan probes on `lib`, with the specs seen at `noise_level`.
std::set<std::string> probed(const std::string& spec, const std::string& lib, int noise_level, bool records = true) {
    std::vector<ProbeSpec> specs;
    for (const auto& s : builtin_specs())
        if (s.name == spec) specs.push_back(s);
    session::skip_hidden_ops(specs, noise_level, records);
    session::derive_unexported(specs);
    SymbolTable syms;
    auto plan = ProbeAttacher::plan(specs.at(0), lib, syms);
    EXPECT_TRUE(plan.ok()) << plan.error();
    std::set<std::string> names;
    if (plan.ok())
        for (auto c : plan->cookies) names.insert(syms.from_cookie(c)->name);
    return names;
}

TEST(ProbeView, BelowNoiseLevelThreeTrivialOpsGetNoProbeAndAtZeroNoOpDoes) {
    const std::string lib = libtorch_cpu();
    if (lib.empty()) GTEST_SKIP() << "libtorch_cpu.so not installed (python3-torch)";
    const std::set<std::string> all = probed("torch-aten", lib, 3);
    std::set<std::string> shown;
    size_t trivial = 0;
    for (const auto& n : all) {
        if (output::is_trivial_op(n)) ++trivial;
        else shown.insert(n);
    }
    ASSERT_GT(trivial, 20u) << "libtorch exports the trivial ops (view, detach, t, ...)";
    EXPECT_TRUE(all.count("aten::view")) << "level 3 shows them: probed";
    EXPECT_EQ(probed("torch-aten", lib, 1), shown);
    EXPECT_EQ(probed("torch-aten", lib, 2), shown);
    EXPECT_TRUE(probed("torch-aten", lib, 0).empty());
    const std::set<std::string> c10d = probed("torch-c10d", lib, 3);
    EXPECT_FALSE(c10d.empty());
    EXPECT_EQ(probed("torch-c10d", lib, 0), c10d);
}

// --counts-only: the c10d collectives keep their probes (they are what is
// counted), and so do the group and store constructors (what names a group
// for the flight recorder); every op, scope, module and autograd probe goes.
TEST(ProbeView, WithoutRecordsOnlyWhatTheCountersCountIsProbed) {
    const std::string lib = libtorch_cpu();
    if (lib.empty()) GTEST_SKIP() << "libtorch_cpu.so not installed (python3-torch)";
    // The module entry lies in libtorch_python (torch/module_entry.hpp).
    const std::string python = std::filesystem::path(lib).parent_path() / "libtorch_python.so.1.13";
    for (const char* spec : {"torch-aten", "torch-scopes", "torch-modules", "torch-autograd"}) {
        const std::string& in = std::string(spec) == "torch-modules" ? python : lib;
        EXPECT_FALSE(probed(spec, in, 3).empty()) << spec << " has symbols in " << in;
        EXPECT_TRUE(probed(spec, in, 3, false).empty()) << spec << " counts nothing";
    }
    std::set<std::string> collectives;
    SymbolTable syms;
    for (const auto& s : builtin_specs())
        if (s.name == "torch-c10d") {
            auto plan = ProbeAttacher::plan(s, lib, syms);
            ASSERT_TRUE(plan.ok()) << plan.error();
            for (auto c : plan->cookies)
                if (syms.from_cookie(c)->role == CD_ROLE_COLLECTIVE || syms.from_cookie(c)->role == CD_ROLE_COMM_INIT)
                    collectives.insert(syms.from_cookie(c)->name);
        }
    ASSERT_FALSE(collectives.empty());
    EXPECT_EQ(probed("torch-c10d", lib, 2, false), collectives);
    // What was left out is counted, for the note that says why nothing is probed.
    std::vector<ProbeSpec> aten;
    for (const auto& s : builtin_specs())
        if (s.name == "torch-aten") aten.push_back(s);
    auto every = ProbeAttacher::plan(aten.at(0), lib, syms);
    session::skip_hidden_ops(aten, 2, false);
    auto none = ProbeAttacher::plan(aten.at(0), lib, syms);
    ASSERT_TRUE(every.ok() && none.ok());
    EXPECT_EQ(every->skipped, 0u);
    EXPECT_TRUE(none->offsets.empty());
    EXPECT_EQ(none->skipped, every->offsets.size());
    EXPECT_NE(aten.at(0).skip_why.find("--counts-only"), std::string::npos) << aten.at(0).skip_why;
}

// torch-scopes on each build, as its own Python package uses it: torch
// 1.13's Python exits a scope through a tensor handle, so RecordFunction's
// constructor and end() are probed and no record_function exit is; torch
// 2.6's through the handle object, so the exit is probed (record_function_exit_new,
// which names no RecordFunction) and no RecordFunction at all.  Debian's
// layout: the library in /usr/lib/<triplet>, its Python in dist-packages.
TEST(ProbeView, ScopesAreProbedWhereTheBuildsOwnPythonPackageOpensAndClosesThem) {
    const char* env = std::getenv("COMMDBG_TRIXIE_ROOT");
    const std::string root = env ? env : "/var/cache/commdbg/trixie-root";
    const std::vector<std::pair<std::string, bool>> builds = {
        {"/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13", false},
        {root + "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.2.6", true}};
    size_t seen = 0;
    for (const auto& [lib, handle_object] : builds) {
        if (!std::filesystem::exists(lib)) continue;
        ++seen;
        std::vector<ProbeSpec> specs;
        for (const auto& s : builtin_specs())
            if (s.name == "torch-scopes") specs.push_back(s);
        session::derive_unexported(specs);
        SymbolTable syms;
        auto plan = ProbeAttacher::plan(specs.at(0), lib, syms);
        ASSERT_TRUE(plan.ok()) << plan.error();
        EXPECT_TRUE(plan->missing.empty()) << plan->missing.at(0);
        size_t labels = 0, begins = 0, ends_by_this = 0, exits = 0;
        for (auto c : plan->cookies) {
            const SymbolInfo& i = *syms.from_cookie(c);
            labels += i.role == CD_ROLE_SCOPE_LABEL;
            begins += i.role == CD_ROLE_SCOPE_BEGIN;
            ends_by_this += i.role == CD_ROLE_SCOPE_END && i.slots.count != CD_SLOT_NONE;
            exits += i.role == CD_ROLE_SCOPE_END && i.slots.count == CD_SLOT_NONE;
        }
        EXPECT_EQ(labels, 1u) << lib;
        EXPECT_EQ(begins, handle_object ? 0u : 1u) << lib;
        EXPECT_EQ(ends_by_this, handle_object ? 0u : 1u) << lib;
        EXPECT_EQ(exits, handle_object ? 1u : 0u) << lib;
    }
    if (std::getenv("CI")) {
        EXPECT_EQ(seen, builds.size()) << "CI has python3-torch and the trixie root";
    }
    if (seen == 0) GTEST_SKIP() << "no libtorch_cpu (apt install python3-torch; make trixie-root)";
}

}  // namespace
