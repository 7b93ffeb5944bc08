// SPDX-License-Identifier: Apache-2.0
// What one record's raw slots say, given the symbol table: its name, layer
// and role, its bytes and elements.  Pure functions of a Record; the FSDP
// checks, call_fields and the renderers all read records through these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "events.h"
#include "model.hpp"
#include "symbol_table.hpp"

namespace commdbg::model {

std::string dtype_name(uint32_t dtype);  // "float32" or "dtype(N)"
std::optional<uint64_t> record_bytes(const Record& r);
// Elements in / out of one rank's call; nullopt where nranks would be needed
// and is unknown.
struct Elements {
    uint64_t in = 0, out = 0;
};
std::optional<Elements> record_elements(const Record& r, int32_t nranks);
std::string_view record_name(const Record& r, const capture::SymbolTable& syms);
std::string_view record_layer(const Record& r, const capture::SymbolTable& syms);
cd_role record_role(const Record& r, const capture::SymbolTable& syms);  // CD_ROLE_OTHER if unknown
// ncclCommInitAll: its "nranks" slot is the device count (shown as ndev).
bool is_init_all(const Record& r, const capture::SymbolTable& syms);

}  // namespace commdbg::model
