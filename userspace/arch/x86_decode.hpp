// SPDX-License-Identifier: Apache-2.0
// Bounded decoders of x86-64 machine code, for the few functions whose code
// says where a runtime keeps something (python/: CPython's thread-state key,
// glibc's key slots).  They follow the forms those functions compile to and
// refuse anything else: a guess would read the wrong memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "result.hpp"

namespace commdbg::arch {

// What a register holds, as far as the decoder follows it.
struct RegVal {
    enum Kind { unknown, got_value, pointer, int_at } kind = unknown;
    bool via_got = false;  // relative to the value of the GOT slot `slot`
    uint64_t slot = 0;     // GOT slot (via_got)
    uint64_t addr = 0;     // link-time address, or offset from *slot (via_got)
    bool absolute = false; // an immediate (mov $imm32,%r32): an address only in a non-PIE executable
};

// Where decoding a function's entry stopped.
struct FirstCall {
    enum class Stop { call, unknown_instruction, no_call };
    Stop stop = Stop::no_call;
    RegVal rdi;        // the first argument at the call (stop == call)
    size_t at = 0;     // unknown_instruction: the offset of the instruction not decoded
    uint8_t byte = 0;  // and the byte there
};

// Follows at most 16 instructions from a function's entry (at link-time
// address `vaddr`) to its first call or tail call: moves and leas into
// registers (rip-relative addresses, GOT loads), stepping over compares,
// tests, pushes, pops and conditional branches (the fall-through path).
FirstCall decode_to_first_call(const std::vector<uint8_t>& code, uint64_t vaddr);

// Where in a function's straight-line entry the first `call rel32` is, when
// only these come before it: endbr64, `sub $imm8,%rsp`, `lea disp32(%rip),%reg`.
// A uprobe there is emulated by the kernel (a call is), where one on the
// entry's `sub` is single-stepped out of line: a second trap.  Every call of
// the function runs it.  nullopt for any other form.
std::optional<size_t> emulated_first_call(const std::vector<uint8_t>& code);

// Where an entry probe traps once: 4, past a leading endbr64, when the
// instruction after it is one Linux's x86 uprobes emulate (push of a 64-bit
// register, call rel32, jmp, jcc, nop: branch_setup_xol_ops and
// push_setup_xol_ops, Linux >= 4.17); 0 otherwise.  An instruction the
// kernel does not emulate, endbr64 among them, is single-stepped out of line:
// a second exception, ~4x the trap's cost on a VM here (22 us against 5.5 us).
// endbr64 changes no register, flag or memory, so every register and the
// stack there (the return address at %rsp) are the entry's.
size_t single_trap_entry(const std::vector<uint8_t>& code);

// Byte-level helpers for the decoders here and the torch layer's
// pattern-matched functions: the length of a leading endbr64 (CET builds
// open functions with it; 0 without), whether `c` holds `pat` at `at` (-1
// in `pat`: any byte), and the little-endian 32-bit value at `at` (the
// caller has checked 4 bytes are there).
size_t skip_endbr64(const std::vector<uint8_t>& c);
bool bytes_at(const std::vector<uint8_t>& c, size_t at, std::initializer_list<int> pat);
int32_t rel32_at(const std::vector<uint8_t>& c, size_t at);
// The GOT slot a PLT stub whose code `c` is, at link-time address `stub`,
// jumps through (`[endbr64] [bnd] jmp *rel(%rip)`); nullopt for another stub.
std::optional<uint64_t> plt_slot(const std::vector<uint8_t>& c, uint64_t stub);

// What a general-purpose register holds at a function's first call, as a
// function of the registers it was entered with: `from`'s entry value
// itself (loaded false), or what was loaded from memory at `from`'s entry
// value + disp (loaded true, a plain `mov`/`movslq` load); from -1: unknown.
struct EntryValue {
    int from = -1;
    bool loaded = false;
    int64_t disp = 0;
    bool operator==(const EntryValue&) const = default;
};
// Register numbers as the ISA encodes them.
inline constexpr int kRcx = 1, kRdx = 2, kRsi = 6, kRdi = 7, kR8 = 8;

// Follows a function's straight-line entry, at most `max_instructions`, to
// its first `call rel32`: register copies and loads from entry values are
// followed; every other write to a register makes it unknown; stores,
// compares, pushes and the SSE moves a prologue spills with change no
// register followed.  The registers at that call; nullopt when a branch,
// a return or any instruction outside that set comes first (a guess could
// read the wrong memory).
std::optional<std::array<EntryValue, 16>> entry_values_at_first_call(const std::vector<uint8_t>& code,
                                                                     int max_instructions = 64);

// glibc's pthread_getspecific fast path (2.34+): key k < keys has its data
// at fsbase + base + stride * k + data, in the thread descriptor.
struct TlsSlots {
    uint32_t base = 0, stride = 0, data = 0, keys = 0;
};
// The slot arithmetic of pthread_getspecific's code; an error when it is
// another shape (another libc, another compiler).
Result<TlsSlots> getspecific_slots(const std::vector<uint8_t>& code);

}  // namespace commdbg::arch
