// SPDX-License-Identifier: Apache-2.0
// The session's table of probed symbols.  A probe's cookie holds an index into
// it plus the argument layout the BPF program needs; everything a human reads
// (names, layers) stays here in userspace.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "events.h"
#include "result.hpp"

namespace commdbg::capture {

// Which argument slot (0..5 registers, 6..7 stack words) holds what.
struct ArgSlots {
    uint8_t count = CD_SLOT_NONE;
    uint8_t dtype = CD_SLOT_NONE;
    uint8_t comm = CD_SLOT_NONE;
    uint8_t redop = CD_SLOT_NONE;
    uint8_t peer = CD_SLOT_NONE;  // root or peer
    uint8_t out = CD_SLOT_NONE;   // out-pointer to a new communicator
    // Decoded in userspace only (not in the cookie):
    uint8_t stream = CD_SLOT_NONE;
    uint8_t sendbuf = CD_SLOT_NONE;
    uint8_t recvbuf = CD_SLOT_NONE;
};

struct SymbolInfo {
    std::string name;   // display name: "ncclAllReduce", "aten::add.Tensor"
    std::string layer;  // "nccl", "c10d", "aten", ...
    cd_role role = CD_ROLE_OTHER;
    cd_coll coll = CD_COLL_NONE;
    ArgSlots slots;
    cd_tail_kind tail = CD_TAIL_NONE;  // tail captured at entry
    bool return_probe = false;         // only for symbols that cannot throw
    bool py_stack = false;             // records carry the Python stack (cookie bit 59)
    uint8_t tensor_params = 0;         // c10d methods: kinds of its tensor parameters (cookie bits 60..63)
    bool redop_is_options = false;     // slots.redop holds a c10d options pointer, not an op (the kernel reads it)
    bool root_is_options = false;      // slots.peer holds a c10d options pointer, not a root (the kernel reads it)
};

uint64_t make_cookie(uint32_t sym_id, const SymbolInfo& s);

class SymbolTable {
public:
    // The cookie has 20 bits for the id; a larger table cannot be probed.
    static constexpr size_t kMaxSymbols = size_t{1} << 20;
    // max_symbols below kMaxSymbols: tests reach a full table cheaply.
    explicit SymbolTable(size_t max_symbols = kMaxSymbols)
        : max_(max_symbols < kMaxSymbols ? max_symbols : kMaxSymbols) {}

    // Returns the id of `s`, adding it when no symbol of that layer+name
    // exists; fails (never throws) when the table is full.
    Result<uint32_t> try_intern(const SymbolInfo& s);
    // try_intern for setup code: a full table is a CommdbgError.
    uint32_t intern(const SymbolInfo& s);
    const SymbolInfo* find(uint32_t id) const {
        return id < syms_.size() ? &syms_[id] : nullptr;
    }
    const SymbolInfo* from_cookie(uint64_t cookie) const { return find(CD_COOKIE_SYM(cookie)); }
    size_t size() const { return syms_.size(); }

private:
    size_t max_;
    std::vector<SymbolInfo> syms_;
    std::unordered_map<std::string, uint32_t> index_;  // layer + '\0' + name -> id
};

}  // namespace commdbg::capture
