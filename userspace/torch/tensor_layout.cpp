// SPDX-License-Identifier: Apache-2.0
#include "tensor_layout.hpp"

#include <cstdint>
#include <optional>

#include "elf_symbols.hpp"
#include "x86_decode.hpp"

namespace commdbg::torch {
namespace {

using Code = std::vector<uint8_t>;
using R = Result<TensorLayout>;

// The few instruction forms these readers compile to (g++ -O2, x86-64),
// matched at a byte offset.  `this` arrives in %rdi; some builds copy it to
// %rbx first (mov %rdi,%rbx), and then a field is read through %rbx too.
constexpr uint8_t kRdi = 7, kRbx = 3;

struct Insn {
    uint32_t value = 0;  // a displacement or an immediate
    uint8_t reg = 0;     // the register written or compared
    size_t len = 0;
};

bool rex_w(uint8_t b) { return (b & 0xf8) == 0x48; }

// A ModRM memory operand [base + disp8/disp32] at c[i] with base %rdi (or
// %rbx holding `this`); the displacement and the operand's length.
std::optional<std::pair<uint32_t, size_t>> this_operand(const Code& c, size_t i, bool rbx_is_this) {
    if (i >= c.size()) return std::nullopt;
    const uint8_t mod = c[i] >> 6, rm = c[i] & 7;
    if (rm != kRdi && !(rm == kRbx && rbx_is_this)) return std::nullopt;
    if (mod == 1 && i + 1 < c.size() && c[i + 1] < 0x80) return std::pair<uint32_t, size_t>{c[i + 1], 2};
    if (mod == 2 && i + 4 < c.size()) {
        const auto d = static_cast<uint32_t>(arch::rel32_at(c, i + 1));
        if (d < 0x1000) return std::pair<uint32_t, size_t>{d, 5};
    }
    return std::nullopt;
}

// REX.W OP modrm: `mov disp(this),%reg` (OP 8b) or `lea disp(this),%reg` (8d).
std::optional<Insn> this_insn(const Code& c, size_t i, uint8_t op, bool rbx_is_this) {
    if (i + 2 >= c.size() || !rex_w(c[i]) || (c[i] & 3) || c[i + 1] != op) return std::nullopt;
    auto m = this_operand(c, i + 2, rbx_is_this);
    if (!m) return std::nullopt;
    return Insn{m->first, uint8_t(((c[i] >> 2) & 1) << 3 | ((c[i + 2] >> 3) & 7)), 2 + m->second};
}

// REX.W 83 /7 ib: `cmp $imm8,%reg`.
std::optional<Insn> cmp_imm8(const Code& c, size_t i) {
    if (i + 3 >= c.size() || !rex_w(c[i]) || c[i + 1] != 0x83 || (c[i + 2] & 0xf8) != 0xf8) return std::nullopt;
    return Insn{c[i + 3], uint8_t((c[i] & 1) << 3 | (c[i + 2] & 7)), 4};
}

// `ja`: the taken target and the fall-through.
std::optional<std::pair<size_t, size_t>> ja(const Code& c, size_t i) {
    if (i + 1 < c.size() && c[i] == 0x77) return std::pair<size_t, size_t>{i + 2 + int8_t(c[i + 1]), i + 2};
    if (i + 5 < c.size() && c[i] == 0x0f && c[i + 1] == 0x87) {
        const int32_t rel = arch::rel32_at(c, i + 2);
        return std::pair<size_t, size_t>{i + 6 + rel, i + 6};
    }
    return std::nullopt;
}

// `lea disp(this),%reg`, or `add $imm,%rbx` with %rbx holding `this`: the address of a field.
std::optional<uint32_t> field_address(const Code& c, size_t i, bool rbx_is_this) {
    if (auto l = this_insn(c, i, 0x8d, rbx_is_this)) return l->value;
    if (rbx_is_this && i + 3 < c.size() && c[i] == 0x48 && c[i + 1] == 0x83 && c[i + 2] == 0xc3) return c[i + 3];
    return std::nullopt;
}

// Where %rbx starts holding `this`: after the function's first `mov %rdi,%rbx`
// (never, when it has none).
size_t this_in_rbx_from(const Code& c) {
    for (size_t i = 0; i + 2 < c.size(); ++i)
        if (c[i] == 0x48 && c[i + 1] == 0x89 && c[i + 2] == 0xfb) return i + 3;
    return SIZE_MAX;
}

// sizes_custom / strides_custom's fast path: the dim count loaded and
// compared with the inline capacity (`mov D(this),R; cmp $C,R; ja HEAP`),
// the inline array's address on the fall-through, and (sizes) the same
// field loaded as the heap pointer on the taken branch.
struct DimBranch {
    uint32_t dim = 0, inline_dims = 0, inline_at = 0, heap_at = 0;
    size_t at = 0;
};

std::optional<DimBranch> dim_branch(const Code& c) {
    const size_t rbx_from = this_in_rbx_from(c);
    for (size_t i = 0; i < c.size(); ++i) {
        const bool rbx = i >= rbx_from;
        auto load = this_insn(c, i, 0x8b, rbx);
        if (!load) continue;
        auto cmp = cmp_imm8(c, i + load->len);
        if (!cmp || cmp->reg != load->reg) continue;
        auto br = ja(c, i + load->len + cmp->len);
        if (!br) continue;
        auto inl = field_address(c, br->second, rbx);
        if (!inl) continue;
        auto heap = this_insn(c, br->first, 0x8b, rbx);
        return DimBranch{load->value, cmp->value, *inl, heap ? heap->value : 0, i};
    }
    return std::nullopt;
}

// `testb $bit,disp(this)` before `at`: the has_symbolic_sizes_strides_ flag.
std::optional<std::pair<uint32_t, uint8_t>> symbolic_flag(const Code& c, size_t at) {
    std::optional<std::pair<uint32_t, uint8_t>> last;
    const size_t rbx_from = this_in_rbx_from(c);
    for (size_t i = 0; i + 2 < at; ++i) {
        if (c[i] != 0xf6 || ((c[i + 1] >> 3) & 7) != 0) continue;
        auto m = this_operand(c, i + 1, i >= rbx_from);
        if (!m || i + 1 + m->second >= c.size()) continue;
        const uint8_t bit = c[i + 1 + m->second];
        if (bit && !(bit & (bit - 1))) last = std::pair<uint32_t, uint8_t>{m->first, bit};
    }
    return last;
}

// numel_custom's fast path: the first `mov disp(this),%rax` is numel_.
std::optional<uint32_t> numel_field(const Code& c) {
    const size_t rbx_from = this_in_rbx_from(c);
    for (size_t i = 0; i < c.size(); ++i)
        if (auto l = this_insn(c, i, 0x8b, i >= rbx_from); l && l->reg == 0) return l->value;
    return std::nullopt;
}

// HandleResize: `movzwl D(this),%eax` (data_type_), `cmp $N,%ax` (Undefined),
// `lea T(%rip),%r` (the element sizes), `movzbl (...)`.
struct DtypeRead {
    uint32_t data_type = 0;
    uint16_t undefined = 0;
    uint64_t table = 0;  // link-time address
};

std::optional<DtypeRead> dtype_read(const Code& c, uint64_t vaddr) {
    const size_t rbx_from = this_in_rbx_from(c);
    for (size_t i = 0; i + 3 < c.size(); ++i) {
        if (c[i] != 0x0f || c[i + 1] != 0xb7 || ((c[i + 2] >> 3) & 7) != 0) continue;
        auto m = this_operand(c, i + 2, i >= rbx_from);
        if (!m) continue;
        std::optional<uint16_t> n;
        for (size_t j = i + 2 + m->second; j + 7 < c.size() && j < i + 64; ++j) {
            if (!n && c[j] == 0x66 && c[j + 1] == 0x83 && c[j + 2] == 0xf8) n = c[j + 3];
            if (n && rex_w(c[j]) && c[j + 1] == 0x8d && (c[j + 2] & 0xc7) == 0x05 && c[j + 7] == 0x0f &&
                j + 8 < c.size() && c[j + 8] == 0xb6) {
                const int32_t rel = arch::rel32_at(c, j + 3);
                return DtypeRead{m->first, *n, vaddr + j + 7 + rel};
            }
        }
    }
    return std::nullopt;
}

struct Readers {
    host::ElfSymbols elf;
    std::string path;
    Result<std::pair<Code, uint64_t>> code(const char* mangled, const char* what) const {
        using C = Result<std::pair<Code, uint64_t>>;
        const host::ElfSymbol* s = elf.find(mangled);
        if (!s) return C::fail(path + ": no " + what + " exported: not a libc10 this build of commdbg can read");
        auto c = host::read_function_code(path, *s, 1024);
        if (!c) return C::fail(c.error());
        return std::pair<Code, uint64_t>{std::move(c.value()), s->vaddr};
    }
};

// The element sizes table, N+1 bytes at link-time address `vaddr`, from the file.
Result<std::vector<uint8_t>> read_table(const std::string& path, uint64_t vaddr, size_t n) {
    using T = Result<std::vector<uint8_t>>;
    auto data = host::read_elf_data(path, std::set<std::string, std::less<>>{});
    if (!data) return T::fail(data.error());
    // Fewer than n bytes: the table would run past its segment.
    auto bytes = host::read_code_at(path, *data, vaddr, n);
    if (bytes && bytes->size() == n) return bytes;
    return T::fail(path + ": the element-size table HandleResize reads is not in the file");
}

}  // namespace

Result<TensorLayout> derive_tensor_layout(const std::string& path) {
    auto elf = host::ElfSymbols::open(path);
    if (!elf) return R::fail(elf.error());
    const Readers rd{std::move(elf.value()), path};
    auto sizes = rd.code("_ZNK3c1010TensorImpl12sizes_customEv", "TensorImpl::sizes_custom");
    auto strides = rd.code("_ZNK3c1010TensorImpl14strides_customEv", "TensorImpl::strides_custom");
    auto numel = rd.code("_ZNK3c1010TensorImpl12numel_customEv", "TensorImpl::numel_custom");
    auto resize = rd.code("_ZN3c1010TensorImpl12HandleResizeEv", "TensorImpl::HandleResize");
    for (const auto* r : {&sizes, &strides, &numel, &resize})
        if (!*r) return R::fail(r->error());
    const std::string why = path + ": TensorImpl's layout cannot be derived: ";
    auto sb = dim_branch(sizes->first), st = dim_branch(strides->first);
    if (!sb || !st) return R::fail(why + (sb ? "strides_custom" : "sizes_custom") + "'s code has another shape");
    auto sym = symbolic_flag(sizes->first, sb->at);
    auto nf = numel_field(numel->first);
    auto dt = dtype_read(resize->first, resize->second);
    if (!sym || !nf || !dt)
        return R::fail(why + (!sym  ? "no symbolic-shape test in sizes_custom"
                              : !nf ? "numel_custom's code has another shape"
                                    : "HandleResize's code has another shape"));
    TensorLayout l{sb->dim,    sb->inline_at, sb->inline_dims, *nf, dt->data_type,
                   sym->first, sym->second,   dt->undefined,   {},  0};
    const uint32_t arrays_end = l.sizes + 16 * l.inline_dims;  // inline sizes, then inline strides
    auto inside = [&](uint32_t off) { return off >= l.dim && off < arrays_end; };
    if (l.inline_dims == 0 || l.inline_dims > 16 || sb->heap_at != l.sizes || l.sizes != l.dim + 8 ||
        st->dim != l.dim || st->inline_dims != l.inline_dims || st->inline_at != l.sizes + 8 * l.inline_dims ||
        inside(l.numel) || inside(l.data_type) || l.numel == l.data_type || l.undefined == 0)
        return R::fail(why + "the offsets its readers use disagree (dim " + std::to_string(l.dim) + ", sizes " +
                       std::to_string(l.sizes) + ", numel " + std::to_string(l.numel) + ")");
    auto table = read_table(path, dt->table, size_t(l.undefined) + 1);
    if (!table) return R::fail(table.error());
    if (table->back() != 0) return R::fail(why + "Undefined's element size is not 0 in the file's table");
    table->pop_back();
    l.itemsizes = std::move(table.value());
    l.named = named_scalar_types(l.itemsizes);
    return l;
}

}  // namespace commdbg::torch
