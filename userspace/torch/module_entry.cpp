// SPDX-License-Identifier: Apache-2.0
#include "module_entry.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include "x86_disasm.hpp"

namespace commdbg::torch {
namespace {

constexpr const char* kInitTracerBindings = "_ZN5torch3jit6tracer24initPythonTracerBindingsEP7_object";
constexpr const char* kGetTracingState = "_ZN5torch3jit6tracer15getTracingStateEv";
constexpr std::string_view kBindingName = "_get_tracing_state";
constexpr size_t kMaxInitBytes = 1 << 20;    // initPythonTracerBindings is ~8 KiB
constexpr size_t kDispatcherBytes = 1024;    // the paths to its first calls lie within

bool writes(const arch::Insn& in, int reg) { return (in.writes >> reg) & 1u; }
bool is_call(const arch::Insn& in) {
    return in.flow == arch::Insn::Flow::call || in.flow == arch::Insn::Flow::indirect_call;
}

// The index of the store of the register `lea` at index i loaded to +0 of
// some base, the register still holding it; nullopt when none.
std::optional<size_t> name_store(const std::vector<arch::Insn>& code, size_t i) {
    const int s = code[i].lea_reg;
    for (size_t j = i + 1; j < code.size(); ++j) {
        if (code[j].store_src == s && code[j].store_disp == 0 && code[j].store_base != s) return j;
        if (writes(code[j], s) || (is_call(code[j]) && !arch::callee_saved(s))) return std::nullopt;
    }
    return std::nullopt;
}

// The dispatchers stored at +kFunctionRecordImpl of the record whose name
// store is at index j: in the stretch without calls around it, a store
// from a register loaded by a rip-relative lea in that stretch, the base
// unchanged between the two stores.
std::set<uint64_t> impl_stores(const std::vector<arch::Insn>& code, size_t j) {
    size_t from = j, to = j;
    while (from > 0 && !is_call(code[from - 1])) --from;
    while (to < code.size() && !is_call(code[to])) ++to;
    const int base = code[j].store_base;
    std::set<uint64_t> out;
    for (size_t k = from; k < to; ++k) {
        if (code[k].store_base != base || code[k].store_disp != kFunctionRecordImpl) continue;
        const size_t lo = std::min(j, k), hi = std::max(j, k);
        if (std::any_of(code.begin() + lo + 1, code.begin() + hi, [&](const auto& in) { return writes(in, base); }))
            continue;
        const int r = code[k].store_src;
        for (size_t l = k; l-- > from;) {
            if (code[l].lea_reg == r) {
                out.insert(code[l].lea_target);
                break;
            }
            if (writes(code[l], r)) break;
        }
    }
    return out;
}

// Whether the call target `t` is getTracingState(): the function itself
// when this file defines it, or a PLT stub whose GOT slot is relocated to it.
bool is_get_tracing_state(const std::string& path, const host::ElfData& elf, uint64_t t) {
    if (auto it = elf.symbols.find(kGetTracingState); it != elf.symbols.end()) return it->second == t;
    return host::is_plt_stub_of(path, elf, t, kGetTracingState);
}

// The C string at `vaddr` is the binding's name.
bool names_binding(const std::string& path, const host::ElfData& elf, uint64_t vaddr) {
    auto s = host::read_code_at(path, elf, vaddr, kBindingName.size() + 1);
    return s && s->size() == kBindingName.size() + 1 && s->back() == 0 &&
           std::equal(kBindingName.begin(), kBindingName.end(), s->begin());
}

Result<uint64_t> find_dispatcher(const std::string& path, const host::ElfData& elf) {
    using R = Result<uint64_t>;
    const uint64_t init = elf.symbols.at(kInitTracerBindings);
    const uint64_t size = elf.sizes.at(kInitTracerBindings);
    if (size == 0 || size > kMaxInitBytes) return R::fail("initPythonTracerBindings has no usable size");
    auto bytes = host::read_code_at(path, elf, init, size);
    if (!bytes) return R::fail(bytes.error());
    const std::vector<arch::Insn> code = arch::disassemble(*bytes, init);
    std::set<uint64_t> found;
    for (size_t i = 0; i < code.size(); ++i) {
        if (code[i].lea_reg < 0 || !names_binding(path, elf, code[i].lea_target)) continue;
        if (auto j = name_store(code, i)) found.merge(impl_stores(code, *j));
    }
    if (found.size() != 1)
        return R::fail(std::to_string(found.size()) + " dispatchers stored beside the name \"_get_tracing_state\" "
                       "in initPythonTracerBindings (one expected)");
    return R(*found.begin());
}

}  // namespace

Result<std::vector<host::ElfSymbol>> tracing_state_binding_calls(const std::string& path) {
    using R = Result<std::vector<host::ElfSymbol>>;
    auto fail = [&](const std::string& why) { return R::fail(path + ": torch._C._get_tracing_state: " + why); };
    auto elf = host::read_elf_data(path, {kInitTracerBindings, kGetTracingState});
    if (!elf) return R::fail(elf.error());
    if (!elf->symbols.count(kInitTracerBindings)) return fail("no initPythonTracerBindings");
    auto dispatcher = find_dispatcher(path, *elf);
    if (!dispatcher) return fail(dispatcher.error());
    auto bytes = host::read_code_at(path, *elf, *dispatcher, kDispatcherBytes);
    if (!bytes) return fail(bytes.error());
    auto calls = arch::first_calls(*bytes, *dispatcher, *dispatcher);
    if (!calls) return fail("its dispatcher: " + calls.error());
    std::vector<host::ElfSymbol> out;
    for (const arch::Insn& c : *calls) {
        if (c.flow != arch::Insn::Flow::call || !is_get_tracing_state(path, *elf, c.target))
            return fail("a path of its dispatcher calls something else before getTracingState()");
        auto off = host::file_offset_of(*elf, c.addr);
        if (!off) return fail("its dispatcher lies outside every segment");
        out.push_back(host::ElfSymbol{std::string(kModuleEntry), c.addr, c.size, *off});
    }
    if (out.empty()) return fail("its dispatcher makes no call");
    return R(std::move(out));
}

std::vector<host::ElfSymbol> module_entry_sites(const std::string& path, std::string& note) {
    const size_t slash = path.rfind('/') + 1;
    const std::string base = path.substr(slash);
    if (base.starts_with("libtorch_python")) {
        auto calls = tracing_state_binding_calls(path);
        return calls ? *calls : std::vector<host::ElfSymbol>{};
    }
    if (!base.starts_with("libtorch_cpu")) return {};
    const std::string python = path.substr(0, slash) + "libtorch_python" + base.substr(std::string("libtorch_cpu").size());
    auto calls = tracing_state_binding_calls(python);
    if (calls) return {};
    auto elf = host::read_elf_data(path, {kGetTracingState});
    const auto at = elf && elf->symbols.count(kGetTracingState) ? elf->symbols.at(kGetTracingState) : 0;
    const auto off = at ? host::file_offset_of(*elf, at) : std::nullopt;
    if (!off) {
        note = calls.error() + "; and " + path + " defines no getTracingState()";
        return {};
    }
    note = calls.error() + " — nn.Module calls are probed at getTracingState() instead, which torch 2.x's Python "
                           "bindings also call at every op: one more trap per op called from Python";
    return {host::ElfSymbol{std::string(kModuleEntry), at, elf->sizes.at(kGetTracingState), *off}};
}

}  // namespace commdbg::torch
