// SPDX-License-Identifier: Apache-2.0
// Steps of discover_python (python_runtime.hpp) shared by its files: the
// verified per-version table (docs/design/python-walker.md), the checks of a live target
// against it, and the target's memory read as discovery reports a failure.
// A step either goes on or fails with the reason and the status it gives
// the discovery: unsupported (a build we refuse) or error (a read failed).
#pragma once

#include <cstdint>
#include <string>

#include "python_runtime.hpp"
#include "remote_memory.hpp"
#include "result.hpp"

namespace commdbg::python::discovery {

using Status = PyDiscovery::Status;
// A step of discovery: true to go on, or why it stops.
using Step = Result<bool>;

// Why the last read of `mem` failed, `what` naming what it read: the
// process exited, ptrace access was refused (and what to do), or the
// address did not hold what the layout says.
std::string unreadable(const host::ProcessMemory& mem, const char* what);

template <typename T>
Step read_field(host::ProcessMemory& mem, uint64_t addr, T& out, const char* what) {
    if (mem.get(addr, out)) return true;
    return Step::fail(unreadable(mem, what));
}

// An entry of a type's tp_members table (PyMemberDef on x86-64).
struct MemberDef {
    uint64_t name;
    int32_t type;
    int32_t pad;
    int64_t offset;
    int32_t flags;
    int32_t pad2;
    uint64_t doc;
};
static_assert(sizeof(MemberDef) == 40, "PyMemberDef on x86-64");

// A failure to read memory (the process may be gone), not a layout we refuse.
inline Step as_error(Step failed, Status& status) {
    status = Status::error;
    return failed;
}

// A NUL-terminated string of at most `max` bytes.
Step read_c_string(host::ProcessMemory& mem, uint64_t addr, std::string& out, size_t max, const char* what);

// The table's offsets for l.minor (3.10-3.13).
void fill_table(PyLayout& l);

// Reads PyCode_Type.tp_members and checks it against the table; fills the
// code-object offsets.
Step check_code_members(host::ProcessMemory& mem, PyDiscovery& d, Status& status);

// 3.13: takes the offsets the target's _Py_DebugOffsets gives, noting
// where they differ from the table.
Step apply_debug_offsets(host::ProcessMemory& mem, PyDiscovery& d, Status& status);

}  // namespace commdbg::python::discovery
