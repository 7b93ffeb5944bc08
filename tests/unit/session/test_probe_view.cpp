// SPDX-License-Identifier: Apache-2.0
// skip_hidden_ops on the real libtorch_cpu: below noise level 3 the trivial
// ops (what only level 3 shows) get no probe and every other op keeps its
// own; at 0 no op is probed; collectives are probed at every level.  Without
// records (--counts-only) only what the counters count is probed.
#include <gtest/gtest.h>

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
    for (const char* spec : {"torch-aten", "torch-scopes", "torch-modules", "torch-autograd"}) {
        EXPECT_FALSE(probed(spec, lib, 3).empty()) << spec << " has symbols in " << lib;
        EXPECT_TRUE(probed(spec, lib, 3, false).empty()) << spec << " counts nothing";
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

}  // namespace
