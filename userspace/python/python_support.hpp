// SPDX-License-Identifier: Apache-2.0
// Python stacks for one session's processes, in one place: each process's
// interpreter is discovered (a bounded number of tries: it may not be
// initialised yet), the kernel's frame walker is configured for it, taught
// where torch 1.13's record_function keeps its label, and told the kinds of
// the code objects its records ran.  In the OpenTelemetry profiler's terms,
// discover_python is the loader, a PyDiscovery the data and a PyProcess the
// per-process instance.  The kernel's maps are reached only through PyMaps,
// so all of it runs without BPF (tests/unit/test_python_support.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "events.h"
#include "py_config.hpp"
#include "py_objects.hpp"
#include "python_runtime.hpp"
#include "result.hpp"

namespace commdbg::python {

// The kernel's per-process Python maps: all PythonSupport writes.  The
// session implements it over its BPF object; tests record the writes.
class PyMaps {
public:
    virtual ~PyMaps() = default;
    // How the kernel walks pid's frames, and the trace flag that makes it look.
    virtual Result<bool> write_config(uint32_t pid, const cd_py_cfg& cfg) = 0;
    // The kinds of pid's code objects (py_code_table.hpp); null: none, every
    // frame's type is read.
    virtual void write_code_kinds(uint32_t pid, const cd_py_codes* codes) = 0;
    // Neither of them any more (the process exited or is withheld).
    virtual void clear(uint32_t pid) = 0;
};

// What PythonSupport knows of one process.
struct PyProcess {
    bool ready = false;        // the kernel walks its frames with cfg
    uint32_t tries = 0;        // discoveries tried without success (kMaxTries: given up)
    cd_py_cfg cfg{};           // what the kernel walks it with (ready)
    uint32_t label_tries = 0;  // looking for its record_function type (torch 1.13)
    bool exited = false;       // nothing more is told of it
};

struct PySupportOptions {
    bool stacks = true;                     // false: nothing discovered or written (--py-stack off, no records)
    uint32_t depth = CD_DEFAULT_PY_FRAMES;  // frames walked per record, innermost first
};

class PythonSupport {
public:
    using Discover = std::function<PyDiscovery(int pid)>;
    static constexpr uint32_t kMaxTries = 16;      // discoveries of one process
    static constexpr uint32_t kMaxLabelTries = 4;  // record_function frames looked into

    // `discover` stands in for discover_python (tests hand it synthetic results).
    PythonSupport(PyMaps& maps, PySupportOptions opts, Discover discover = {});
    PythonSupport(const PythonSupport&) = delete;
    PythonSupport& operator=(const PythonSupport&) = delete;

    bool stacks() const { return opts_.stacks; }
    // Names the frames of records as they arrive (the record model's resolver).
    LivePyResolver& resolver() { return resolver_; }
    const LivePyResolver& resolver() const { return resolver_; }

    // Tried at attach and at each loader change, until the kernel walks the
    // process or kMaxTries.  A note for its report when stacks are given up.
    std::optional<std::string> setup(uint32_t pid);
    // pid was traced anew, its kernel flags rewritten: its config again.
    void retrace(uint32_t pid);
    // A scope began without a label, with these frames: torch 1.13's.
    void learn_scope_label(uint32_t pid, std::span<const cd_py_frame> frames);
    // A new batch of records (resolver's begin_batch); after it, what the
    // batch taught of code objects goes to the kernel.
    void begin_batch() { resolver_.begin_batch(); }
    void tell_code_kinds();

    // pid exited: nothing more is told of it (the kernel's exit event
    // clears its maps: clear).
    void exited(uint32_t pid);
    void clear(uint32_t pid) { maps_.clear(pid); }
    // Its owner may no longer read it: the kernel's maps and the resolver's
    // caches of it go, and it is not walked.
    void withhold(uint32_t pid);
    // The session forgets pid: its state and its cache losses.
    void forget(uint32_t pid);
    // pid exec'd: what its old image taught (set up at its fork, from its
    // parent's) goes, here and in the kernel; the new image is set up as a
    // new process is, at its loader changes.
    void new_image(uint32_t pid);

    // nullptr: never set up (or forgotten).
    const PyProcess* process(uint32_t pid) const;

private:
    std::optional<std::string> configure(uint32_t pid, PyProcess& p, const PyDiscovery& d);

    PyMaps& maps_;
    PySupportOptions opts_;
    Discover discover_;
    LivePyResolver resolver_;
    std::map<uint32_t, PyProcess> procs_;
};

}  // namespace commdbg::python
