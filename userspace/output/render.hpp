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

namespace commdbg::output {

// Noise levels (CommDebugMode's idea, our layers):
//   0 collectives (and communicator lifecycle) only
//   1 + framework ops (default)
//   2 + module annotations, record_function scopes, nn.Module calls and
//       where in the Python code each record was made
//   3 + trivial ops (views, detach, copies, allocations: see is_trivial_op)
// A hidden record's visible children move up to its level.
inline constexpr int kDefaultNoiseLevel = 1;
bool is_trivial_op(std::string_view name);
bool record_visible(const model::Record& r, const capture::SymbolTable& syms, int noise_level);

std::string render_table(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel, bool color = false);

// Single process: the CommDebugMode-style object.  Several: {"processes": [...]}
// ordered by pid; exactly one: the single-process object itself.
nlohmann::ordered_json to_json(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);
nlohmann::ordered_json to_json(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms,
                               int noise_level = kDefaultNoiseLevel);

// The same as to_json(ps, ...) with `extra`'s keys added at the top level,
// dump(2)'d -- byte for byte -- but built one top-level record at a time:
// the tree as a json value holds several times the memory of its text
// (bench_model prints both per record: "render ... --json").
std::string to_json_text(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms,
                         int noise_level = kDefaultNoiseLevel,
                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// Chrome trace event format ({"traceEvents": [...]}), loadable in Perfetto.
nlohmann::json chrome_trace(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms);
// chrome_trace(ps, syms).dump(), written one event at a time.
std::string chrome_trace_text(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms);

// Shared by the renderers (and, for session output, by session/).
namespace render_parts {
using snapshot::find_comm;
// The same as record_name / record_layer (record_facts.hpp), for context
// records too: a scope's label, a module's path (layer "python"); the tree
// holds their names.
std::string_view record_name(const model::Record& r, const snapshot::ProcessSnapshot& p,
                             const capture::SymbolTable& syms);
std::string_view record_layer(const model::Record& r, const snapshot::ProcessSnapshot& p,
                              const capture::SymbolTable& syms);
using model::record_name;
using model::record_layer;
// The record's Python stack as "py_stack" (innermost first, [] for a thread
// without Python), with "py_stack_truncated" / "py_stack_partial" when so;
// nothing when the record captured none.  Instantiated for both json types.
template <typename Json>
void py_stack_json(const model::Record& r, const model::ProcessTree& t, Json& o);
// "FILE:LINE QUALNAME" of the innermost frame of the record's stack that is
// not the runtime's or torch's own; "" when none.
std::string py_location(const model::Record& r, const model::ProcessTree& t);
cd_role record_role(const model::Record& r, const capture::SymbolTable& syms);  // CD_ROLE_OTHER if unknown
// ncclCommInitAll: its "nranks" slot is the device count (shown as ndev).
bool is_init_all(const model::Record& r, const capture::SymbolTable& syms);
// The processes in output order: by pid (stable).
std::vector<const snapshot::ProcessSnapshot*> by_pid(const std::vector<snapshot::ProcessSnapshot>& ps);
// The counters in output order: stable by (symbol name, comm, dtype).
std::vector<const snapshot::CounterRow*> sorted_counters(const snapshot::ProcessSnapshot& p,
                                                         const capture::SymbolTable& syms);
// The fields of a record (call_fields: "collective", "group_size", "comm", ...;
// a module's "module_fqn", ...), shared by the JSON dump and the trace's args;
// instantiated for both json types.
template <typename Json>
void collective_json(const model::Record& r, const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms,
                     Json& o);
}  // namespace render_parts

}  // namespace commdbg::output
