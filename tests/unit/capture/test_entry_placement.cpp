// SPDX-License-Identifier: Apache-2.0
// Where ProbeAttacher::plan puts an entry probe: past a leading endbr64 when
// the kernel emulates the instruction after it (one trap instead of an int3
// and a single step), else at the entry.  torch 2.6 (trixie root) is built
// with endbr64 at every function; torch 1.13 (host) is not.  The bytes are
// read back from the files here, independently of arch::single_trap_entry.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "builtin_spec.hpp"
#include "elf_symbols.hpp"
#include "probe_attach.hpp"
#include "probe_spec.hpp"
#include "symbol_table.hpp"
#include "x86_decode.hpp"

namespace fs = std::filesystem;

namespace commdbg::capture {
namespace {

const std::vector<uint8_t> kEndbr64 = {0xf3, 0x0f, 0x1e, 0xfa};

bool is_push(const std::vector<uint8_t>& c, size_t at) {
    return at < c.size() && ((c[at] >= 0x50 && c[at] <= 0x57) ||
                             (c[at] == 0x41 && at + 1 < c.size() && c[at + 1] >= 0x50 && c[at + 1] <= 0x57));
}

std::string libtorch_cpu_in(const std::string& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("libtorch_cpu.so.", 0) == 0 && !e.is_symlink()) return e.path().string();
    }
    return {};
}

using test::builtin;

TEST(EntryPlacement, PastEndbr64OnTorch26AtTheEntryOnTorch113) {
    const char* root = std::getenv("COMMDBG_TRIXIE_ROOT");
    const std::vector<std::pair<std::string, bool>> builds = {
        {"/usr/lib/x86_64-linux-gnu", false},
        {std::string(root ? root : "/var/cache/commdbg/trixie-root") + "/usr/lib/x86_64-linux-gnu", true}};
    size_t seen = 0;
    for (const auto& [dir, cet] : builds) {
        const std::string lib = libtorch_cpu_in(dir);
        if (lib.empty()) continue;
        ++seen;
        auto elf = host::ElfSymbols::open(lib);
        ASSERT_TRUE(elf) << elf.error();
        std::map<uint64_t, const host::ElfSymbol*> entries;
        for (const auto& s : elf->functions()) entries[s.file_offset] = &s;
        SymbolTable syms;
        auto plan = ProbeAttacher::plan(builtin("torch-autograd"), lib, syms);
        ASSERT_TRUE(plan) << plan.error();
        ASSERT_EQ(plan->offsets.size(), 3u) << lib << ": set_gradient_edge, rebase_history, evaluate_function";
        for (size_t i = 0; i < plan->offsets.size(); ++i) {
            const std::string name = syms.from_cookie(plan->cookies[i])->name;
            const uint64_t at = plan->offsets[i];
            const auto entry = entries.find(cet ? at - 4 : at);
            ASSERT_NE(entry, entries.end()) << lib << ": " << name << " is not " << (cet ? "4 past" : "at")
                                            << " a function's entry";
            auto code = host::read_function_code(lib, *entry->second, 16);
            ASSERT_TRUE(code) << code.error();
            const std::vector<uint8_t> head(code->begin(), code->begin() + 4);
            if (cet) {
                EXPECT_EQ(head, kEndbr64) << lib << ": " << name;
            }
            EXPECT_TRUE(is_push(*code, cet ? 4 : 0)) << lib << ": " << name << " probed on a push";
        }
    }
    if (seen == 0) GTEST_SKIP() << "no libtorch_cpu here (apt install python3-torch, or make trixie-root)";
}

TEST(SingleTrapEntry, PastEndbr64OnlyBeforeAnInstructionTheKernelEmulates) {
    using Code = std::vector<uint8_t>;
    auto after_endbr = [](Code next) {
        Code c = kEndbr64;
        c.insert(c.end(), next.begin(), next.end());
        return arch::single_trap_entry(c);
    };
    EXPECT_EQ(after_endbr({0x55}), 4u) << "push %rbp";
    EXPECT_EQ(after_endbr({0x41, 0x57}), 4u) << "push %r15";
    EXPECT_EQ(after_endbr({0xe8, 0, 0, 0, 0}), 4u) << "call rel32";
    EXPECT_EQ(after_endbr({0xe9, 0, 0, 0, 0}), 4u) << "jmp rel32";
    EXPECT_EQ(after_endbr({0x0f, 0x85, 0, 0, 0, 0}), 4u) << "jne rel32";
    EXPECT_EQ(after_endbr({0x74, 0x02}), 4u) << "je rel8";
    EXPECT_EQ(after_endbr({0x90}), 4u) << "nop";
    EXPECT_EQ(after_endbr({0x48, 0x89, 0xf8}), 0u) << "mov %rdi,%rax: single-stepped anyway";
    EXPECT_EQ(after_endbr({0x48, 0x83, 0xec, 0x08}), 0u) << "sub $8,%rsp";
    EXPECT_EQ(after_endbr({0x41, 0x8b, 0x00}), 0u) << "a REX.B mov, not a push";
    EXPECT_EQ(after_endbr({0x0f, 0x1f, 0x00}), 0u) << "nopl: not emulated by every kernel";
    EXPECT_EQ(after_endbr({0x41}), 0u) << "cut";
    EXPECT_EQ(after_endbr({}), 0u) << "nothing after it";
    EXPECT_EQ(arch::single_trap_entry(Code{0x55, 0x48, 0x89, 0xe5}), 0u) << "no endbr64: the entry";
    EXPECT_EQ(arch::single_trap_entry(Code{0xf3, 0x0f, 0x1e, 0xfb, 0x55}), 0u) << "endbr32";
}

}  // namespace
}  // namespace commdbg::capture
