// SPDX-License-Identifier: Apache-2.0
// Built-in specs as they were before a change that cut their cost, written
// from the source tree's spec files to /tmp, so that a benchmark runs the
// old and the new in the same run (`--probes` takes spec files).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace commdbg::bench {

namespace fs = std::filesystem;

// torch-scopes as it was before torch 2.x's scopes were closed at
// record_function_exit_new: every at::RecordFunction's constructor and end()
// probed, on every build.  Written from the source tree's spec (its rules
// without a file condition, and those "unless_file" without it); the path.
inline std::string every_record_function_spec(const fs::path& src) {
    std::ifstream in(src / "specs/torch-scopes.json");
    nlohmann::json spec = nlohmann::json::parse(in);
    nlohmann::json rules = nlohmann::json::array();
    for (auto r : spec["symbols"]) {
        if (r.contains("if_file")) continue;
        r.erase("unless_file");
        rules.push_back(r);
    }
    spec["name"] = "torch-scopes-every-record-function";
    spec["symbols"] = rules;
    const std::string path = "/tmp/bench_tp.every-record-function.json";
    std::ofstream(path) << spec.dump();
    return path;
}

// torch-modules as it was before its probe moved into the dispatcher of
// torch._C._get_tracing_state: getTracingState() itself in libtorch_cpu,
// which torch 2.x's Python bindings also call at every op they dispatch.
// Written from the source tree's spec; the path.
inline std::string module_entry_at_get_tracing_state_spec(const fs::path& src) {
    std::ifstream in(src / "specs/torch-modules.json");
    nlohmann::json spec = nlohmann::json::parse(in);
    spec["name"] = "torch-modules-at-get-tracing-state";
    spec["library"] = {"libtorch_cpu.so", "libtorch_cpu.so.*"};
    spec["symbols"] = nlohmann::json::array(
        {{{"glob", "torch::jit::tracer::getTracingState()"}, {"role", spec["symbols"][0]["role"]}}});
    const std::string path = "/tmp/bench_tp.module-entry-at-get-tracing-state.json";
    std::ofstream(path) << spec.dump();
    return path;
}

}  // namespace commdbg::bench
