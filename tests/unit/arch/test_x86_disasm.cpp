// SPDX-License-Identifier: Apache-2.0
// The Capstone-backed decoder the code searches use (torch/module_entry):
// instruction starts, rip-relative leas, register stores and writes, and
// every path from an entry to its first call.
#include <gtest/gtest.h>

#include <set>

#include "x86_disasm.hpp"

using namespace commdbg::arch;

namespace {

constexpr uint64_t kAt = 0x1000;

TEST(X86Disasm, LeasStoresAndWritesAreWhatTheInstructionsSay) {
    const std::vector<uint8_t> code = {
        0x48, 0x8d, 0x0d, 0x10, 0x00, 0x00, 0x00,  // lea 0x10(%rip),%rcx
        0x48, 0x89, 0x48, 0x30,                    // mov %rcx,0x30(%rax)
        0x4c, 0x89, 0x20,                          // mov %r12,(%rax)
        0x31, 0xdb,                                // xor %ebx,%ebx
        0x48, 0x89, 0x0c, 0x18,                    // mov %rcx,(%rax,%rbx,1): indexed, no store kept
        0x89, 0x08,                                // mov %ecx,(%rax): 32-bit, no store kept
    };
    const auto in = disassemble(code, kAt);
    ASSERT_EQ(in.size(), 6u);
    EXPECT_EQ(in[0].lea_reg, 1);
    EXPECT_EQ(in[0].lea_target, kAt + 7 + 0x10);
    EXPECT_EQ(in[0].writes, 1u << 1);
    EXPECT_EQ(in[1].addr, kAt + 7);
    EXPECT_EQ(in[1].store_src, 1);
    EXPECT_EQ(in[1].store_base, 0);
    EXPECT_EQ(in[1].store_disp, 0x30);
    EXPECT_EQ(in[1].writes, 0u);
    EXPECT_EQ(in[2].store_src, 12);
    EXPECT_EQ(in[2].store_disp, 0);
    EXPECT_EQ(in[3].writes & (1u << 3), 1u << 3) << "xor %ebx,%ebx writes rbx";
    EXPECT_EQ(in[4].store_src, -1);
    EXPECT_EQ(in[5].store_src, -1);
}

TEST(X86Disasm, BytesThatAreNoInstructionEndTheSweep) {
    const std::vector<uint8_t> code = {0x90, 0x06, 0x90};  // nop; push %es (not in 64-bit mode); nop
    EXPECT_EQ(disassemble(code, kAt).size(), 1u);
}

TEST(X86Disasm, EveryPathIsFollowedToItsFirstCall) {
    const std::vector<uint8_t> code = {
        0x48, 0x85, 0xff,              // 0: test %rdi,%rdi
        0x74, 0x06,                    // 3: je 0xb
        0xe8, 0x00, 0x00, 0x00, 0x00,  // 5: call 0xa
        0xc3,                          // a: ret (after a call: not followed)
        0xe8, 0x10, 0x00, 0x00, 0x00,  // b: call 0x20
        0xc3,
    };
    auto calls = first_calls(code, kAt, kAt);
    ASSERT_TRUE(calls) << calls.error();
    ASSERT_EQ(calls->size(), 2u);
    std::set<std::pair<uint64_t, uint64_t>> got;
    for (const Insn& c : *calls) got.insert({c.addr - kAt, c.target - kAt});
    EXPECT_EQ(got, (std::set<std::pair<uint64_t, uint64_t>>{{0x5, 0xa}, {0xb, 0x20}}));
}

TEST(X86Disasm, APathThatReturnsOrJumpsAwayFirstIsRefused) {
    const std::vector<uint8_t> returns = {
        0x48, 0x85, 0xff,              // test %rdi,%rdi
        0x74, 0x01,                    // je 6
        0xc3,                          // ret: this path makes no call
        0xe8, 0x00, 0x00, 0x00, 0x00,  // call
    };
    auto r = first_calls(returns, kAt, kAt);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().find("returns or jumps away"), std::string::npos) << r.error();
    EXPECT_FALSE(first_calls({0xff, 0xe0}, kAt, kAt)) << "jmp *%rax";
    EXPECT_FALSE(first_calls({0x90, 0x90}, kAt, kAt)) << "runs off the code read";
    EXPECT_FALSE(first_calls({0x06}, kAt, kAt)) << "no instruction";
    std::vector<uint8_t> slide(70, 0x90);
    for (uint8_t b : {0xe8, 0x00, 0x00, 0x00, 0x00}) slide.push_back(b);
    auto far = first_calls(slide, kAt, kAt);
    ASSERT_FALSE(far);
    EXPECT_NE(far.error().find("more than 64"), std::string::npos) << far.error();
    auto ok = first_calls(slide, kAt, kAt, 80);
    ASSERT_TRUE(ok) << ok.error();
    EXPECT_EQ(ok->size(), 1u);
}

TEST(X86Disasm, ALoopWithoutACallEndsTheSearchWithNone) {
    auto r = first_calls({0xeb, 0xfe}, kAt, kAt);  // jmp . (no call on the only path)
    ASSERT_TRUE(r) << r.error();
    EXPECT_TRUE(r->empty());
}

}  // namespace
