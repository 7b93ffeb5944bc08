// SPDX-License-Identifier: Apache-2.0
// Every attach and every daemon start waits for the kernel to verify
// commdbg's BPF programs.  The verifier's work is counted, not timed: the
// instructions it processed per program (bpf_prog_info.verified_insns).  A
// loop or a helper inlined into a program with many paths is verified again
// on each path; that once made call_enter 219k instructions (0.5 s to load on
// this 2-core VM) and a 0.7 s target exited before the attach reached it.
#include <gtest/gtest.h>

#include "bpf_session.hpp"
#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// ~0.2 s of this VM's verifier (about 2 us per instruction), for all
// programs together; the kernel's own limit is 1M per program.
constexpr uint64_t kVerifiedInsnsBudget = 100000;

TEST(BpfLoad, VerifierWorkStaysWithinItsBudget) {
    REQUIRE_BPF();
    auto bpf = capture::BpfSession::open(capture::BpfOptions{});
    ASSERT_TRUE(bpf) << bpf.error();
    uint64_t total = 0;
    std::string per_program;
    bool saw_enter = false, saw_exit = false;
    for (const auto& [name, n] : (*bpf)->verified_insns()) {
        EXPECT_GT(n, 0u) << name << ": the kernel did not say how many instructions it verified";
        total += n;
        per_program += " " + name + "=" + std::to_string(n);
        saw_enter |= name == "call_enter";
        saw_exit |= name == "call_exit";
    }
    EXPECT_TRUE(saw_enter && saw_exit) << "call probes not among the loaded programs:" << per_program;
    EXPECT_LE(total, kVerifiedInsnsBudget)
        << "the verifier processed " << total << " instructions (" << per_program
        << "): look for a loop or a large helper inlined into many paths (make it a global function)";
}

}  // namespace
}  // namespace commdbg::e2e
