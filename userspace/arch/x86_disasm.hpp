// SPDX-License-Identifier: Apache-2.0
// x86-64 code decoded by Capstone, for the searches that find a function no
// symbol names in the code of one that is named (torch/: a pybind11
// binding's dispatcher).  Only what those searches read is kept: where each
// instruction starts, its control flow, rip-relative addresses loaded into
// registers, register stores and the registers written.  A probe goes only
// at an address this decoder says an instruction starts at.
#pragma once

#include <cstdint>
#include <vector>

#include "result.hpp"

namespace commdbg::arch {

struct Insn {
    uint64_t addr = 0;  // link-time address
    uint8_t size = 0;
    // none: falls through; call, jump: rel32/rel8 to `target`; cond_jump:
    // to `target` or through; indirect: a call or jump through a register or
    // memory; ret; stop: ud2, hlt, int3 (no way on).
    enum class Flow { none, call, jump, cond_jump, indirect_call, indirect_jump, ret, stop } flow = Flow::none;
    uint64_t target = 0;
    // lea disp(%rip),%reg: the 64-bit register (ISA number) and the address.
    int lea_reg = -1;
    uint64_t lea_target = 0;
    // mov %reg64,disp(%base) without index or segment: source, base, disp.
    int store_src = -1, store_base = -1;
    int64_t store_disp = 0;
    uint32_t writes = 0;  // general-purpose registers written (bit n: ISA number n), any width
};

// A linear sweep of `code` (at link-time address `vaddr`): each instruction
// in order, up to the first bytes that are not one (the vector ends there).
// For a function's own range: GCC puts no data among x86-64 code.
std::vector<Insn> disassemble(const std::vector<uint8_t>& code, uint64_t vaddr);

// Every path from `entry` (inside `code`, at `vaddr`) to its first call,
// following both ways of each conditional jump: those calls (flow `call`,
// or `indirect_call`), each once.  An error when a path meets a return, an
// indirect jump, a stop, bytes that are no instruction, or the end of `code`
// before a call, or when more than `max_instructions` are followed in all.
Result<std::vector<Insn>> first_calls(const std::vector<uint8_t>& code, uint64_t vaddr, uint64_t entry,
                                      int max_instructions = 64);

// The registers a call may change under the SysV x86-64 ABI are all but
// these (rbx, rbp, r12-r15; rsp is restored).
inline bool callee_saved(int reg) { return reg == 3 || reg == 5 || (reg >= 12 && reg <= 15); }

}  // namespace commdbg::arch
