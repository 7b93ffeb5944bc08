// SPDX-License-Identifier: Apache-2.0
// What the kernel's frame walker is told of a process's code objects
// (events.h, cd_py_codes): the kind of each code object its records ran, so
// that it reads `self`'s type only in frames where a record can use it.
// Built as frames are named; a code object whose address now holds another
// is dropped (the kernel then reads its frames' types, as for any code
// object it has not been told of).
#pragma once

#include <array>
#include <cstdint>

#include "events.h"
#include "py_context.hpp"

namespace commdbg::python {

// The kernel's kind for a code object userspace named: frames of `kind`
// whose code takes `argcount` positional arguments.
cd_py_code_kind py_code_kind(PyFrameKind kind, int32_t argcount);

class PyCodeTable {
public:
    // `code` runs frames of `kind`, seen in batch `epoch`.  A full bucket
    // gives up the slot seen least recently.
    void note(uint64_t code, cd_py_code_kind kind, uint64_t epoch);
    // `code` no longer holds what it was noted for.
    void drop(uint64_t code);
    // As the kernel will find it (CD_CODE_UNKNOWN: not in the table).
    cd_py_code_kind kind(uint64_t code) const;
    // Whether it changed since the last call.
    bool take_changed();
    const cd_py_codes& slots() const { return t_; }

private:
    int find(uint64_t code) const;  // slot index, -1: absent
    cd_py_codes t_{};
    std::array<uint64_t, CD_PY_CODE_SLOTS> seen_{};
    bool changed_ = false;
};

}  // namespace commdbg::python
