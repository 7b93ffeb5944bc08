// SPDX-License-Identifier: Apache-2.0
// The verified per-version table (docs/design/python-walker.md) and the checks of a live
// target against it: PyCode_Type's members, 3.13's _Py_DebugOffsets.
#include "py_layouts.hpp"

#include <cstring>
#include <map>

#include "procfs.hpp"
#include "text.hpp"

namespace commdbg::python::discovery {

std::string unreadable(const host::ProcessMemory& mem, const char* what) {
    const std::string pid = std::to_string(mem.pid());
    const int err = mem.last_error();
    const std::string at = std::string(what) + " at " + hex(mem.failed_at());
    if (err == ESRCH) return "process " + pid + " exited while reading " + at;
    if (err == EPERM) {
        return "cannot read the memory of process " + pid + ": permission denied (ptrace access) — " +
               access_denied_advice(host::own_creds());
    }
    return "cannot read " + at + " in process " + pid + ": " + std::strerror(err) +
           " — the interpreter's memory is not laid out as expected";
}

Step read_c_string(host::ProcessMemory& mem, uint64_t addr, std::string& out, size_t max, const char* what) {
    if (mem.c_string(addr, out, max)) return true;
    return Step::fail(unreadable(mem, what));
}

void fill_table(PyLayout& l) {
    l.ob_type = 8, l.tp_name = 24, l.tp_flags = 168, l.tuple_items = 24, l.cell_contents = 16;
    l.unicode_length = 16, l.unicode_state = 32, l.ts_next = 8;
    switch (l.minor) {
    case 10:
        l.ts_frame = 24, l.ts_thread_id = 176, l.frame_code = 32, l.frame_previous = 24;
        l.frame_localsplus = 352, l.frame_instr = 96, l.code_localsplusnames = 72;
        l.unicode_ascii_data = 48, l.unicode_compact_data = 72, l.rt_interpreters_head = 32;
        l.interp_threads_head = 8;
        break;
    case 11:
        l.ts_frame = 56, l.ts_frame_inner = 8, l.ts_thread_id = 152, l.ts_native_thread_id = 160;
        l.frame_code = 32, l.frame_previous = 48, l.frame_localsplus = 72, l.frame_owner = 69;
        l.frame_instr = 56, l.code_localsplusnames = 96, l.unicode_ascii_data = 48;
        l.unicode_compact_data = 72, l.rt_interpreters_head = 40, l.interp_threads_head = 16;
        l.ts_datastack = 296;
        break;
    default:  // 12, 13
        l.ts_frame = l.minor == 12 ? 56 : 72, l.ts_frame_inner = l.minor == 12 ? 0 : kPyNoOffset;
        l.ts_thread_id = l.minor == 12 ? 136 : 152, l.ts_native_thread_id = l.minor == 12 ? 144 : 160;
        l.frame_code = 0, l.frame_previous = 8, l.frame_localsplus = 72, l.frame_owner = 70;
        l.frame_owner_cstack = 3, l.frame_instr = 56, l.code_localsplusnames = 96;
        l.unicode_ascii_data = 40, l.unicode_compact_data = 56;
        l.rt_interpreters_head = l.minor == 12 ? 40 : 632, l.interp_threads_head = l.minor == 12 ? 72 : 7344;
        l.skip_none_code = l.minor == 13;
        l.ts_datastack = 232;
        break;
    }
}

namespace {

// The code-object offsets verified (docs/design/python-walker.md), by member name.
std::map<std::string, uint32_t> expected_code_members(int minor) {
    if (minor == 10)
        return {{"co_argcount", 16}, {"co_flags", 36}, {"co_firstlineno", 40}, {"co_filename", 104}, {"co_name", 112}};
    std::map<std::string, uint32_t> m = {{"co_argcount", minor == 11 ? 56u : 52u},
                                         {"co_flags", 48},
                                         {"co_firstlineno", minor == 11 ? 72u : 68u},
                                         {"co_filename", 112},
                                         {"co_name", 120},
                                         {"co_qualname", 128}};
    return m;
}

// The members of PyCode_Type's tp_members table at `members`, by name.
Step read_members(host::ProcessMemory& mem, uint64_t members, std::map<std::string, uint32_t>& found) {
    for (int i = 0; i < 64; ++i) {
        MemberDef m{};
        if (auto r = read_field(mem, members + sizeof m * static_cast<uint64_t>(i), m, "a PyMemberDef"); !r) return r;
        if (m.name == 0) break;
        std::string name;
        if (auto r = read_c_string(mem, m.name, name, 64, "a member name"); !r) return r;
        if (m.offset >= 0 && m.offset < 4096) found[name] = static_cast<uint32_t>(m.offset);
    }
    return true;
}

}  // namespace

Step check_code_members(host::ProcessMemory& mem, PyDiscovery& d, Status& status) {
    status = Status::unsupported;
    PyLayout& l = d.layout;
    uint64_t name_ptr = 0, members = 0;
    std::string tp_name;
    if (auto r = read_field(mem, l.code_type_addr + l.tp_name, name_ptr, "PyCode_Type.tp_name"); !r) return as_error(r, status);
    if (auto r = read_c_string(mem, name_ptr, tp_name, 32, "PyCode_Type's name"); !r) return as_error(r, status);
    if (tp_name != "code") return Step::fail("PyCode_Type's tp_name is \"" + tp_name + "\", not \"code\": unknown type layout");
    if (auto r = read_field(mem, l.code_type_addr + 240, members, "PyCode_Type.tp_members"); !r) return as_error(r, status);
    std::map<std::string, uint32_t> found;
    if (auto r = read_members(mem, members, found); !r) return as_error(r, status);
    for (const auto& [name, want] : expected_code_members(l.minor)) {
        auto it = found.find(name);
        if (it == found.end()) return Step::fail("PyCode_Type has no member " + name + ": unknown code-object layout");
        if (it->second != want)
            return Step::fail("code-object " + name + " is at " + std::to_string(it->second) +
                              ", the verified table says " + std::to_string(want) +
                              ": this build's layout differs, not supported");
    }
    l.code_argcount = found["co_argcount"], l.code_flags = found["co_flags"];
    l.code_firstlineno = found["co_firstlineno"], l.code_filename = found["co_filename"];
    l.code_name = found["co_name"];
    if (l.minor >= 11) l.code_qualname = found["co_qualname"];
    return true;
}

namespace {

// 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h of 3.13), the
// fields used here; every field is a uint64_t.
struct DebugOffsets313 {
    char cookie[8];
    uint64_t version, free_threaded;
    uint64_t rt_size, rt_finalizing, rt_interpreters_head;
    uint64_t is_size, is_id, is_next, is_threads_head, is_rest[9];
    uint64_t ts_size, ts_prev, ts_next, ts_interp, ts_current_frame, ts_thread_id, ts_native_thread_id,
        ts_datastack_chunk, ts_status;
    uint64_t fr_size, fr_previous, fr_executable, fr_instr_ptr, fr_localsplus, fr_owner;
    uint64_t co_size, co_filename, co_name, co_qualname, co_linetable, co_firstlineno, co_argcount,
        co_localsplusnames, co_localspluskinds, co_code_adaptive;
    uint64_t ob_size, ob_type;
    uint64_t tp_size, tp_name, tp_repr, tp_flags;
    uint64_t tu_size, tu_ob_item, tu_ob_size;
    uint64_t rest[14];
    uint64_t un_size, un_state, un_length, un_asciiobject_size;
    uint64_t gc_size, gc_collecting;
};
static_assert(sizeof(DebugOffsets313) == 584, "3.13.0's _Py_DebugOffsets");

// Takes one offset from _Py_DebugOffsets, noting where it differs from the table.
void take(uint32_t& field, uint64_t v, const char* name, PyDiscovery& d) {
    if (v > 0xffff) return;
    if (field != v) d.notes.push_back(std::string("_Py_DebugOffsets: ") + name + " is " + std::to_string(v) +
                                      " (table: " + std::to_string(field) + ")");
    field = static_cast<uint32_t>(v);
}

}  // namespace

Step apply_debug_offsets(host::ProcessMemory& mem, PyDiscovery& d, Status& status) {
    DebugOffsets313 o{};
    PyLayout& l = d.layout;
    status = Status::error;
    if (auto r = read_field(mem, l.runtime_addr, o, "_Py_DebugOffsets"); !r) return r;
    status = Status::unsupported;
    if (std::memcmp(o.cookie, "xdebugpy", 8) != 0) return Step::fail("3.13 without the _Py_DebugOffsets cookie: unknown layout");
    if (o.free_threaded != 0) return Step::fail("free-threaded CPython 3.13t: not supported (use a default GIL build)");
    if ((o.version >> 16) != (l.version_hex >> 16)) return Step::fail("_Py_DebugOffsets' version is " + hex(o.version));
    if (o.co_qualname != l.code_qualname || o.co_firstlineno != l.code_firstlineno || o.co_argcount != l.code_argcount)
        return Step::fail("_Py_DebugOffsets' code-object offsets disagree with PyCode_Type.tp_members: not supported");
    take(l.rt_interpreters_head, o.rt_interpreters_head, "interpreters.head", d);
    take(l.interp_threads_head, o.is_threads_head, "threads.head", d);
    take(l.ts_next, o.ts_next, "tstate.next", d);
    take(l.ts_frame, o.ts_current_frame, "tstate.current_frame", d);
    take(l.ts_thread_id, o.ts_thread_id, "tstate.thread_id", d);
    take(l.ts_native_thread_id, o.ts_native_thread_id, "tstate.native_thread_id", d);
    take(l.ts_datastack, o.ts_datastack_chunk, "tstate.datastack_chunk", d);
    take(l.frame_previous, o.fr_previous, "frame.previous", d);
    take(l.frame_code, o.fr_executable, "frame.f_executable", d);
    take(l.frame_instr, o.fr_instr_ptr, "frame.instr_ptr", d);
    take(l.frame_localsplus, o.fr_localsplus, "frame.localsplus", d);
    take(l.frame_owner, o.fr_owner, "frame.owner", d);
    take(l.code_localsplusnames, o.co_localsplusnames, "co_localsplusnames", d);
    take(l.ob_type, o.ob_type, "ob_type", d);
    take(l.tp_name, o.tp_name, "tp_name", d);
    take(l.tp_flags, o.tp_flags, "tp_flags", d);
    take(l.tuple_items, o.tu_ob_item, "tuple ob_item", d);
    take(l.unicode_state, o.un_state, "unicode state", d);
    take(l.unicode_length, o.un_length, "unicode length", d);
    take(l.unicode_ascii_data, o.un_asciiobject_size, "compact ASCII data", d);
    d.info.debug_offsets = true;
    status = Status::supported;
    return true;
}

}  // namespace commdbg::python::discovery
