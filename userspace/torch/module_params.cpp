// SPDX-License-Identifier: Apache-2.0
#include "module_params.hpp"

#include "elf_symbols.hpp"
#include "x86_decode.hpp"

namespace commdbg::torch {
namespace {

using Code = std::vector<uint8_t>;

constexpr const char* kGetCdata = "_Z21THPVariable_get_cdataP11THPVariablePv";
constexpr uint8_t kRdi = 7;

// THPVariable_get_cdata returns PyLong_FromVoidPtr(self->cdata's TensorImpl*):
// `self` arrives in %rdi and may be copied to a callee-saved register
// (`mov %rdi,%R`); the argument is then loaded as `mov D(%R),%rdi` right
// before `call PyLong_FromVoidPtr`.  D and the call's target, in the order
// they appear.
struct CdataLoad {
    uint32_t disp = 0;
    uint64_t call_target = 0;  // link-time
};
std::optional<CdataLoad> cdata_load(const Code& c, uint64_t vaddr) {
    uint8_t self[16] = {};
    self[kRdi] = 1;
    for (size_t i = 0; i + 3 < c.size(); ++i) {
        const uint8_t rex = c[i];
        if ((rex & 0xf8) != 0x48) continue;
        const uint8_t modrm = c[i + 2];
        if (c[i + 1] == 0x89 && (modrm >> 6) == 3 && ((modrm >> 3) & 7) == kRdi && !(rex & 4)) {
            self[((rex & 1) << 3) | (modrm & 7)] = 1;  // mov %rdi,%R
            continue;
        }
        // mov disp8(%R),%rdi: REX.W[B] 8b, mod 01, reg rdi; rm 4 takes a SIB byte (%r12: 0x24).
        if (c[i + 1] != 0x8b || (modrm >> 6) != 1 || ((modrm >> 3) & 7) != kRdi || (rex & 6)) continue;
        const uint8_t base = ((rex & 1) << 3) | (modrm & 7);
        size_t at = i + 3;
        if ((modrm & 7) == 4) {
            if (at >= c.size() || c[at] != 0x24) continue;
            ++at;
        }
        if (!self[base] || at + 5 >= c.size() || c[at + 1] != 0xe8) continue;
        const int32_t rel = arch::rel32_at(c, at + 2);
        return CdataLoad{c[at], vaddr + at + 6 + rel};
    }
    return std::nullopt;
}

}  // namespace

Result<uint32_t> derive_variable_impl(const std::string& path) {
    using R = Result<uint32_t>;
    const std::string why = path + ": where a torch.Tensor object keeps its TensorImpl cannot be derived: ";
    // One symbol asked for: the file's whole symbol table (100k+ names) would
    // keep the session from draining its ring buffer for seconds.
    auto elf = host::read_elf_data(path, {kGetCdata});
    if (!elf) return R::fail(elf.error());
    auto get = elf->symbols.find(kGetCdata);
    if (get == elf->symbols.end()) return R::fail(why + "no THPVariable_get_cdata exported");
    auto code = host::read_code_at(path, *elf, get->second, 256);
    if (!code) return R::fail(code.error());
    auto load = cdata_load(*code, get->second);
    if (!load || load->disp < 16 || load->disp % 8 != 0 || load->disp > 64)
        return R::fail(why + "THPVariable_get_cdata's code has another shape");
    // The call must be PyLong_FromVoidPtr's: its PLT stub's GOT slot is relocated to that symbol.
    if (!host::is_plt_stub_of(path, *elf, load->call_target, "PyLong_FromVoidPtr"))
        return R::fail(why + "THPVariable_get_cdata does not pass the loaded word to PyLong_FromVoidPtr");
    return load->disp;
}

std::string placements_text(const std::vector<std::string>& items) {
    std::string s = "(";
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
    return s + (items.size() == 1 ? ",)" : ")");
}

}  // namespace commdbg::torch
