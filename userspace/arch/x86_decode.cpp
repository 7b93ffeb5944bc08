// SPDX-License-Identifier: Apache-2.0
#include "x86_decode.hpp"

#include <array>
#include <cstring>
#include <string>

#include "text.hpp"

namespace commdbg::arch {
namespace {

struct ModRm {
    int mod, reg, rm;
    size_t len;      // modrm + displacement bytes
    int64_t disp;
    bool rip;        // [rip + disp32]
};

bool parse_modrm(const std::vector<uint8_t>& c, size_t at, int rex, ModRm& m) {
    if (at >= c.size()) return false;
    uint8_t b = c[at];
    m.mod = b >> 6;
    m.reg = ((b >> 3) & 7) | ((rex & 4) ? 8 : 0);
    m.rm = (b & 7) | ((rex & 1) ? 8 : 0);
    m.rip = m.mod == 0 && (b & 7) == 5;
    if (m.mod != 3 && (b & 7) == 4) return false;  // SIB: not a form these functions use
    size_t dl = m.rip || m.mod == 2 ? 4 : m.mod == 1 ? 1 : 0;
    if (at + 1 + dl > c.size()) return false;
    m.disp = 0;
    if (dl == 1) m.disp = static_cast<int8_t>(c[at + 1]);
    if (dl == 4) {
        int32_t d;
        std::memcpy(&d, &c[at + 1], 4);
        m.disp = d;
    }
    m.len = 1 + dl;
    return true;
}

// The address an operand names, from the register file; false when unknown.
bool memory_operand(const ModRm& m, uint64_t next_ip, const std::array<RegVal, 16>& regs, RegVal& where) {
    if (m.rip) {
        where = RegVal{RegVal::pointer, false, 0, next_ip + static_cast<uint64_t>(m.disp)};
        return true;
    }
    const RegVal& base = regs[m.rm];
    if (m.mod == 3 || base.kind != RegVal::got_value) return false;
    where = RegVal{RegVal::pointer, true, base.slot, static_cast<uint64_t>(m.disp)};
    return true;
}

// One instruction that moves a value: mov/lea forms.  Returns its length, 0 if not one.
size_t step_move(const std::vector<uint8_t>& c, size_t i, int rex, uint64_t vaddr, std::array<RegVal, 16>& regs) {
    uint8_t op = c[i];
    ModRm m{};
    if ((op != 0x8b && op != 0x8d && op != 0x89) || !parse_modrm(c, i + 1, rex, m)) return 0;
    size_t len = 1 + m.len;
    uint64_t next_ip = vaddr + i + len;
    bool wide = (rex & 8) != 0;
    if (op == 0x89) {  // mov reg -> r/m: register copies only
        if (m.mod != 3 || !wide) return 0;
        regs[m.rm] = regs[m.reg];
        return len;
    }
    RegVal where;
    if (!memory_operand(m, next_ip, regs, where)) return 0;
    if (op == 0x8d) {  // lea: the register holds the address itself
        if (!wide) return 0;
        regs[m.reg] = where;
    } else if (wide && !where.via_got && m.rip) {  // mov r64, [rip+d]: a GOT slot's value
        regs[m.reg] = RegVal{RegVal::got_value, true, where.addr, 0};
    } else if (!wide) {  // mov r32, [...]: an int, the key itself
        regs[m.reg] = where;
        regs[m.reg].kind = RegVal::int_at;
    } else {
        return 0;
    }
    return len;
}

// mov $imm32,%r32 (b8+r): in a non-PIE executable, how a function takes a
// static's address (Ubuntu's python3.12: mov $_PyRuntime+N,%edi).  Whether
// it is one is the caller's to check, with the ELF's load address.
size_t step_immediate(const std::vector<uint8_t>& c, size_t i, int rex, std::array<RegVal, 16>& regs) {
    if (c[i] < 0xb8 || c[i] > 0xbf || (rex & 8) || i + 5 > c.size()) return 0;
    uint32_t imm;
    std::memcpy(&imm, &c[i + 1], 4);
    regs[(c[i] - 0xb8) | ((rex & 1) ? 8 : 0)] = RegVal{RegVal::pointer, false, 0, imm, true};
    return 5;
}

// Instructions with no effect on the registers followed: compares, tests,
// pushes, conditional branches (the fall-through path reads the key).
size_t step_neutral(const std::vector<uint8_t>& c, size_t i, int rex) {
    uint8_t op = c[i];
    ModRm m{};
    if (op == 0x83 && parse_modrm(c, i + 1, rex, m) && ((c[i + 1] >> 3) & 7) == 7) return 2 + m.len;  // cmp $imm8
    if (op == 0x85 && parse_modrm(c, i + 1, rex, m) && m.mod == 3) return 1 + m.len;                   // test r,r
    if ((op >= 0x50 && op <= 0x57) || (op >= 0x58 && op <= 0x5f)) return 1;                          // push/pop
    if (op >= 0x70 && op <= 0x7f && i + 1 < c.size()) return 2;                                       // jcc rel8
    if (op == 0x0f && i + 5 < c.size() && c[i + 1] >= 0x80 && c[i + 1] <= 0x8f) return 6;             // jcc rel32
    return 0;
}

// An instruction of a prologue, as entry_values_at_first_call reads it.
struct Insn {
    size_t len = 0;
    int rex = 0;
    bool op66 = false, seg = false;  // operand-size / fs-gs prefix
    bool two_byte = false;
    uint8_t op = 0;
    bool has_modrm = false;
    int mod = 0, reg = 0, rm = 0;  // rm: the base register of a memory operand (-1: none, rip or no base)
    bool indexed = false;           // a SIB index register
    int64_t disp = 0;
};

// 1-byte opcodes with a ModRM byte that a prologue uses, and their immediate's size.
int one_byte_modrm_imm(uint8_t op) {
    switch (op) {
    case 0x01: case 0x03: case 0x09: case 0x0b: case 0x21: case 0x23: case 0x29: case 0x2b: case 0x31: case 0x33:
    case 0x38: case 0x39: case 0x3a: case 0x3b: case 0x63: case 0x84: case 0x85: case 0x88: case 0x89: case 0x8a:
    case 0x8b: case 0x8d: case 0xd1: return 0;
    case 0x80: case 0x83: case 0xc0: case 0xc1: case 0xc6: return 1;
    case 0x81: case 0xc7: return 4;
    default: return -1;
    }
}

// 0f-prefixed opcodes with a ModRM byte and no immediate: endbr64 and nops,
// SSE moves and logic a prologue spills with, movzx / movsx.
bool two_byte_modrm(uint8_t op) {
    switch (op) {
    case 0x10: case 0x11: case 0x12: case 0x13: case 0x14: case 0x16: case 0x17: case 0x1e: case 0x1f: case 0x28:
    case 0x29: case 0x57: case 0x6c: case 0x6e: case 0x6f: case 0x7e: case 0x7f: case 0xb6: case 0xb7: case 0xbe:
    case 0xbf: case 0xd6: case 0xef: return true;
    default: return false;
    }
}

// The ModRM operand (and SIB) at `at`; false past the end.
bool read_operand(const std::vector<uint8_t>& c, size_t& at, Insn& in) {
    if (at >= c.size()) return false;
    const uint8_t b = c[at++];
    in.has_modrm = true, in.mod = b >> 6;
    in.reg = ((b >> 3) & 7) | ((in.rex & 4) ? 8 : 0);
    in.rm = (b & 7) | ((in.rex & 1) ? 8 : 0);
    size_t dl = in.mod == 1 ? 1 : in.mod == 2 ? 4 : 0;
    if (in.mod != 3 && (b & 7) == 4) {  // SIB
        if (at >= c.size()) return false;
        const uint8_t sib = c[at++];
        const int index = ((sib >> 3) & 7) | ((in.rex & 2) ? 8 : 0);
        in.indexed = index != 4;
        in.rm = (sib & 7) | ((in.rex & 1) ? 8 : 0);
        if (in.mod == 0 && (sib & 7) == 5) in.rm = -1, dl = 4;
    } else if (in.mod == 0 && (b & 7) == 5) {
        in.rm = -1, dl = 4;  // rip-relative
    }
    if (at + dl > c.size()) return false;
    if (dl == 1) in.disp = static_cast<int8_t>(c[at]);
    if (dl == 4) {
        int32_t d;
        std::memcpy(&d, &c[at], 4);
        in.disp = d;
    }
    at += dl;
    return true;
}

// One instruction's length and operands; len 0: not one of the set.
Insn decode_insn(const std::vector<uint8_t>& c, size_t i) {
    Insn in;
    size_t at = i;
    for (; at < c.size(); ++at) {
        const uint8_t b = c[at];
        if (b == 0x66) in.op66 = true;
        else if (b == 0x64 || b == 0x65) in.seg = true;
        else if (b != 0xf2 && b != 0xf3) break;
    }
    if (at < c.size() && (c[at] & 0xf0) == 0x40) in.rex = c[at++] & 0x0f;
    if (at >= c.size()) return {};
    in.op = c[at++];
    int imm = 0;
    if (in.op == 0x0f) {
        if (at >= c.size() || !two_byte_modrm(c[at])) return {};
        in.two_byte = true, in.op = c[at++];
    } else if (in.op >= 0x50 && in.op <= 0x5f) {
        in.len = at - i;
        return in;
    } else if (in.op >= 0xb8 && in.op <= 0xbf) {
        imm = (in.rex & 8) ? 8 : 4;
    } else if (in.op == 0xe8) {
        imm = 4;
    } else if ((imm = one_byte_modrm_imm(in.op)) < 0) {
        return {};
    }
    const bool modrm = in.two_byte || one_byte_modrm_imm(in.op) >= 0;
    if (modrm && !read_operand(c, at, in)) return {};
    if (at + imm > c.size()) return {};
    in.len = at + imm - i;
    return in;
}

// The register an instruction writes, when it writes one (-1: none).
int written_register(const Insn& in) {
    if (in.op >= 0x58 && in.op <= 0x5f && !in.two_byte) return (in.op - 0x58) | ((in.rex & 1) ? 8 : 0);  // pop
    if (in.op >= 0xb8 && in.op <= 0xbf && !in.two_byte) return (in.op - 0xb8) | ((in.rex & 1) ? 8 : 0);
    if (in.two_byte) {
        if (in.op == 0xb6 || in.op == 0xb7 || in.op == 0xbe || in.op == 0xbf) return in.reg;  // movzx / movsx
        if (in.op == 0x7e && in.op66 && in.mod == 3) return in.rm;                              // movd/movq xmm -> r
        return -1;
    }
    switch (in.op) {
    case 0x03: case 0x0b: case 0x23: case 0x2b: case 0x33: case 0x63: case 0x8a: case 0x8b: case 0x8d: return in.reg;
    case 0x01: case 0x09: case 0x21: case 0x29: case 0x31: case 0x88: case 0x89: case 0xc6: case 0xc7: case 0xc0:
    case 0xc1: case 0xd1: return in.mod == 3 ? in.rm : -1;
    case 0x80: case 0x81: case 0x83: return in.mod == 3 && (in.reg & 7) != 7 ? in.rm : -1;  // /7: cmp
    default: return -1;
    }
}

}  // namespace

size_t skip_endbr64(const std::vector<uint8_t>& c) { return bytes_at(c, 0, {0xf3, 0x0f, 0x1e, 0xfa}) ? 4 : 0; }

std::optional<uint64_t> plt_slot(const std::vector<uint8_t>& c, uint64_t stub) {
    size_t i = skip_endbr64(c);
    if (i < c.size() && c[i] == 0xf2) ++i;
    if (i + 6 > c.size() || c[i] != 0xff || c[i + 1] != 0x25) return std::nullopt;
    return stub + i + 6 + rel32_at(c, i + 2);
}

bool bytes_at(const std::vector<uint8_t>& c, size_t at, std::initializer_list<int> pat) {
    if (at + pat.size() > c.size()) return false;
    for (int b : pat) {
        if (b >= 0 && c[at] != b) return false;
        ++at;
    }
    return true;
}

int32_t rel32_at(const std::vector<uint8_t>& c, size_t at) {
    return static_cast<int32_t>(c[at] | c[at + 1] << 8 | c[at + 2] << 16 | uint32_t(c[at + 3]) << 24);
}

std::optional<std::array<EntryValue, 16>> entry_values_at_first_call(const std::vector<uint8_t>& c,
                                                                     int max_instructions) {
    std::array<EntryValue, 16> regs;
    for (int r = 0; r < 16; ++r) regs[r] = EntryValue{r, false, 0};
    size_t i = 0;
    for (int n = 0; n < max_instructions && i < c.size(); ++n) {
        const Insn in = decode_insn(c, i);
        if (in.len == 0) return std::nullopt;
        i += in.len;
        if (in.op == 0xe8 && !in.two_byte) return regs;
        const int w = written_register(in);
        if (w < 0) continue;
        EntryValue v;  // unknown unless a copy or a load followed
        const bool wide = (in.rex & 8) != 0;
        if (!in.two_byte && in.op == 0x89 && in.mod == 3 && wide) v = regs[in.reg];          // mov r64 -> r64
        else if (!in.two_byte && in.op == 0x8b && in.mod == 3 && wide) v = regs[in.rm];      // mov r64 <- r64
        else if (!in.two_byte && (in.op == 0x8b || in.op == 0x63) && in.mod != 3 && !in.seg && !in.indexed &&
                 in.rm >= 0 && regs[in.rm].from >= 0 && !regs[in.rm].loaded)
            v = EntryValue{regs[in.rm].from, true, in.disp};                                   // mov / movslq load
        regs[w] = v;
    }
    return std::nullopt;
}

FirstCall decode_to_first_call(const std::vector<uint8_t>& c, uint64_t vaddr) {
    std::array<RegVal, 16> regs{};
    size_t i = skip_endbr64(c);
    for (int n = 0; n < 16 && i < c.size(); ++n) {
        int rex = (c[i] & 0xf0) == 0x40 ? c[i] & 0x0f : 0;
        size_t start = i;
        if (rex) ++i;
        if (i >= c.size()) break;
        if (c[i] == 0xe8 || c[i] == 0xe9) return FirstCall{FirstCall::Stop::call, regs[7], 0, 0};  // call / tail call
        size_t len = step_move(c, i, rex, vaddr, regs);
        if (len == 0) len = step_immediate(c, i, rex, regs);
        if (len == 0) len = step_neutral(c, i, rex);
        if (len == 0) return FirstCall{FirstCall::Stop::unknown_instruction, {}, start, c[start]};
        i += len;
    }
    return FirstCall{};
}

Result<TlsSlots> getspecific_slots(const std::vector<uint8_t>& c) {
    using R = Result<TlsSlots>;
    // glibc 2.34+ (also 2.36 here): cmp $31,%edi; ja slow; mov %edi,%eax;
    // add $A,%rax; shl $S,%rax; add %fs:0x10,%rax; mov D(%rax),%rdx.
    static const int16_t shape[] = {0x83, 0xff, -1, 0x77, -1, 0x89, 0xf8, 0x48, 0x83, 0xc0, -1, 0x48,
                                    0xc1, 0xe0, -1, 0x64, 0x48, 0x03, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00,
                                    0x48, 0x8b, 0x50, -1};
    const size_t i = skip_endbr64(c);
    constexpr size_t n = sizeof shape / sizeof shape[0];
    if (c.size() < i + n) return R::fail("pthread_getspecific is shorter than glibc's fast path");
    std::vector<uint8_t> imm;
    for (size_t k = 0; k < n; ++k) {
        if (shape[k] < 0) {
            imm.push_back(c[i + k]);
        } else if (c[i + k] != shape[k]) {
            return R::fail("pthread_getspecific is not glibc's fast path (byte 0x" + hex(c[i + k]).substr(2) +
                           " at +" + std::to_string(i + k) + ")");
        }
    }
    uint32_t shift = imm[3];
    if (shift > 8 || imm[2] > 0x7f || imm[4] > 0x7f) return R::fail("pthread_getspecific: implausible slot arithmetic");
    TlsSlots out;
    out.keys = imm[0] + 1u;
    out.stride = 1u << shift;
    out.base = static_cast<uint32_t>(imm[2]) << shift;
    out.data = imm[4];
    return out;
}

size_t single_trap_entry(const std::vector<uint8_t>& c) {
    const size_t i = skip_endbr64(c);
    if (i == 0 || i >= c.size()) return 0;
    const uint8_t op = c[i];
    const bool push = (op >= 0x50 && op <= 0x57) || (op == 0x41 && i + 1 < c.size() && c[i + 1] >= 0x50 && c[i + 1] <= 0x57);
    const bool branch = op == 0xe8 || op == 0xe9 || op == 0xeb || op == 0x90 || (op >= 0x70 && op <= 0x7f) ||
                        (op == 0x0f && i + 1 < c.size() && c[i + 1] >= 0x80 && c[i + 1] <= 0x8f);
    return push || branch ? i : 0;
}

std::optional<size_t> emulated_first_call(const std::vector<uint8_t>& code) {
    const auto& c = code;
    for (size_t i = 0; i < c.size() && i < 32;) {
        const size_t left = c.size() - i;
        if (c[i] == 0xe8 && left >= 5) return i;                                              // call rel32
        if (left >= 4 && c[i] == 0xf3 && c[i + 1] == 0x0f && c[i + 2] == 0x1e && c[i + 3] == 0xfa) {  // endbr64
            i += 4;
        } else if (left >= 4 && c[i] == 0x48 && c[i + 1] == 0x83 && c[i + 2] == 0xec) {     // sub $imm8,%rsp
            i += 4;
        } else if (left >= 7 && (c[i] & 0xfb) == 0x48 && c[i + 1] == 0x8d && (c[i + 2] & 0xc7) == 0x05) {
            i += 7;                                                                          // lea disp32(%rip),%reg
        } else {
            return std::nullopt;
        }
    }
    return std::nullopt;
}

}  // namespace commdbg::arch
