// SPDX-License-Identifier: Apache-2.0
// The snapshot layer: what one traced process looked like at the end of a
// window -- its exact kernel counters joined with its communicators, its
// record tree, notes and losses -- built once (join_kernel_state() from the
// kernel's maps, the rest by the session) and only read afterwards.  Every
// output (table, JSON, trace, the daemon's replies and /metrics) reads
// snapshots; nothing here knows how they are presented.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bpf_session.hpp"
#include "lifecycle.hpp"
#include "model.hpp"
#include "symbol_table.hpp"

namespace commdbg::snapshot {

// One exact kernel counter (cd_count_key + cd_count_val).  nested: of calls,
// those entered while an entry-only collective of their thread was open
// (nested_bytes: their bytes).
struct CounterRow {
    uint32_t sym = 0;
    uint64_t comm = 0;
    uint32_t dtype = CD_DTYPE_NONE;
    uint64_t calls = 0, elements = 0, bytes = 0, errors = 0;
    uint64_t nested = 0, nested_bytes = 0;
};

// How a communicator came to be, as far as this window saw.
enum class CommOrigin : uint8_t {
    InitRank,      // ncclCommInitRank / InitRankConfig: from a unique id
    Split,         // ncclCommSplit of a parent
    InitAll,       // ncclCommInitAll: one per device
    BeforeAttach,  // only seen in use: created before the window opened
    Unknown,
};
std::string_view to_string(CommOrigin o);  // "init_rank", "split", "init_all", "before_attach", "unknown"

struct CommInfo {
    uint64_t ptr = 0;
    std::optional<uint64_t> id;  // commHash (init) or derived split id
    int32_t nranks = -1, rank = -1;
    CommOrigin origin = CommOrigin::Unknown;
    std::optional<uint64_t> parent_ptr;
    bool destroyed = false;
    std::optional<int64_t> init_ret;
};

// One process's snapshot.  Owns its values, except `tree`: the record tree
// stays in the TraceSession's model (a full window, bench_model's bytes per
// retained record times 200000, is not worth a copy per output) and is
// valid until that session resets its window or is destroyed; null when the
// process made no recorded call.
struct ProcessSnapshot {
    uint32_t pid = 0;
    std::string command;
    std::optional<int> exit_code;  // raw wait status: see decode_exit
    std::vector<std::string> libraries;
    std::vector<CounterRow> counters;
    std::vector<CommInfo> comms;
    const model::ProcessTree* tree = nullptr;
    uint64_t kernel_dropped_records = 0;
    uint64_t counter_breakdown_lost = 0;  // calls counted without comm and dtype (kernel counter keys ran out)
    std::vector<std::string> notes;
    std::map<uint32_t, std::string> thread_names;  // tid -> name, where known
    // The FSDP lifecycle of its scopes, when a lifecycle profile recognised them.
    std::optional<fsdp::Findings> fsdp;
};

// The kernel's state for `pid`, joined: its counters (a coarse counter merged
// into the fine row of the same symbol without comm and dtype, so each row is
// unique), its communicators and what its counters lost.  Fills `r`'s
// counters, comms and counter_breakdown_lost, and appends a note for calls
// that could not be counted.
void join_kernel_state(uint32_t pid, const capture::CounterSnapshot& counters,
                       const std::vector<capture::CommEntry>& comms, ProcessSnapshot& r);
void join_kernel_state(uint32_t pid, const std::vector<capture::CounterEntry>& counters,
                       const std::map<uint32_t, capture::CounterLoss>& loss,
                       const std::vector<capture::CommEntry>& comms, ProcessSnapshot& r);

// Per collective kind, summed from the exact counters of collective-role
// symbols (never from records, which may be dropped), CommDebugMode's way:
// a framework collective (an entry-only probe: c10d) is counted once, at the
// outermost framework collective of its thread (gloo's _allgather_base, not
// the allgather it calls); a library collective (return-probed: NCCL) is a
// layer of its own, every call counted.  A kind with no outermost call has
// no key.  errors: of every call.
struct CollSummary {
    uint64_t calls = 0, bytes = 0, errors = 0;
};
std::map<std::string, CollSummary> coll_summary(const std::vector<CounterRow>& counters,
                                                const capture::SymbolTable& syms);
std::map<std::string, CollSummary> coll_summary(const ProcessSnapshot& p, const capture::SymbolTable& syms);
// "nccl.all_reduce" -> calls / bytes (the same keys as coll_summary).
std::map<std::string, uint64_t> comm_counts(const ProcessSnapshot& p, const capture::SymbolTable& syms);
std::map<std::string, uint64_t> comm_bytes(const ProcessSnapshot& p, const capture::SymbolTable& syms);
// Each logical collective once, at its outermost collective call of any
// layer: the collective calls minus those the kernel counted as nested (c10d
// _allgather_base -> allgather, c10d allreduce -> ncclAllReduce), exact
// whatever records were lost.  Where the model saw more nesting than the
// kernel (threads deeper than the kernel's CD_MAX_FRAMES), its count wins.
uint64_t total_counts(const ProcessSnapshot& p, const capture::SymbolTable& syms);

// Collectives per module path (ProcessTree::module_comm_counts); empty when
// the process has no records.
std::map<std::string, model::ProcessTree::ModuleCommCounts> module_comm_counts(const ProcessSnapshot& p);

// The communicator at `ptr` (pointers are reused after a destroy: the most
// recent wins), or nullptr.
const CommInfo* find_comm(const ProcessSnapshot& p, uint64_t ptr);

}  // namespace commdbg::snapshot
