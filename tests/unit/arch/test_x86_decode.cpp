// SPDX-License-Identifier: Apache-2.0
// emulated_first_call: where the module entry's probe goes.  On the real
// getTracingState of torch 1.13 (host) and 2.6 (trixie root), the offset of
// the call objdump shows after the set-up (1.13: sub, lea, call at +0xb;
// 2.6: endbr64, sub, lea, call at +0xf); any other first instruction gives
// nothing (the probe stays at the entry).
#include <gtest/gtest.h>

#include <filesystem>

#include "elf_symbols.hpp"
#include "x86_decode.hpp"

using namespace commdbg;

namespace {

constexpr const char* kGetTracingState = "_ZN5torch3jit6tracer15getTracingStateEv";

// getTracingState's code in the libtorch_cpu under `dir` (empty: none there).
std::vector<uint8_t> tracing_state_code(const std::string& dir) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("libtorch_cpu.so.", 0) != 0 || e.is_symlink()) continue;
        auto elf = host::ElfSymbols::open(e.path().string());
        const host::ElfSymbol* s = elf ? elf->find(kGetTracingState) : nullptr;
        auto code = s ? host::read_function_code(e.path().string(), *s, 32) : Result<std::vector<uint8_t>>::fail("");
        if (code) return *code;
    }
    return {};
}

}  // namespace

TEST(EmulatedFirstCall, TheCallAfterTheSetUpOfTorchsGetTracingState) {
    const std::vector<std::pair<std::string, size_t>> builds = {
        {"/usr/lib/x86_64-linux-gnu", 0xb},
        {std::string(std::getenv("COMMDBG_TRIXIE_ROOT") ? std::getenv("COMMDBG_TRIXIE_ROOT")
                                                        : "/var/cache/commdbg/trixie-root") +
             "/usr/lib/x86_64-linux-gnu",
         0xf}};
    size_t seen = 0;
    for (const auto& [dir, want] : builds) {
        auto code = tracing_state_code(dir);
        if (code.empty()) continue;
        ++seen;
        EXPECT_EQ(arch::emulated_first_call(code), want) << dir;
        EXPECT_EQ(code[want], 0xe8) << dir;
    }
    if (seen == 0) GTEST_SKIP() << "no libtorch_cpu here (apt install python3-torch)";
}

TEST(EmulatedFirstCall, OnlyTheSetUpFormsMayPrecedeTheCall) {
    using Code = std::vector<uint8_t>;
    EXPECT_EQ(arch::emulated_first_call(Code{0xe8, 0, 0, 0, 0}), 0u);
    EXPECT_EQ(arch::emulated_first_call(Code{0xf3, 0x0f, 0x1e, 0xfa, 0xe8, 1, 2, 3, 4}), 4u);
    EXPECT_EQ(arch::emulated_first_call(Code{0x55, 0xe8, 0, 0, 0, 0}), std::nullopt) << "push %rbp";
    EXPECT_EQ(arch::emulated_first_call(Code{0x48, 0x83, 0xec, 0x08, 0x48, 0x8b, 0x07, 0xe8, 0, 0, 0, 0}),
              std::nullopt)
        << "a load between: not set-up";
    EXPECT_EQ(arch::emulated_first_call(Code{0x48, 0x83, 0xec, 0x08}), std::nullopt) << "no call";
    EXPECT_EQ(arch::emulated_first_call(Code{0xe8, 0, 0}), std::nullopt) << "a cut call";
}

// entry_values_at_first_call: what the arguments of a function's first call
// were loaded from.  The shapes of torch's ProcessGroupGloo::broadcast entry
// (the real files: ReduceOpLayout.*RootRank*): 2.6 spills through a copy
// of %rcx made after an %fs load into the same register, 1.13 loads
// straight from %rcx; prologue noise (push, SSE spills, stack stores, lea)
// changes nothing followed.
TEST(EntryValuesAtFirstCall, CopiesAndLoadsFromEntryValuesAreFollowed) {
    using Code = std::vector<uint8_t>;
    using arch::EntryValue;
    const Code torch26 = {
        0xf3, 0x0f, 0x1e, 0xfa,                          // endbr64
        0x55,                                            // push %rbp
        0x66, 0x0f, 0xef, 0xc0,                          // pxor %xmm0,%xmm0
        0x48, 0x89, 0xe5,                                // mov %rsp,%rbp
        0x48, 0x8d, 0x5d, 0xa0,                          // lea -0x60(%rbp),%rbx
        0x48, 0x81, 0xec, 0xe8, 0x00, 0x00, 0x00,        // sub $0xe8,%rsp
        0x48, 0x89, 0x95, 0x18, 0xff, 0xff, 0xff,        // mov %rdx,-0xe8(%rbp)
        0x48, 0x63, 0x56, 0x14,                          // movslq 0x14(%rsi),%rdx
        0x64, 0x4c, 0x8b, 0x2c, 0x25, 0x28, 0, 0, 0,     // mov %fs:0x28,%r13
        0x4c, 0x89, 0x6d, 0xc8,                          // mov %r13,-0x38(%rbp)
        0x49, 0x89, 0xcd,                                // mov %rcx,%r13
        0x0f, 0x29, 0x45, 0xa0,                          // movaps %xmm0,-0x60(%rbp)
        0x49, 0x8b, 0x75, 0x00,                          // mov 0x0(%r13),%rsi
        0xe8, 0x00, 0x00, 0x00, 0x00};                   // call
    auto regs = arch::entry_values_at_first_call(torch26);
    ASSERT_TRUE(regs);
    EXPECT_EQ((*regs)[arch::kRsi], (EntryValue{arch::kRcx, true, 0}));
    EXPECT_EQ((*regs)[arch::kRdx], (EntryValue{arch::kRsi, true, 0x14}));
    EXPECT_EQ((*regs)[13], (EntryValue{arch::kRcx, false, 0})) << "the copy of %rcx";
    EXPECT_EQ((*regs)[3].from, -1) << "lea: not followed";

    const Code torch113 = {0x41, 0x57,                    // push %r15
                           0x49, 0x89, 0xcc,              // mov %rcx,%r12
                           0x8b, 0x56, 0x1c,              // mov 0x1c(%rsi),%edx
                           0x48, 0x89, 0x74, 0x24, 0x10,  // mov %rsi,0x10(%rsp)
                           0x8b, 0x31,                    // mov (%rcx),%esi
                           0xe8, 0x00, 0x00, 0x00, 0x00};
    regs = arch::entry_values_at_first_call(torch113);
    ASSERT_TRUE(regs);
    EXPECT_EQ((*regs)[arch::kRsi], (EntryValue{arch::kRcx, true, 0}));
    EXPECT_EQ((*regs)[arch::kRdx], (EntryValue{arch::kRsi, true, 0x1c}));
}

TEST(EntryValuesAtFirstCall, WhatCannotBeFollowedIsUnknownOrNothing) {
    using Code = std::vector<uint8_t>;
    // A load through a loaded value is not an entry value's field.
    auto regs = arch::entry_values_at_first_call(Code{0x48, 0x8b, 0x01,        // mov (%rcx),%rax
                                                      0x48, 0x8b, 0x70, 0x08,  // mov 0x8(%rax),%rsi
                                                      0xe8, 0, 0, 0, 0});
    ASSERT_TRUE(regs);
    EXPECT_EQ((*regs)[arch::kRsi].from, -1);
    EXPECT_EQ((*regs)[0], (arch::EntryValue{arch::kRcx, true, 0}));
    // An indexed load, an add into the register, a pop: unknown.
    regs = arch::entry_values_at_first_call(Code{0x8b, 0x34, 0x91,  // mov (%rcx,%rdx,4),%esi
                                                 0x48, 0x03, 0x11,  // add (%rcx),%rdx
                                                 0x5f,              // pop %rdi
                                                 0xe8, 0, 0, 0, 0});
    ASSERT_TRUE(regs);
    EXPECT_EQ((*regs)[arch::kRsi].from, -1);
    EXPECT_EQ((*regs)[arch::kRdx].from, -1);
    EXPECT_EQ((*regs)[arch::kRdi].from, -1);
    // A branch, a return or an instruction outside the set before the call: nothing.
    EXPECT_FALSE(arch::entry_values_at_first_call(Code{0x74, 0x02, 0xe8, 0, 0, 0, 0}));
    EXPECT_FALSE(arch::entry_values_at_first_call(Code{0xc3}));
    EXPECT_FALSE(arch::entry_values_at_first_call(Code{0x0f, 0x05, 0xe8, 0, 0, 0, 0})) << "syscall";
    EXPECT_FALSE(arch::entry_values_at_first_call(Code{0x8b, 0x31})) << "no call";
    EXPECT_FALSE(arch::entry_values_at_first_call(Code{0x8b})) << "cut";
}
