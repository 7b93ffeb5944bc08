// SPDX-License-Identifier: Apache-2.0
// Outputs of one tracing window: a CommDebugMode-style table (noise levels),
// the JSON dump, and a Chrome/Perfetto trace.  Pure functions of snapshots
// (snapshot.hpp, ProcessReport) and the symbol table: presentation only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.hpp"
#include "snapshot.hpp"
#include "symbol_table.hpp"

namespace commdbg {

// Noise levels (CommDebugMode's idea, our layers):
//   0 collectives (and communicator lifecycle) only
//   1 + framework ops (default)
//   2 + module annotations, record_function scopes, nn.Module calls and
//       where in the Python code each record was made
//   3 + trivial ops (views, detach, copies, allocations: see is_trivial_op)
// A hidden record's visible children move up to its level.
inline constexpr int kDefaultNoiseLevel = 1;
bool is_trivial_op(std::string_view name);
bool record_visible(const Record& r, const SymbolTable& syms, int noise_level);

std::string render_table(const ProcessReport& p, const SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel, bool color = false);

// Single process: the CommDebugMode-style object.  Several: {"processes": [...]}
// ordered by pid; exactly one: the single-process object itself.
nlohmann::ordered_json to_json(const ProcessReport& p, const SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);
nlohmann::ordered_json to_json(const std::vector<ProcessReport>& ps, const SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);

// The same as to_json(ps, ...) with `extra`'s keys added at the top level,
// dump(2)'d -- byte for byte -- but built one top-level record at a time:
// the tree as a json value holds several times the memory of its text
// (bench_model prints both per record: "render ... --json").
std::string to_json_text(const std::vector<ProcessReport>& ps, const SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel,
                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// Chrome trace event format ({"traceEvents": [...]}), loadable in Perfetto.
nlohmann::json chrome_trace(const std::vector<ProcessReport>& ps, const SymbolTable& syms);
// chrome_trace(ps, syms).dump(), written one event at a time.
std::string chrome_trace_text(const std::vector<ProcessReport>& ps, const SymbolTable& syms);

// Shared by the renderers.
namespace report_detail {
// A wait status (from waitpid or the kernel's task->exit_code) as a person
// reads it: the exit status of exit(N), or the signal that killed it.
struct ExitInfo {
    std::optional<int> code;    // exited normally: its status, 0..255
    std::optional<int> signal;  // killed by this signal
    bool core_dumped = false;
};
ExitInfo decode_exit(int wait_status);
// "exited with status 3", "killed by SIGKILL (signal 9)".
std::string describe_exit(const ExitInfo& e);
using commdbg::find_comm;
std::string hex(uint64_t v);          // "0x1a2b"
std::string hex16(uint64_t v);        // "0x%016x"
std::string dtype_name(uint32_t dtype);  // "float32" or "dtype(N)"
std::optional<uint64_t> record_bytes(const Record& r);
// Elements in / out of one rank's call; nullopt where nranks would be needed
// and is unknown.
struct Elements {
    uint64_t in = 0, out = 0;
};
std::optional<Elements> record_elements(const Record& r, int32_t nranks);
std::string_view record_name(const Record& r, const SymbolTable& syms);
std::string_view record_layer(const Record& r, const SymbolTable& syms);
// The same, for context records too: a scope's label, a module's path (layer
// "python"); the tree holds their names.
std::string_view record_name(const Record& r, const ProcessReport& p, const SymbolTable& syms);
std::string_view record_layer(const Record& r, const ProcessReport& p, const SymbolTable& syms);
// The record's Python stack as "py_stack" (innermost first, [] for a thread
// without Python), with "py_stack_truncated" / "py_stack_partial" when so;
// nothing when the record captured none.  Instantiated for both json types.
template <typename Json>
void py_stack_json(const Record& r, const ProcessTree& t, Json& o);
// "FILE:LINE QUALNAME" of the innermost frame of the record's stack that is
// not the runtime's or torch's own; "" when none.
std::string py_location(const Record& r, const ProcessTree& t);
cd_role record_role(const Record& r, const SymbolTable& syms);  // CD_ROLE_OTHER if unknown
// ncclCommInitAll: its "nranks" slot is the device count (shown as ndev).
bool is_init_all(const Record& r, const SymbolTable& syms);
// The processes in output order: by pid (stable).
std::vector<const ProcessReport*> by_pid(const std::vector<ProcessReport>& ps);
// The counters in output order: stable by (symbol name, comm, dtype).
std::vector<const CounterRow*> sorted_counters(const ProcessReport& p, const SymbolTable& syms);
// The fields of a record (call_fields: "collective", "group_size", "comm", ...;
// a module's "module_fqn", ...), shared by the JSON dump and the trace's args;
// instantiated for both json types.
template <typename Json>
void collective_json(const Record& r, const ProcessReport& p, const SymbolTable& syms, Json& o);
}  // namespace report_detail

}  // namespace commdbg
