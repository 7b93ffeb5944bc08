// SPDX-License-Identifier: Apache-2.0
// Every thread's Python stack, read now from userspace, as `py-spy dump`
// does: the interpreter's thread states from _PyRuntime, each one's frames
// innermost first.  The layout is the walker's own (python_runtime.hpp: found
// in the target's files and checked); the frames are what the kernel's walk
// produces (cd_py_frame), so one resolver names both.  The target is never
// stopped: a thread may move while it is read, and a frame that cannot be
// read ends its stack (`fault`), never a guessed one.
#pragma once

#include <cstdint>
#include <vector>

#include "events.h"
#include "python_runtime.hpp"
#include "remote_memory.hpp"
#include "result.hpp"

namespace commdbg::python {

struct PyThreadStack {
    uint64_t tstate = 0;      // the PyThreadState's address
    uint64_t pthread = 0;     // its thread_id: the thread's pthread_t
    uint32_t native_tid = 0;  // the kernel's thread id; 0: this build's thread state has none
    std::vector<cd_py_frame> frames;  // innermost first
    bool truncated = false;   // more frames than asked for
    bool fault = false;       // a frame could not be read: the stack ends there
};

struct PyThreadLimits {
    size_t max_threads = 1024;
    size_t max_frames = CD_MAX_PY_FRAMES;
};

// The main interpreter's threads, in its list's order (newest first).
// Fails when _PyRuntime or the list cannot be read.
Result<std::vector<PyThreadStack>> read_thread_stacks(host::RemoteMemory& mem, const PyLayout& l,
                                                      PyThreadLimits limits = {});

}  // namespace commdbg::python
