// SPDX-License-Identifier: Apache-2.0
#include "python_support.hpp"

#include <utility>

namespace commdbg::python {

namespace {

std::string no_stacks(uint32_t pid, const std::string& why) {
    return "no Python stacks for pid " + std::to_string(pid) + ": " + why;
}

}  // namespace

PythonSupport::PythonSupport(PyMaps& maps, PySupportOptions opts, Discover discover)
    : maps_(maps), opts_(opts), discover_(std::move(discover)) {
    if (!discover_) discover_ = [](int pid) { return discover_python(pid); };
}

// Python stacks need the interpreter initialised (its thread-state key set):
// tried at attach and at each loader change (an import loads a C extension
// soon after start), a bounded number of times.
std::optional<std::string> PythonSupport::setup(uint32_t pid) {
    if (!opts_.stacks) return std::nullopt;
    PyProcess& p = procs_[pid];
    if (p.ready || p.tries >= kMaxTries) return std::nullopt;
    ++p.tries;
    PyDiscovery d = discover_(static_cast<int>(pid));
    if (d.status == PyDiscovery::Status::not_python) return std::nullopt;
    if (!d.ok()) {
        // Not initialised yet (a `run` that starts the interpreter): later.
        const bool unsupported = d.status == PyDiscovery::Status::unsupported;
        const bool last = p.tries == kMaxTries || unsupported;
        if (unsupported) p.tries = kMaxTries;
        return last ? std::optional(no_stacks(pid, d.reason)) : std::nullopt;
    }
    return configure(pid, p, d);
}

// The walker's config from a discovery, written where the kernel reads it.
std::optional<std::string> PythonSupport::configure(uint32_t pid, PyProcess& p, const PyDiscovery& d) {
    auto cfg = py_walk_config(d.layout, opts_.depth);
    maps_.write_code_kinds(pid, nullptr);  // what an earlier image of the pid taught
    if (cfg) {
        if (auto set = maps_.write_config(pid, *cfg); !set) cfg = Result<cd_py_cfg>::fail(set.error());
    }
    if (!cfg) {
        p.tries = kMaxTries;
        return no_stacks(pid, cfg.error());
    }
    resolver_.adopt(pid, d);
    p.cfg = *cfg;
    p.ready = true;
    return std::nullopt;
}

void PythonSupport::retrace(uint32_t pid) {
    auto it = procs_.find(pid);
    if (it != procs_.end() && it->second.ready) (void)maps_.write_config(pid, it->second.cfg);
}

// torch 1.13 keeps a scope's label only in its Python record_function: once
// a scope's stack shows that class, the kernel is told where instances keep
// `name`, and reads it at every later scope's begin (events.h, rf_type).
void PythonSupport::learn_scope_label(uint32_t pid, std::span<const cd_py_frame> frames) {
    auto it = procs_.find(pid);
    if (it == procs_.end()) return;
    PyProcess& p = it->second;
    if (!p.ready || p.cfg.rf_type || p.label_tries >= kMaxLabelTries) return;
    for (size_t i = 0; i < frames.size() && i < CD_SCOPE_LABEL_FRAMES; ++i) {
        const cd_py_frame& f = frames[i];
        if (resolver_.frame(pid, f).kind != PyFrameKind::RecordFunctionEnter) continue;
        ++p.label_tries;
        auto idx = resolver_.values_index(pid, f.self_type, "name");
        if (!idx) return;
        cd_py_cfg cfg = p.cfg;
        cfg.rf_type = f.self_type;
        cfg.rf_name_index = *idx;
        if (maps_.write_config(pid, cfg)) p.cfg = cfg;
        return;
    }
}

// What the batch's frames taught of code objects goes to the kernel, for the
// processes it walks (a process is told nothing before its config is set).
void PythonSupport::tell_code_kinds() {
    resolver_.take_code_tables([&](uint32_t pid, const cd_py_codes& t) {
        auto it = procs_.find(pid);
        if (it != procs_.end() && it->second.ready && !it->second.exited) maps_.write_code_kinds(pid, &t);
    });
}

void PythonSupport::exited(uint32_t pid) { procs_[pid].exited = true; }

void PythonSupport::withhold(uint32_t pid) {
    maps_.clear(pid);
    resolver_.forget(pid);
    if (auto it = procs_.find(pid); it != procs_.end()) it->second.ready = false;
}

void PythonSupport::new_image(uint32_t pid) {
    maps_.clear(pid);
    resolver_.forget(pid);
    procs_.erase(pid);
}

void PythonSupport::forget(uint32_t pid) {
    resolver_.drop_stats(pid);
    procs_.erase(pid);
}

const PyProcess* PythonSupport::process(uint32_t pid) const {
    auto it = procs_.find(pid);
    return it == procs_.end() ? nullptr : &it->second;
}

}  // namespace commdbg::python
