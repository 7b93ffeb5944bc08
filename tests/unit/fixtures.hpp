// SPDX-License-Identifier: Apache-2.0
// What many unit tests build: a probed symbol, as a probe spec would make it.
#pragma once

#include <string>

#include "events.h"
#include "symbol_table.hpp"

namespace commdbg::test {

// A SymbolInfo with the fields a test names; the rest as a spec leaves them.
inline capture::SymbolInfo symbol(std::string name, std::string layer, cd_role role, cd_coll coll = CD_COLL_NONE,
                         capture::ArgSlots slots = {}, bool return_probe = false, bool py_stack = false) {
    capture::SymbolInfo s;
    s.name = std::move(name);
    s.layer = std::move(layer);
    s.role = role;
    s.coll = coll;
    s.slots = slots;
    s.return_probe = return_probe;
    s.py_stack = py_stack;
    return s;
}

}  // namespace commdbg::test
