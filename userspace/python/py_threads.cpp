// SPDX-License-Identifier: Apache-2.0
#include "py_threads.hpp"

#include <cerrno>
#include <cstring>
#include <string>

namespace commdbg::python {

namespace {

// The frames of one thread, as bpf/python/walk.h walks them: the C-stack
// trampolines (owner == cstack) and 3.13's frames with no code are skipped.
void walk(host::RemoteMemory& mem, const PyLayout& l, uint64_t frame, PyThreadStack& out, size_t max_frames) {
    // A frame list that loops (a thread moving under the read) ends at the bound.
    for (size_t seen = 0; frame != 0; ++seen) {
        if (out.frames.size() >= max_frames || seen >= 4 * max_frames) {
            out.truncated = true;
            return;
        }
        uint64_t code = 0, previous = 0;
        if (!mem.get(frame + l.frame_code, code) || !mem.get(frame + l.frame_previous, previous)) {
            out.fault = true;
            return;
        }
        const uint64_t here = frame;
        frame = previous;
        if (l.frame_owner != kPyNoOffset && l.frame_owner_cstack != kPyNoOffset) {
            uint8_t owner = 0;
            if (!mem.get(here + l.frame_owner, owner)) {
                out.fault = true;
                return;
            }
            if (owner == l.frame_owner_cstack) continue;
        }
        if (code == 0 || (l.skip_none_code && code == l.none_addr)) continue;
        cd_py_frame f{};
        f.code = code;
        if (l.major == 3 && l.minor == 10) {
            int32_t lasti = 0;
            if (mem.get(here + l.frame_instr, lasti)) f.instr = static_cast<uint64_t>(static_cast<int64_t>(lasti));
        } else {
            mem.get(here + l.frame_instr, f.instr);
        }
        mem.get(here + l.frame_localsplus, f.self);
        if (f.self && !mem.get(f.self + l.ob_type, f.self_type)) f.self_type = 0;
        if (f.self_type && l.cell_type_addr && f.self_type == l.cell_type_addr) {
            uint64_t contents = 0;
            f.self_type = 0;
            if (mem.get(f.self + l.cell_contents, contents) && contents) {
                f.self = contents;
                if (!mem.get(contents + l.ob_type, f.self_type)) f.self_type = 0;
            }
        }
        out.frames.push_back(f);
    }
}

std::string read_error(const host::RemoteMemory& mem, const char* what) {
    return std::string("cannot read the interpreter's ") + what + ": " + std::strerror(mem.last_error());
}

}  // namespace

Result<std::vector<PyThreadStack>> read_thread_stacks(host::RemoteMemory& mem, const PyLayout& l,
                                                      PyThreadLimits limits) {
    using R = Result<std::vector<PyThreadStack>>;
    uint64_t interp = 0, ts = 0;
    if (!mem.get(l.runtime_addr + l.rt_interpreters_head, interp) || interp == 0)
        return R::fail(read_error(mem, "list (_PyRuntime.interpreters.head)"));
    if (!mem.get(interp + l.interp_threads_head, ts))
        return R::fail(read_error(mem, "thread list (interpreters.head->threads.head)"));
    std::vector<PyThreadStack> out;
    while (ts != 0 && out.size() < limits.max_threads) {
        PyThreadStack t;
        t.tstate = ts;
        uint64_t next = 0, frame = 0;
        if (!mem.get(ts + l.ts_next, next) || !mem.get(ts + l.ts_frame, frame)) {
            t.fault = true;
            out.push_back(std::move(t));
            break;  // the list itself is unreadable past here
        }
        mem.get(ts + l.ts_thread_id, t.pthread);
        if (l.ts_native_thread_id != kPyNoOffset) {
            uint64_t tid = 0;
            if (mem.get(ts + l.ts_native_thread_id, tid)) t.native_tid = static_cast<uint32_t>(tid);
        }
        if (frame && l.ts_frame_inner != kPyNoOffset && !mem.get(frame + l.ts_frame_inner, frame))
            t.fault = true;
        else
            walk(mem, l, frame, t, limits.max_frames);
        out.push_back(std::move(t));
        for (const PyThreadStack& seen : out)
            if (seen.tstate == next) next = 0;  // a list that loops
        ts = next;
    }
    return out;
}

}  // namespace commdbg::python
