// SPDX-License-Identifier: Apache-2.0
// The record model: bounded per-process call trees rebuilt from the event
// stream alone (no BPF, no I/O), the userspace half of a CommDebugMode.
//
// Nesting comes from the user stack pointer at entry (framework symbols have
// no return probes: a uretprobe under a C++ exception aborts the process).
// The kernel tracks each thread's open entry-only frames and sends the depth
// left once returned ones are popped (it also checks each frame's saved
// return address, see events.h); the model pops to that depth.  Without it,
// the sp rule: on one thread an open frame whose entry sp is <= a new entry's
// sp has returned.  Return-probed symbols (the NCCL API) are leaves: linked under the
// open frame, never pushed, completed by their CallExit.
//
// Budget: at most max_records retained per process and max_depth nesting.
// A call past either is counted by cause and not retained, but its frame stays
// on the stack as a placeholder so later entries still pop and nest
// correctly.  A child of a placeholder is linked under the nearest retained
// ancestor (or becomes a root); in practice children of a dropped frame are
// dropped themselves (the budget never frees up, and they are deeper), so
// this only matters for frames left open across a window reset().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "events.hpp"
#include "limits.hpp"
#include "symbol_table.hpp"

namespace commdbg {

struct ModelLimits {
    size_t max_records = limits::kDefaultMaxRecords;  // retained records per process
    size_t max_depth = limits::kDefaultMaxDepth;      // nesting levels per thread
};

// Collective: role COLLECTIVE and the communicator lifecycle (COMM_INIT /
// SPLIT / END, with coll NONE: shown by name).  Op: OP and OTHER.
// Module: ANNOTATION.
enum class RecordKind : uint8_t { Collective, Op, Module };
const char* to_string(RecordKind k);  // "Collective", "Op", "Module"

inline constexpr uint32_t kNoRecord = 0xffffffffu;

// Which optional fields of a Record hold a value.
enum RecordFlag : uint16_t {
    kHasCount = 1u << 0,
    kHasDtype = 1u << 1,
    kHasRedop = 1u << 2,
    kHasPeer = 1u << 3,
    kHasComm = 1u << 4,
    kHasRet = 1u << 5,       // a CallExit arrived
    kHasNewComm = 1u << 6,   // init/split: communicator written through the out pointer
    kEndInferred = 1u << 7,  // end_ns is when a later entry (or exit) proved it returned
    kReturnProbed = 1u << 8, // a leaf: end_ns, if known, came from its CallExit
    kHasStream = 1u << 9,    // stream: the call's stream argument (NCCL cudaStream_t)
    kHasSendBuf = 1u << 10,  // sendbuf: send buffer address
    kHasRecvBuf = 1u << 11,  // recvbuf: receive buffer address
    kEndAtExit = 1u << 12,   // with kEndInferred: still open when the process exited, so
                             // end_ns is the exit -- a bound, not when the call returned
};

// One retained call.  Compact on purpose (the budget is 200k per process):
// names are symbol ids resolved through the SymbolTable at output time, and
// children form an intrusive first_child / next_sibling list of indices into
// the process's record vector.
struct Record {
    uint64_t start_ns = 0;
    uint64_t end_ns = 0;    // 0 while unknown
    uint64_t count = 0;     // kHasCount: elements (the count argument; init: nranks, split: key)
    uint64_t comm = 0;      // kHasComm: communicator argument (split: the parent)
    uint64_t new_comm = 0;  // kHasNewComm
    int64_t ret = 0;        // kHasRet: raw return register
    uint64_t stream = 0;    // kHasStream
    uint64_t sendbuf = 0;   // kHasSendBuf
    uint64_t recvbuf = 0;   // kHasRecvBuf
    uint32_t sym = 0;
    uint32_t tid = 0;
    uint32_t parent = kNoRecord;
    uint32_t first_child = kNoRecord;
    uint32_t next_sibling = kNoRecord;
    uint32_t dtype = 0;     // kHasDtype: raw ncclDataType_t
    uint32_t redop = 0;     // kHasRedop: raw ncclRedOp_t
    int32_t peer = 0;       // kHasPeer: root or peer rank (init: rank, split: color)
    uint16_t group_depth = 0;
    uint16_t flags = 0;
    RecordKind kind = RecordKind::Op;
    uint8_t coll = CD_COLL_NONE;  // cd_coll

    bool has(uint16_t f) const { return (flags & f) != 0; }
};
// 110 bytes of fields, no padding beyond the tail: 112.
static_assert(sizeof(Record) <= 112, "Record is the unit of the memory budget");

// Host enqueue time of a return-probed call (NCCL is asynchronous: this is
// the time to enqueue on the host, never GPU time).  nullopt when no CallExit.
std::optional<uint64_t> host_enqueue_ns(const Record& r);

enum class DropCause : uint8_t { Budget = 0, Depth = 1 };
inline constexpr size_t kDropCauses = 2;
const char* to_string(DropCause c);  // "budget", "depth"

// "nccl.all_reduce": the key of a collective kind in every count by kind
// (records, kernel counters, /metrics).
std::string coll_key(std::string_view layer, cd_coll coll);

class ProcessTree {
public:
    ProcessTree(uint32_t pid, const SymbolTable& syms) : pid_(pid), syms_(&syms) {}
    ProcessTree(const ProcessTree&) = delete;  // caches a pointer into threads_
    ProcessTree& operator=(const ProcessTree&) = delete;

    uint32_t pid() const { return pid_; }
    const std::vector<Record>& records() const { return records_; }
    const std::vector<uint32_t>& roots() const { return roots_; }  // in entry order
    std::vector<uint32_t> threads() const;  // tids seen in this window, sorted

    uint64_t dropped(DropCause c) const { return dropped_[static_cast<size_t>(c)]; }
    uint64_t dropped_total() const { return dropped_[0] + dropped_[1]; }
    uint64_t unmatched_exits() const { return unmatched_exits_; }
    uint64_t unknown_symbols() const { return unknown_symbols_; }  // cookie id not in table
    uint64_t calls_seen() const { return calls_seen_; }  // entries with a known symbol
    // Collective-role calls whose nearest enclosing frame (retained or not) is a
    // collective-role call (c10d allreduce -> ncclAllReduce): the one logical
    // collective counted twice by the per-symbol counters.
    uint64_t nested_collectives() const { return nested_collectives_; }

    uint64_t calls(uint32_t sym) const { return sym < calls_.size() ? calls_[sym] : 0; }
    // "nccl.all_reduce" -> calls of collective-role symbols, from every entry
    // seen (retained or not).  Exact only if no ring-buffer record was lost;
    // the kernel counters are the exact source.
    std::map<std::string, uint64_t> coll_counts() const;

    // "record tree incomplete: ..." when any call was not retained.
    std::optional<std::string> incomplete_warning() const;

    std::optional<uint32_t> parent_pid() const { return parent_pid_; }
    bool exited() const { return exit_code_.has_value(); }
    std::optional<int32_t> exit_code() const { return exit_code_; }  // raw task->exit_code

    // Heap bytes held by this tree (vector capacities, thread state).
    size_t memory_bytes() const;

private:
    friend class TraceModel;

    struct Frame {
        uint64_t sp;
        uint32_t rec;         // kNoRecord: a placeholder for a dropped call
        uint32_t last_child;  // for O(1) in-order append
        bool collective;      // role COLLECTIVE (for nested_collectives)
    };
    struct PendingLeaf {
        uint64_t sp;
        uint64_t cookie;
        uint64_t enter_ts;
        uint32_t rec;  // kNoRecord when dropped: its exit is still consumed
    };
    struct ThreadState {
        std::vector<Frame> stack;
        std::vector<PendingLeaf> pending;
        bool seen = false;  // emitted an event in this window
    };

    ThreadState& thread(uint32_t tid);
    uint32_t append(Record r, ThreadState& th);
    void close_all(uint64_t ts);
    void reset_window();

    uint32_t pid_;
    const SymbolTable* syms_;
    std::vector<Record> records_;
    std::vector<uint32_t> roots_;
    std::vector<uint64_t> calls_;  // by symbol id
    std::unordered_map<uint32_t, ThreadState> threads_;
    uint32_t last_tid_ = 0;
    ThreadState* last_thread_ = nullptr;
    std::array<uint64_t, kDropCauses> dropped_{};
    uint64_t unmatched_exits_ = 0;
    uint64_t unknown_symbols_ = 0;
    uint64_t calls_seen_ = 0;
    uint64_t nested_collectives_ = 0;
    std::optional<uint32_t> parent_pid_;
    std::optional<int32_t> exit_code_;
};

class TraceModel {
public:
    TraceModel(const SymbolTable& syms, ModelLimits limits);
    explicit TraceModel(const SymbolTable& syms) : TraceModel(syms, ModelLimits{}) {}

    void on_event(const Event& ev);
    // Window reset: records, counts and drops are cleared and exited processes
    // forgotten; the limits stay.  Frames still open become placeholders, so
    // calls that return into them after the reset still nest correctly (they
    // become roots of the new window).
    void reset();

    const ProcessTree* process(uint32_t tgid) const;
    std::vector<uint32_t> pids() const;  // sorted
    const ModelLimits& limits() const { return limits_; }

private:
    ProcessTree& proc(uint32_t tgid);
    void on_enter(const CallEnter& e);
    void on_exit(const CallExit& e);

    const SymbolTable& syms_;
    ModelLimits limits_;
    std::unordered_map<uint32_t, std::unique_ptr<ProcessTree>> procs_;
    uint32_t last_tgid_ = 0;
    ProcessTree* last_proc_ = nullptr;
};

}  // namespace commdbg
