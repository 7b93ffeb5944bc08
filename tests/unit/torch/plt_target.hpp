// SPDX-License-Identifier: Apache-2.0
// What the torch-code tests check of a jump or call found in a library:
// its target is a PLT stub whose GOT slot is relocated to `symbol`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "elf_symbols.hpp"
#include "x86_decode.hpp"

namespace commdbg::test {

inline void expect_plt_target(const std::string& lib, uint64_t target, const char* symbol) {
    auto elf = host::read_elf_data(lib, {symbol});
    ASSERT_TRUE(elf) << elf.error();
    auto stub = host::read_code_at(lib, *elf, target, 16);
    ASSERT_TRUE(stub) << stub.error();
    auto slot = arch::plt_slot(*stub, target);
    ASSERT_TRUE(slot) << lib << ": the target is no PLT stub";
    auto rel = host::read_relocations(lib, {*slot});
    ASSERT_TRUE(rel && rel->count(*slot)) << lib;
    EXPECT_EQ(rel->at(*slot).symbol, symbol);
}

}  // namespace commdbg::test
