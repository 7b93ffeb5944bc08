// SPDX-License-Identifier: Apache-2.0
#include "symbol_table.hpp"


namespace commdbg::capture {

uint64_t make_cookie(uint32_t sym_id, const SymbolInfo& s) {
    auto nib = [](uint64_t v) { return v & 0xfu; };
    uint64_t c = sym_id & 0xfffffu;
    c |= nib(s.role) << 20;
    c |= nib(s.slots.count) << 24;
    c |= nib(s.slots.dtype) << 28;
    c |= nib(s.slots.comm) << 32;
    c |= nib(s.slots.redop) << 36;
    c |= nib(s.slots.peer) << 40;
    c |= nib(s.slots.out) << 44;
    c |= nib(s.tail) << 48;
    c |= nib(s.coll) << 52;
    c |= static_cast<uint64_t>(s.return_probe ? 1 : 0) << 56;
    // Stack words are read only where a slot is one (a user read costs more
    // than the rest of a counted entry).
    auto on_stack = [](uint8_t slot) { return slot >= CD_REG_SLOTS && slot < CD_NUM_ARGS; };
    const ArgSlots& a = s.slots;
    bool counted = on_stack(a.count) || on_stack(a.dtype) || on_stack(a.comm) || on_stack(a.peer) ||
                   on_stack(a.out);
    bool recorded = counted || on_stack(a.redop) || on_stack(a.stream) || on_stack(a.sendbuf) ||
                    on_stack(a.recvbuf);
    c |= static_cast<uint64_t>(counted ? 1 : 0) << 57;
    c |= static_cast<uint64_t>(recorded ? 1 : 0) << 58;
    c |= static_cast<uint64_t>(s.py_stack ? 1 : 0) << 59;
    c |= static_cast<uint64_t>(s.tensor_params & 0xfu) << 60;
    return c;
}

Result<uint32_t> SymbolTable::try_intern(const SymbolInfo& s) {
    std::string key = s.layer;
    key.push_back('\0');
    key += s.name;
    // One name, two signatures (overloads, another torch build): one id each.
    if (s.tensor_params) key += '\0' + std::to_string(s.tensor_params);
    if (auto it = index_.find(key); it != index_.end()) return it->second;
    if (syms_.size() >= max_)
        return Result<uint32_t>::fail("symbol table full: more than " + std::to_string(max_) +
                                      " probed symbols (a probe's cookie holds 20 bits of symbol id)");
    auto id = static_cast<uint32_t>(syms_.size());
    syms_.push_back(s);
    index_.emplace(std::move(key), id);
    return id;
}

uint32_t SymbolTable::intern(const SymbolInfo& s) {
    auto id = try_intern(s);
    if (!id) throw CommdbgError(id.error());
    return *id;
}

}  // namespace commdbg::capture
