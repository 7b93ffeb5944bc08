// SPDX-License-Identifier: Apache-2.0
// Outputs of one tracing window: a CommDebugMode-style table (noise levels),
// the JSON dump, and a Chrome/Perfetto trace.  Pure functions of a
// ProcessReport (filled by the session) and the symbol table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.hpp"
#include "symbol_table.hpp"

namespace commdbg {

// One exact kernel counter (cd_count_key + cd_count_val).
struct CounterRow {
    uint32_t sym = 0;
    uint64_t comm = 0;
    uint32_t dtype = CD_DTYPE_NONE;
    uint64_t calls = 0, elements = 0, bytes = 0, errors = 0;
};

struct CommInfo {
    uint64_t ptr = 0;
    std::optional<uint64_t> id;  // commHash (init) or derived split id
    int32_t nranks = -1, rank = -1;
    std::string origin;  // "init_rank", "init_rank_config", "split", "init_all", "before_attach"
    std::optional<uint64_t> parent_ptr;
    bool destroyed = false;
    std::optional<int64_t> init_ret;
};

struct ProcessReport {
    uint32_t pid = 0;
    std::string command;
    std::optional<int> exit_code;  // raw wait status: see report_detail::decode_exit
    std::vector<std::string> libraries;
    std::vector<CounterRow> counters;
    std::vector<CommInfo> comms;
    const ProcessTree* tree = nullptr;
    uint64_t kernel_dropped_records = 0;
    uint64_t counter_breakdown_lost = 0;  // calls counted without comm and dtype (kernel counter keys ran out)
    std::vector<std::string> notes;
    std::map<uint32_t, std::string> thread_names;  // tid -> name, where known
};

// Noise levels (CommDebugMode's idea, our layers):
//   0 collectives (and communicator lifecycle) only
//   1 + framework ops (default)
//   2 + module annotations
//   3 + trivial ops (views, detach, copies, allocations: see is_trivial_op)
// A hidden record's visible children move up to its level.
inline constexpr int kDefaultNoiseLevel = 1;
bool is_trivial_op(std::string_view name);
bool record_visible(const Record& r, const SymbolTable& syms, int noise_level);

// Per collective kind ("nccl.all_reduce"), summed from the exact counters of
// collective-role symbols (never from records, which may be dropped).
struct CollSummary {
    uint64_t calls = 0, bytes = 0, errors = 0;
};
std::map<std::string, CollSummary> coll_summary(const ProcessReport& p, const SymbolTable& syms);
// "nccl.all_reduce" -> calls / bytes (the same keys as coll_summary).
std::map<std::string, uint64_t> comm_counts(const ProcessReport& p, const SymbolTable& syms);
std::map<std::string, uint64_t> comm_bytes(const ProcessReport& p, const SymbolTable& syms);
// Each logical collective once: sum of comm_counts minus the collectives the
// model saw nested in another collective (c10d allreduce -> ncclAllReduce).
uint64_t total_counts(const ProcessReport& p, const SymbolTable& syms);

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
// the tree as a json value costs ~3 KB per record, its text ~0.5 KB.
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
const CommInfo* find_comm(const ProcessReport& p, uint64_t ptr);
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
cd_role record_role(const Record& r, const SymbolTable& syms);  // CD_ROLE_OTHER if unknown
// ncclCommInitAll: its "nranks" slot is the device count (shown as ndev).
bool is_init_all(const Record& r, const SymbolTable& syms);
// The processes in output order: by pid (stable).
std::vector<const ProcessReport*> by_pid(const std::vector<ProcessReport>& ps);
// The counters in output order: stable by (symbol name, comm, dtype).
std::vector<const CounterRow*> sorted_counters(const ProcessReport& p, const SymbolTable& syms);
// The collective fields of a record ("collective", "group_size", "comm", ...),
// shared by the JSON dump and the trace's args; instantiated for both json types.
template <typename Json>
void collective_json(const Record& r, const ProcessReport& p, const SymbolTable& syms, Json& o);
}  // namespace report_detail

}  // namespace commdbg
