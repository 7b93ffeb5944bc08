// SPDX-License-Identifier: Apache-2.0
// Finds the CPython interpreter a live process runs and the layout a frame
// walker needs, from the target itself: the version from its binary, the
// autoTSSkey location decoded from PyGILState_GetThisThreadState, code-object
// offsets from PyCode_Type.tp_members, _Py_DebugOffsets on 3.13, glibc's key
// slots decoded from the target's own pthread_getspecific.  Nothing is taken
// on trust: a build that does not match the verified table is unsupported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "x86_decode.hpp"

namespace commdbg::python {

// An offset the version does not have (3.10 has no frame owner, ...).
inline constexpr uint32_t kPyNoOffset = 0xFFFFFFFFu;

// Everything a BPF frame walker needs, fixed-width so it can go into a map
// as is.  Addresses are in the target's address space (load bias applied).
struct PyLayout {
    uint64_t runtime_addr = 0;    // &_PyRuntime
    uint64_t key_addr = 0;        // the autoTSSkey's pthread_key_t (an int)
    uint64_t code_type_addr = 0;  // &PyCode_Type: a frame's code object has this ob_type
    uint64_t none_addr = 0;       // &_Py_NoneStruct (3.13 frames with no code point here)
    uint64_t cell_type_addr = 0;  // &PyCell_Type: a `self` captured by a closure is a cell; 0: not exported
    uint32_t version_hex = 0;     // PY_VERSION_HEX, e.g. 0x030B02F0
    uint32_t key = 0;             // autoTSSkey's value, read from the target

    // glibc: tstate = *(fsbase + tls_base + tls_stride * key + tls_data), key < tls_keys.
    uint32_t tls_base = 0;
    uint32_t tls_stride = 0;
    uint32_t tls_data = 0;
    uint32_t tls_keys = 0;

    // Thread state.  top frame: f = *(ts + ts_frame); when ts_frame_inner is
    // not kPyNoOffset (3.11 / 3.12's cframe) f = *(f + ts_frame_inner).
    uint32_t ts_frame = 0;
    uint32_t ts_frame_inner = kPyNoOffset;
    uint32_t ts_thread_id = 0;  // pthread_self(), == fsbase
    uint32_t ts_native_thread_id = kPyNoOffset;
    uint32_t ts_next = 0;
    uint32_t rt_interpreters_head = 0;  // in _PyRuntime
    uint32_t interp_threads_head = 0;   // in PyInterpreterState

    // Frames (3.10: PyFrameObject, later: _PyInterpreterFrame).
    uint32_t frame_code = 0;
    uint32_t frame_previous = 0;
    uint32_t frame_localsplus = 0;
    uint32_t frame_owner = kPyNoOffset;  // a char; 3.12+ skip owner == frame_owner_cstack
    uint32_t frame_instr = 0;            // 3.10: int f_lasti, later: instruction pointer
    uint32_t frame_owner_cstack = kPyNoOffset;

    // Code objects: from PyCode_Type.tp_members, checked against the table.
    uint32_t code_argcount = 0;
    uint32_t code_flags = 0;
    uint32_t code_firstlineno = 0;
    uint32_t code_localsplusnames = 0;  // co_varnames on 3.10
    uint32_t code_filename = 0;
    uint32_t code_name = 0;
    uint32_t code_qualname = kPyNoOffset;  // 3.11+

    // Objects, strings, containers.
    uint32_t ob_type = 0;
    uint32_t tp_name = 0;
    uint32_t tp_flags = 0;
    uint32_t tuple_items = 0;
    uint32_t cell_contents = 0;
    uint32_t unicode_length = 0;
    uint32_t unicode_state = 0;
    uint32_t unicode_ascii_data = 0;
    uint32_t unicode_compact_data = 0;

    uint8_t major = 0;
    uint8_t minor = 0;
    uint8_t skip_none_code = 0;  // 3.13: skip frames whose code is &_Py_NoneStruct
    uint8_t tls_derived = 0;     // 1: decoded from the target's libc; 0: glibc 2.36 default
    // 3.11+: tstate.datastack_chunk, datastack_top and datastack_limit after it.
    uint32_t ts_datastack = kPyNoOffset;
};
static_assert(sizeof(PyLayout) % 8 == 0, "PyLayout: a BPF map value with no tail padding");

// Where the interpreter was found and how.
struct PyRuntimeInfo {
    std::string file;         // the ELF holding _PyRuntime, as the target sees it
    std::string open_path;    // where this process read it (through /proc/PID/root)
    uint64_t load_bias = 0;   // 0 for a non-PIE executable
    bool shared_library = false;  // libpython3.X.so rather than the executable
    std::string version;      // "3.11.2" (from Py_Version), "3.10" (file name only)
    uint64_t tss_addr = 0;    // the Py_tss_t holding the key (key_addr - 4)
    bool debug_offsets = false;   // 3.13: offsets taken from _Py_DebugOffsets
};

struct PyDiscovery {
    enum class Status {
        supported,    // layout is filled and checked
        not_python,   // no CPython in the process
        unsupported,  // a CPython we cannot walk (version, free-threaded, layout mismatch)
        error,        // the process went away, cannot be read, ...
    };
    Status status = Status::error;
    std::string reason;              // empty when supported: what failed and what to do
    std::vector<std::string> notes;  // caveats of a supported result
    PyRuntimeInfo info;
    PyLayout layout;
    bool ok() const { return status == Status::supported; }
};

// Discovers the CPython of `pid`.  Reads its memory with host::ProcessMemory
// (root, or the same uid with ptrace access) and its files through
// <proc_root>/PID/root.  Never throws for anything the target does.
PyDiscovery discover_python(int pid, const std::string& proc_root = "/proc");

// What the bounded x86-64 decoders (x86_decode.hpp) say of CPython's key and
// glibc's slots, in discovery's words; exposed for tests on synthetic bytes
// (an error message, or empty).
struct KeyLoad {
    bool via_got = false;     // the code loads &_PyRuntime from a GOT slot first
    uint64_t got_slot = 0;    // link-time address of that slot (via_got)
    uint64_t target = 0;      // link-time address (direct) or offset from _PyRuntime (via_got)
    bool is_tss_pointer = false;  // target is a Py_tss_t*, the key is at +4
    bool absolute = false;    // target came as an immediate: valid only where the ELF is not relocated
};
// Decodes the instructions of PyGILState_GetThisThreadState at link-time
// address `vaddr`; an error names the first byte it does not know.
Result<KeyLoad> decode_key_load(const std::vector<uint8_t>& code, uint64_t vaddr);

using TlsSlots = arch::TlsSlots;

}  // namespace commdbg::python
