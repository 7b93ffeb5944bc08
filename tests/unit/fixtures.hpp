// SPDX-License-Identifier: Apache-2.0
// What many unit tests build: a probed symbol, as a probe spec would make it.
#pragma once

#include <stdlib.h>

#include <filesystem>
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

// A directory of its own under $TMPDIR, removed with what it holds.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "commdbg-unit-XXXXXX").string();
        if (mkdtemp(tmpl.data())) dir_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string path(const std::string& name) const { return dir_ + "/" + name; }

private:
    std::string dir_;
};

}  // namespace commdbg::test
