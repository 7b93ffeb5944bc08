// SPDX-License-Identifier: Apache-2.0
// A test's own copy of a library, with one function's code changed: how the
// tests make a file whose code has another shape than the derivations of
// userspace/torch/ expect.
#pragma once

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "elf_symbols.hpp"

namespace commdbg::test {

// Replaces the code of `symbol` (its first 1 KiB at most) in the ELF file at
// `path` with what `patch` makes of it; false when the symbol is not there or
// the file cannot be read or written.
inline bool patch_function_code(const std::string& path, const char* symbol,
                                const std::function<void(std::vector<uint8_t>&)>& patch) {
    auto elf = host::ElfSymbols::open(path);
    const host::ElfSymbol* s = elf ? elf->find(symbol) : nullptr;
    if (!s) return false;
    auto code = host::read_function_code(path, *s, 1024);
    if (!code) return false;
    patch(code.value());
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(s->file_offset));
    f.write(reinterpret_cast<const char*>(code->data()), static_cast<std::streamsize>(code->size()));
    return bool(f);
}

}  // namespace commdbg::test
