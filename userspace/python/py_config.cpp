// SPDX-License-Identifier: Apache-2.0
#include "py_config.hpp"

#include <algorithm>

namespace commdbg::python {

Result<cd_py_cfg> py_walk_config(const PyLayout& l, uint32_t max_frames) {
    using R = Result<cd_py_cfg>;
    if (l.tls_stride == 0 || l.key >= l.tls_keys)
        return R::fail("its autoTSSkey (" + std::to_string(l.key) +
                       ") is past glibc's first block of thread-specific slots, which the kernel-side walker "
                       "reads; stacks are not captured for it");
    cd_py_cfg c{};
    c.cell_type = l.cell_type_addr;
    c.none_addr = l.none_addr;
    c.key = l.key;
    c.tls_base = l.tls_base;
    c.tls_stride = l.tls_stride;
    c.tls_data = l.tls_data;
    c.ts_frame = l.ts_frame;
    c.ts_frame_inner = l.ts_frame_inner;
    c.ts_thread_id = l.ts_thread_id;
    c.frame_code = l.frame_code;
    c.frame_previous = l.frame_previous;
    c.frame_localsplus = l.frame_localsplus;
    // Only 3.12+ have C-stack frames to skip; 3.11's owner byte means other things.
    c.frame_owner = l.frame_owner_cstack == kPyNoOffset ? kPyNoOffset : l.frame_owner;
    c.frame_owner_cstack = l.frame_owner_cstack;
    c.frame_instr = l.frame_instr;
    c.ob_type = l.ob_type;
    c.cell_contents = l.cell_contents;
    c.max_frames = std::clamp<uint32_t>(max_frames, 1, CD_MAX_PY_FRAMES);
    if (l.skip_none_code) c.flags |= CD_PYCFG_SKIP_NONE_CODE;
    if (l.major == 3 && l.minor == 10) c.flags |= CD_PYCFG_LASTI_INT;
    c.str_length = l.unicode_length;
    c.str_state = l.unicode_state;
    c.str_ascii_data = l.unicode_ascii_data;

    // The thread state in one read; the data stack's three words with it.
    c.ts_stack = l.ts_datastack;
    uint32_t lo = std::min(l.ts_frame, l.ts_thread_id), hi = std::max(l.ts_frame, l.ts_thread_id) + 8;
    if (c.ts_stack != kPyNoOffset) lo = std::min(lo, c.ts_stack), hi = std::max(hi, c.ts_stack + 24);
    if (hi - lo > CD_PY_TS_WINDOW)
        return R::fail("its thread state's fields span " + std::to_string(hi - lo) + " bytes, more than the " +
                       std::to_string(CD_PY_TS_WINDOW) + " the kernel-side walker reads; stacks are not captured for it");
    c.ts_lo = lo, c.ts_span = hi - lo;

    // A frame's fields are loaded from one window (3.10's localsplus
    // is past it: read apart).
    uint32_t span = std::max({l.frame_code, l.frame_previous, l.frame_instr}) + 8;
    if (l.frame_owner != kPyNoOffset) span = std::max(span, l.frame_owner + 1);
    if (l.frame_localsplus + 8 <= CD_PY_FRAME_WINDOW) span = std::max(span, l.frame_localsplus + 8);
    if (span > CD_PY_FRAME_WINDOW)
        return R::fail("its frames' fields span " + std::to_string(span) + " bytes, more than the " +
                       std::to_string(CD_PY_FRAME_WINDOW) + " the kernel-side walker reads; stacks are not captured for it");
    c.frame_span = span;
    return c;
}

}  // namespace commdbg::python
