// SPDX-License-Identifier: Apache-2.0
// torch's record_function exit, a static function no symbol names, found in
// each build's own code: one function near record_function_enter_new that
// tail-calls RecordFunction::end() on a member of its argument's object.
// That it is the exit a Python scope runs, the e2e tests show
// (OwnCost.Torch26ScopesTrapOnlyAtTheirOwnEnterAndExit: one call per scope).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "elf_symbols.hpp"
#include "plt_target.hpp"
#include "record_function.hpp"
#include "test_proc.hpp"
#include "x86_decode.hpp"

using namespace commdbg;

namespace {

const char* kEnd = "_ZN2at14RecordFunction3endEv";

// The probed site is the function's tail jump, read back with the code
// before it: `[endbr64] mov (%rdi),%rdi`, the member's offset added, then the
// jump, which reaches end() through the file's PLT (the stub's GOT slot is
// relocated to end()).  The jump is 7 bytes past the entry, 11 past endbr64.
void expect_exit_shape(const std::string& lib, const host::ElfSymbol& exit) {
    for (uint64_t before : {7u, 11u}) {
        const host::ElfSymbol entry{"entry", exit.vaddr - before, 16, exit.file_offset - before};
        auto code = host::read_function_code(lib, entry, 16);
        ASSERT_TRUE(code) << code.error();
        const size_t at = arch::skip_endbr64(*code);
        if (at + 7 != before) continue;
        EXPECT_TRUE(arch::bytes_at(*code, at, {0x48, 0x8b, 0x3f})) << lib;
        ASSERT_TRUE(arch::bytes_at(*code, at + 7, {0xe9, -1, -1, -1, -1})) << lib;
        test::expect_plt_target(lib, exit.vaddr + 5 + arch::rel32_at(*code, at + 8), kEnd);
        return;
    }
    ADD_FAILURE() << lib << ": the probed site is not a tail jump 7 bytes past [endbr64] mov (%rdi),%rdi";
}

}  // namespace

TEST(RecordFunctionExit, EachTorchBuildHasExactlyOne) {
    const char* env = std::getenv("COMMDBG_TRIXIE_ROOT");
    const std::string root = env ? env : "/var/cache/commdbg/trixie-root";
    size_t seen = 0;
    for (const std::string& lib : {std::string("/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13"),
                                  root + "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.2.6"}) {
        if (!std::filesystem::exists(lib)) continue;
        ++seen;
        std::string why;
        auto exit = torch::derive_record_function_exit(lib, why);
        ASSERT_TRUE(exit) << why;
        EXPECT_EQ(exit->name, torch::kRecordFunctionExit);
        expect_exit_shape(lib, *exit);
    }
    if (std::getenv("CI")) {
        EXPECT_EQ(seen, 2u) << "CI has python3-torch and the trixie root";
    }
    REQUIRE_OR_SKIP(seen > 0, "no libtorch_cpu (apt install python3-torch; make trixie-root)");
}

TEST(RecordFunctionExit, AFileWithoutTorchSaysWhy) {
    std::string why;
    EXPECT_FALSE(torch::derive_record_function_exit("/proc/self/exe", why));
    EXPECT_NE(why.find("no record_function_enter_new"), std::string::npos) << why;
    EXPECT_FALSE(torch::derive_record_function_exit("/nonexistent/libtorch_cpu.so", why));
    EXPECT_NE(why.find("/nonexistent/libtorch_cpu.so"), std::string::npos) << why;
}
