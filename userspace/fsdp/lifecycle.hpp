// SPDX-License-Identifier: Apache-2.0
// The FSDP lifecycle, rebuilt from outside the job: optimizer steps,
// micro-steps, the order FSDP units run forward and backward, prefetches,
// all-gathers issued and consumed, gradient reductions -- and the checks the
// in-process reference diagnostics run on them, plus one they cannot
// (ranks that diverge).
//
// Framework knowledge is data: a lifecycle profile (specs/lifecycle/*.json,
// compiled in) maps scope labels to lifecycle events.  The input is a flat,
// typed list of the trace's scopes and outermost collectives (TraceItem),
// made from a live record tree or from a JSON dump, so a dump gathered on
// another node is checked by the same code as a live window.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pattern.hpp"
#include "result.hpp"

namespace commdbg::model {
class ProcessTree;
}  // namespace commdbg::model
namespace commdbg::capture {
class SymbolTable;
}  // namespace commdbg::capture

namespace commdbg::fsdp {

enum class EventKind : uint8_t {
    OptimizerStep,     // the optimizer boundary: a global step ends
    RootForward,       // the root's forward begins: a micro-step begins
    PreForward,        // a unit's forward begins
    PostForward,       // a unit's forward ends
    AllGather,         // a unit's parameters are all-gathered (issued)
    AllGatherCopyOut,  // ... and consumed
    ForwardPrefetch,   // the unit that just ran forward prefetches {target}
    BackwardPrefetch,  // the same in backward
    PreBackward,       // a unit's backward begins
    PostBackward,      // a unit's gradients are accumulated / its parameters resharded
    GradReduce,        // a unit's gradients are reduced (reduce-scatter, all-reduce)
    RootPostBackward,  // the backward pass ends
};
inline constexpr size_t kEventKinds = 12;
std::string_view to_string(EventKind k);  // "optimizer_step", ... (the profile's names)
std::optional<EventKind> event_kind(std::string_view name);

// A scope label recognised by a profile.
struct Match {
    EventKind kind;
    std::string unit;  // the unit it belongs to (the root's name when the label has none)
};

// Label patterns: literal text, `{unit}` (the unit's name; a prefetch's
// target), `{any}`, and `[...]` for an optional part:
// "FSDP::pre_forward[ ({unit})]".  An empty or absent unit is the root.
// Matched without backtracking: time linear in the label (pattern.hpp).
struct Profile {
    struct Rule {
        EventKind kind;
        std::string pattern;
        Pattern re;
        int unit_group = 0;  // 0: the label names no unit
    };
    std::string name, description;
    std::string root_unit = "<root>";
    // The end of the backward pass waits for and frees every all-gather not
    // consumed yet (FSDP2's finalize_backward): only those issued after it
    // can be pending at the optimizer step.
    bool backward_end_frees_all_gathers = false;
    std::vector<Rule> rules;

    std::optional<Match> match(std::string_view label) const;
};
Result<Profile> parse_profile(const std::string& text, const std::string& origin);
Result<Profile> load_profile(const std::string& path);  // a profile file (--profile)
const std::vector<Profile>& builtin_profiles();  // specs/lifecycle/*.json, in name order

// What the lifecycle reads of a trace, in start order: every scope and every
// outermost collective (one logical collective: c10d allgather inside
// _allgather_base is not another), with its enclosing scope.
struct TraceItem {
    bool scope = false;
    std::string name;  // the scope's label, or the collective's key ("c10d.all_gather")
    uint32_t tid = 0;
    uint64_t start_ns = 0;
    uint64_t bytes = 0;  // a collective's (else its nested calls'), 0: unknown
    int32_t parent = -1;            // the enclosing scope item, -1: none
};
std::vector<TraceItem> items_from_tree(const model::ProcessTree& t, const capture::SymbolTable& syms);
// Items in start order (stable: a parent starts no later than its child), parents renumbered.
void sort_by_start(std::vector<TraceItem>& items);

// What the checks read of one process object of a JSON dump.
struct DumpedProcess {
    std::vector<TraceItem> items;  // from its "records" (scopes are there at --noise-level 2 and above)
    uint32_t pid = 0;              // "process": {"pid": N}; 0: not given
    int rank = -1;                 // the first of its "communicators" with a rank >= 0; -1: none
    uint64_t dropped_records = 0;
    bool from_start = false;       // "fsdp": {"window": "from_start"}: the window began with the process
    bool ended = false;            // "process" says how it ended (an exit status or a signal)
};
// Reads a dump -- one process object, or {"processes": [...]} -- calling
// `each` for each process as its object ends; returns how many.  Only those
// fields are kept, each checked for its type, and a scope label for its
// length (commdbg writes at most 2048 bytes); a failure names the field:
// `field "processes[0].process.pid": expected an unsigned integer, got a string`.
Result<size_t> read_dump(std::istream& in, const std::function<void(DumpedProcess&&)>& each);

// The record that shows a finding: its name, thread and start.
struct Evidence {
    std::string name;
    uint32_t tid = 0;
    uint64_t start_ns = 0;
};

struct Finding {
    std::string check, message;
    int global_step = 0, micro_step = -1;  // -1: the whole step
    std::string phase;                     // "forward", "backward", "optimizer"
    std::string unit;
    std::vector<Evidence> records;
    // grad_sync_non_final_micro_step: the reductions that should not have been.
    uint64_t extra_collectives = 0, extra_bytes = 0;
};

// One forward+backward between two optimizer steps (the reference's trace
// evidence), with the collectives issued in it.
struct MicroStep {
    int global_step = 0, micro_step = 0;
    // Began before the window, or was cut by its end: its orders may be
    // incomplete (not checked, not compared across ranks).
    bool partial = false;
    std::vector<std::string> forward, backward;
    std::vector<Evidence> forward_at, backward_at;  // each unit's pre-forward / pre-backward
    struct Coll {
        std::string key, unit;  // unit: "" outside every unit's scope
        uint64_t bytes = 0;
        Evidence at;
    };
    std::vector<Coll> collectives;
};

struct Findings {
    std::string profile;
    bool from_start = false;  // the window began with the process
    std::vector<std::string> units;  // sorted
    std::vector<MicroStep> micro_steps;
    uint64_t optimizer_steps = 0;
    std::vector<Finding> violations, warnings;
    std::vector<std::string> notes;
    bool empty() const { return micro_steps.empty() && optimizer_steps == 0; }
};

struct Options {
    bool from_start = false;  // false: the first step may have begun before the window
    uint64_t records_lost = 0;  // records of the process dropped (ring buffer, budget, depth)
    bool process_ended = false;  // the window ends with the process (else its end may cut a step)
};
// The first profile that recognises any of the items' scopes, `first`
// before the built-in ones; nullptr: none.  Points into `first` or the
// built-ins: `first` must outlive it.
const Profile* detect_profile(const std::vector<TraceItem>& items, const std::vector<Profile>& first = {});
Findings analyse(const std::vector<TraceItem>& items, const Profile& profile, const Options& o);

// The ranks of one job: the first point where any rank's unit order or
// collective sequence differs from the first rank's, per rank.
struct RankView {
    std::string name;  // "rank 1 (pid 4242)"
    const Findings* report = nullptr;
};
std::vector<Finding> cross_rank(const std::vector<RankView>& ranks);
// The order of the ranks of a job: by rank, an unknown one (-1) last.
inline bool rank_before(int a, int b) { return static_cast<unsigned>(a) < static_cast<unsigned>(b); }
// "rank 1 (pid 4242)", or `who` alone when the rank is unknown (-1).
std::string rank_view_name(int rank, const std::string& who);

nlohmann::ordered_json to_json(const Findings& r);
nlohmann::ordered_json to_json(const Finding& f);
// The "FSDP lifecycle" table section: per micro-step orders, then findings.
std::string render_section(const Findings& r);
std::string render_findings(const std::vector<Finding>& fs, std::string_view title);
// The cross-rank verdict over `ranks` processes ("" for fewer than two).
std::string render_cross_rank(const std::vector<Finding>& cross, size_t ranks);
// "commdbg check: V violation(s), W warning(s) in P process(es)\n".
std::string render_summary(size_t violations, size_t warnings, size_t processes);

}  // namespace commdbg::fsdp
