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
