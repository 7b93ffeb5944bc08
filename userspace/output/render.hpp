// SPDX-License-Identifier: Apache-2.0
// Outputs of one tracing window: a CommDebugMode-style table (noise levels),
// the JSON dump, and a Chrome/Perfetto trace.  Pure functions of snapshots
// (snapshot.hpp, ProcessSnapshot) and the symbol table: presentation only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.hpp"
#include "record_facts.hpp"
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

std::string render_table(const ProcessSnapshot& p, const SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel, bool color = false);

// Single process: the CommDebugMode-style object.  Several: {"processes": [...]}
// ordered by pid; exactly one: the single-process object itself.
nlohmann::ordered_json to_json(const ProcessSnapshot& p, const SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);
nlohmann::ordered_json to_json(const std::vector<ProcessSnapshot>& ps, const SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);

// The same as to_json(ps, ...) with `extra`'s keys added at the top level,
// dump(2)'d -- byte for byte -- but built one top-level record at a time:
// the tree as a json value holds several times the memory of its text
// (bench_model prints both per record: "render ... --json").
std::string to_json_text(const std::vector<ProcessSnapshot>& ps, const SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel,
                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// Chrome trace event format ({"traceEvents": [...]}), loadable in Perfetto.
nlohmann::json chrome_trace(const std::vector<ProcessSnapshot>& ps, const SymbolTable& syms);
// chrome_trace(ps, syms).dump(), written one event at a time.
std::string chrome_trace_text(const std::vector<ProcessSnapshot>& ps, const SymbolTable& syms);

// Shared by the renderers (and, for session output, by session/).
namespace render_parts {
using commdbg::find_comm;
// The same as record_name / record_layer (record_facts.hpp), for context
// records too: a scope's label, a module's path (layer "python"); the tree
// holds their names.
std::string_view record_name(const Record& r, const ProcessSnapshot& p, const SymbolTable& syms);
std::string_view record_layer(const Record& r, const ProcessSnapshot& p, const SymbolTable& syms);
using commdbg::record_name;
using commdbg::record_layer;
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
std::vector<const ProcessSnapshot*> by_pid(const std::vector<ProcessSnapshot>& ps);
// The counters in output order: stable by (symbol name, comm, dtype).
std::vector<const CounterRow*> sorted_counters(const ProcessSnapshot& p, const SymbolTable& syms);
// The fields of a record (call_fields: "collective", "group_size", "comm", ...;
// a module's "module_fqn", ...), shared by the JSON dump and the trace's args;
// instantiated for both json types.
template <typename Json>
void collective_json(const Record& r, const ProcessSnapshot& p, const SymbolTable& syms, Json& o);
}  // namespace render_parts

}  // namespace commdbg
