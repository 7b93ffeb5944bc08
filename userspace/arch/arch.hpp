// SPDX-License-Identifier: Apache-2.0
// Everything userspace assumes about x86-64, in one folder (bpf/arch_x86.h is
// the BPF half; x86_decode.hpp reads machine code): another architecture
// needs its own definitions of these.
#pragma once

#include <cstdint>
#include <string_view>

#include "events.h"

#if !defined(__x86_64__)
#error "commdbg supports x86-64 only: userspace/arch/arch.hpp and bpf/arch_x86.h hold what another arch must define"
#endif

namespace commdbg::arch {

// The dynamic loader of an executable without PT_INTERP (or one we cannot
// read): glibc's x86-64 path, where `_dl_debug_state` tells us of dlopen.
inline constexpr std::string_view kDefaultLoaderPath = "/lib64/ld-linux-x86-64.so.2";

// System V AMD64 passes six integer arguments in registers; a spec's slots
// past them are stack words (events.h), read by the BPF half at sp + 8 on.
static_assert(CD_REG_SLOTS == 6, "x86-64 passes six integer arguments in registers (events.h slots)");

// x86-64 user space ends at 2^47 (4-level paging, as Linux maps user
// processes unless they ask for more), and its first page is never mapped:
// a pointer read from a target outside that is garbage, not worth a read.
inline constexpr uint64_t kUserAddressEnd = 1ull << 47;
inline bool is_user_address(uint64_t addr) { return addr >= 4096 && addr < kUserAddressEnd; }

// NCCL's getHash() reads the unique id through `const char*`: char is signed
// on x86-64, so each byte is sign-extended before it is mixed in.
inline uint64_t nccl_hash_char(uint8_t byte) {
    return static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(byte)));
}

}  // namespace commdbg::arch
