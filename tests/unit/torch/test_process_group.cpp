// SPDX-License-Identifier: Apache-2.0
// What the kernel is told of a libtorch_cpu file's c10d classes, derived
// from the file's own code: here the c10d::ReduceOp layout and where options
// keep rootRank (process_group.hpp) of torch 1.13 (the host's python3-torch)
// and 2.6 (the trixie root, where built).  The values are checked end to
// end, against what each job passed, by HangDaemon.Torch*GlooAllReduceWith
// AnotherReduceOpIsAMismatch and ...BroadcastFromAnotherRootIsAMismatch;
// here: that both builds give them, and that a file without ReduceOp says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "process_group.hpp"
#include "test_proc.hpp"

namespace commdbg::torch {
namespace {

namespace fs = std::filesystem;

std::string first_file(const fs::path& dir, const std::string& prefix) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().filename().string().rfind(prefix, 0) == 0 && e.is_regular_file()) return e.path();
    return {};
}

// libtorch_cpu's ReduceOp, and libtorch_python's own copy (the one options
// made by Python hold): both derived, from each file's own destructor, and
// agreeing on where op_ is.
void expect_reduce_op_derived(const std::string& cpu, const std::string& python) {
    auto g = derive_group_classes(cpu);
    ASSERT_TRUE(g) << g.error();
    ASSERT_TRUE(g->reduce_op) << g->why_no_reduce_op;
    EXPECT_NE(g->reduce_op->vtable, 0u);
    // rootRank: derived for both (broadcast's, gather's and scatter's agreeing);
    // in a ReduceOptions just past its ReduceOp.
    EXPECT_TRUE(g->roots.broadcast.has_value()) << g->roots.why_not;
    EXPECT_EQ(g->roots.reduce, g->reduce_op->size) << g->roots.why_not;
    auto p = derive_reduce_op_facts(python);
    ASSERT_TRUE(p) << p.error();
    ASSERT_TRUE(p->reduce_op) << p->why_no_reduce_op;
    EXPECT_EQ(p->reduce_op->op_at, g->reduce_op->op_at);
}

TEST(ReduceOpLayout, Torch113LibtorchCpuAndPythonSayWhereOpIs) {
    const std::string dir = "/usr/lib/x86_64-linux-gnu";
    const std::string cpu = first_file(dir, "libtorch_cpu.so."), python = first_file(dir, "libtorch_python.so.");
    REQUIRE_OR_SKIP(!cpu.empty() && !python.empty(),
                    "no libtorch_cpu.so / libtorch_python.so in " + dir + " (apt install python3-torch)");
    expect_reduce_op_derived(cpu, python);
}

TEST(ReduceOpLayout, Torch26LibtorchCpuAndPythonSayWhereOpIs) {
    const char* root = std::getenv("COMMDBG_TRIXIE_ROOT");
    const fs::path dir = root ? fs::path(root) / "usr/lib/python3/dist-packages/torch/lib" : fs::path();
    const std::string cpu = root ? first_file(dir, "libtorch_cpu.so") : std::string();
    const std::string python = root ? first_file(dir, "libtorch_python.so") : std::string();
    REQUIRE_OR_SKIP(!cpu.empty() && !python.empty(),
                    "no torch 2.6 libtorch_cpu.so / libtorch_python.so (COMMDBG_TRIXIE_ROOT unset or not built: make "
                    "trixie-root)");
    expect_reduce_op_derived(cpu, python);
}

TEST(ReduceOpLayout, AFileWithoutReduceOpSaysSo) {
    auto g = derive_group_classes("/proc/self/exe");
    ASSERT_TRUE(g) << g.error();
    EXPECT_FALSE(g->reduce_op.has_value());
    EXPECT_NE(g->why_no_reduce_op.find("no vtable for c10d::ReduceOp"), std::string::npos) << g->why_no_reduce_op;
}

}  // namespace
}  // namespace commdbg::torch
