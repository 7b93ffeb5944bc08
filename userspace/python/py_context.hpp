// SPDX-License-Identifier: Apache-2.0
// What the record model needs to know of a Python frame the kernel captured
// (events.h, cd_py_frame): its names, and whether it is an nn.Module call, a
// record_function enter or the autograd engine's entry.  The model asks a
// PyContextResolver; the live implementation (py_objects.hpp) reads the
// target's memory, tests hand the model a fake.  Resolution happens when the
// record is ingested, while the code objects and modules most likely live.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "events.h"

namespace commdbg::python {

// What a frame is, for nesting.
enum class PyFrameKind : uint8_t {
    Plain = 0,
    ModuleCall,           // nn.Module._call_impl / _wrapped_call_impl: `self` is the module
    RecordFunctionEnter,  // torch.autograd.profiler.record_function.__enter__: label = self.name
    BackwardEntry,        // the autograd engine's entry from Python (_engine_run_backward,
                          // Variable._execution_engine.run_backward's caller): frames above
                          // it run on behalf of gradients
    FunctionApply,        // torch.autograd.function.BackwardCFunction.apply: `self` is the
                          // autograd node of a Python autograd.Function, whose type torch
                          // names "<Function>Backward" (grad_fn.name()); label = that name
};

struct PyFrameInfo {
    std::string qualname = "<unknown>";  // co_qualname (3.10: co_name); "<unknown>": freed or unreadable
    std::string file;                    // co_filename
    uint32_t line = 0;                   // the current line where cheap, else co_firstlineno; 0: unknown
    bool known = false;                  // the code object was read and validated
    PyFrameKind kind = PyFrameKind::Plain;
    // `self` of the frame when its first local is an nn.Module instance
    // (ModuleCall frames, and methods of modules such as hooks): 0 otherwise.
    uint64_t module = 0;
    std::string module_class;  // the module's type name ("Linear"), when module != 0
    std::string label;         // RecordFunctionEnter: the record_function's name; FunctionApply: the node's class
    // A file of the Python runtime or of torch itself (not user code): the
    // table shows the innermost frame that is not.
    bool library = false;
};

class PyContextResolver {
public:
    virtual ~PyContextResolver() = default;
    // Never throws; a frame that cannot be read resolves to "<unknown>".
    // The reference stays valid until forget(pid).
    virtual const PyFrameInfo& frame(uint32_t pid, const cd_py_frame& f) = 0;
    // A record's stack (thread `tid`'s), frame by frame as frame() names
    // them, into `out`.  The result: 0, or a serial that another call
    // returns only with the very same frames in `out` (a resolver that knows
    // a thread's stack did not change says so, and its users skip work).
    virtual uint64_t stack(uint32_t pid, uint32_t tid, std::span<const cd_py_frame> raw,
                           std::vector<const PyFrameInfo*>& out) {
        (void)tid;
        out.clear();
        for (const cd_py_frame& f : raw) out.push_back(&frame(pid, f));
        return 0;
    }
    // The dotted attribute path from `root` to `module` through the
    // modules' `_modules` dicts ("encoder.blocks.1.mixer"); "" when module
    // is root; nullopt when it cannot be found or read.
    virtual std::optional<std::string> module_path(uint32_t pid, uint64_t root, uint64_t module) = 0;
    // The process exited: drop what is cached for it.
    virtual void forget(uint32_t pid) = 0;
};

}  // namespace commdbg::python
