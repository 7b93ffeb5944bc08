// SPDX-License-Identifier: Apache-2.0
#include "x86_disasm.hpp"

#include <capstone/capstone.h>

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace commdbg::arch {
namespace {

// Capstone's register ids of each general-purpose register, any width, by
// ISA number.
const std::map<unsigned, int>& gpr_numbers() {
    static const std::map<unsigned, int> table = [] {
        const std::array<std::array<unsigned, 5>, 16> names = {{
            {X86_REG_RAX, X86_REG_EAX, X86_REG_AX, X86_REG_AL, X86_REG_AH},
            {X86_REG_RCX, X86_REG_ECX, X86_REG_CX, X86_REG_CL, X86_REG_CH},
            {X86_REG_RDX, X86_REG_EDX, X86_REG_DX, X86_REG_DL, X86_REG_DH},
            {X86_REG_RBX, X86_REG_EBX, X86_REG_BX, X86_REG_BL, X86_REG_BH},
            {X86_REG_RSP, X86_REG_ESP, X86_REG_SP, X86_REG_SPL, X86_REG_SPL},
            {X86_REG_RBP, X86_REG_EBP, X86_REG_BP, X86_REG_BPL, X86_REG_BPL},
            {X86_REG_RSI, X86_REG_ESI, X86_REG_SI, X86_REG_SIL, X86_REG_SIL},
            {X86_REG_RDI, X86_REG_EDI, X86_REG_DI, X86_REG_DIL, X86_REG_DIL},
            {X86_REG_R8, X86_REG_R8D, X86_REG_R8W, X86_REG_R8B, X86_REG_R8B},
            {X86_REG_R9, X86_REG_R9D, X86_REG_R9W, X86_REG_R9B, X86_REG_R9B},
            {X86_REG_R10, X86_REG_R10D, X86_REG_R10W, X86_REG_R10B, X86_REG_R10B},
            {X86_REG_R11, X86_REG_R11D, X86_REG_R11W, X86_REG_R11B, X86_REG_R11B},
            {X86_REG_R12, X86_REG_R12D, X86_REG_R12W, X86_REG_R12B, X86_REG_R12B},
            {X86_REG_R13, X86_REG_R13D, X86_REG_R13W, X86_REG_R13B, X86_REG_R13B},
            {X86_REG_R14, X86_REG_R14D, X86_REG_R14W, X86_REG_R14B, X86_REG_R14B},
            {X86_REG_R15, X86_REG_R15D, X86_REG_R15W, X86_REG_R15B, X86_REG_R15B},
        }};
        std::map<unsigned, int> t;
        for (int n = 0; n < 16; ++n)
            for (unsigned r : names[n]) t[r] = n;
        return t;
    }();
    return table;
}

int gpr(unsigned reg) {
    auto it = gpr_numbers().find(reg);
    return it == gpr_numbers().end() ? -1 : it->second;
}

int gpr64(const cs_x86_op& op) { return op.type == X86_OP_REG && op.size == 8 ? gpr(op.reg) : -1; }

struct Handle {
    csh h = 0;
    bool ok = false;
    Handle() {
        ok = cs_open(CS_ARCH_X86, CS_MODE_64, &h) == CS_ERR_OK && cs_option(h, CS_OPT_DETAIL, CS_OPT_ON) == CS_ERR_OK;
    }
    ~Handle() {
        if (ok) cs_close(&h);
    }
};

bool in_group(const cs_insn& in, uint8_t g) {
    for (uint8_t i = 0; i < in.detail->groups_count; ++i)
        if (in.detail->groups[i] == g) return true;
    return false;
}

Insn::Flow flow_of(const cs_insn& in, uint64_t& target) {
    using F = Insn::Flow;
    const cs_x86& x = in.detail->x86;
    const bool direct = x.op_count == 1 && x.operands[0].type == X86_OP_IMM;
    if (direct) target = static_cast<uint64_t>(x.operands[0].imm);
    if (in_group(in, CS_GRP_CALL)) return direct ? F::call : F::indirect_call;
    if (in_group(in, CS_GRP_RET) || in_group(in, CS_GRP_IRET)) return F::ret;
    if (in.id == X86_INS_JMP) return direct ? F::jump : F::indirect_jump;
    if (in_group(in, CS_GRP_JUMP)) return direct ? F::cond_jump : F::indirect_jump;
    if (in.id == X86_INS_UD2 || in.id == X86_INS_HLT || in.id == X86_INS_INT3 || in.id == X86_INS_INT)
        return F::stop;
    return F::none;
}

Insn convert(csh h, const cs_insn& in) {
    Insn out;
    out.addr = in.address;
    out.size = static_cast<uint8_t>(in.size);
    out.flow = flow_of(in, out.target);
    const cs_x86& x = in.detail->x86;
    if (in.id == X86_INS_LEA && x.op_count == 2 && x.operands[1].type == X86_OP_MEM &&
        x.operands[1].mem.base == X86_REG_RIP && x.operands[1].mem.index == X86_REG_INVALID) {
        out.lea_reg = gpr64(x.operands[0]);
        out.lea_target = in.address + in.size + static_cast<uint64_t>(x.operands[1].mem.disp);
    }
    if (in.id == X86_INS_MOV && x.op_count == 2 && x.operands[0].type == X86_OP_MEM) {
        const x86_op_mem& m = x.operands[0].mem;
        if (m.index == X86_REG_INVALID && m.segment == X86_REG_INVALID && gpr(m.base) >= 0) {
            out.store_src = gpr64(x.operands[1]);
            out.store_base = out.store_src < 0 ? -1 : gpr(m.base);
            out.store_disp = m.disp;
        }
    }
    cs_regs read, written;
    uint8_t nread = 0, nwritten = 0;
    if (cs_regs_access(h, &in, read, &nread, written, &nwritten) == CS_ERR_OK)
        for (uint8_t i = 0; i < nwritten; ++i)
            if (int n = gpr(written[i]); n >= 0) out.writes |= 1u << n;
    return out;
}

// The instruction at `addr` of `code`, or nullopt where none starts there.
std::optional<Insn> decode_at(const Handle& d, const std::vector<uint8_t>& code, uint64_t vaddr, uint64_t addr) {
    if (addr < vaddr || addr >= vaddr + code.size()) return std::nullopt;
    cs_insn* in = nullptr;
    const size_t at = addr - vaddr;
    if (cs_disasm(d.h, code.data() + at, code.size() - at, addr, 1, &in) != 1) return std::nullopt;
    std::unique_ptr<cs_insn, void (*)(cs_insn*)> own(in, [](cs_insn* p) { cs_free(p, 1); });
    return convert(d.h, *in);
}

}  // namespace

std::vector<Insn> disassemble(const std::vector<uint8_t>& code, uint64_t vaddr) {
    std::vector<Insn> out;
    Handle d;
    if (!d.ok) return out;
    cs_insn* in = cs_malloc(d.h);
    const uint8_t* p = code.data();
    size_t left = code.size();
    uint64_t addr = vaddr;
    while (left && cs_disasm_iter(d.h, &p, &left, &addr, in)) out.push_back(convert(d.h, *in));
    cs_free(in, 1);
    return out;
}

Result<std::vector<Insn>> first_calls(const std::vector<uint8_t>& code, uint64_t vaddr, uint64_t entry,
                                      int max_instructions) {
    using R = Result<std::vector<Insn>>;
    using F = Insn::Flow;
    Handle d;
    if (!d.ok) return R::fail("the disassembler (Capstone) does not open");
    std::vector<Insn> calls;
    std::set<uint64_t> seen;
    std::vector<uint64_t> todo{entry};
    int followed = 0;
    while (!todo.empty()) {
        uint64_t at = todo.back();
        todo.pop_back();
        while (seen.insert(at).second) {
            if (++followed > max_instructions)
                return R::fail("more than " + std::to_string(max_instructions) + " instructions before the calls");
            auto in = decode_at(d, code, vaddr, at);
            if (!in) return R::fail("a path leaves the code read, or meets bytes that are no instruction");
            if (in->flow == F::call || in->flow == F::indirect_call) {
                calls.push_back(*in);
                break;
            }
            if (in->flow == F::ret || in->flow == F::indirect_jump || in->flow == F::stop)
                return R::fail("a path returns or jumps away before any call");
            if (in->flow == F::cond_jump) todo.push_back(in->target);
            at = in->flow == F::jump ? in->target : in->addr + in->size;
        }
    }
    return R(std::move(calls));
}

}  // namespace commdbg::arch
