// SPDX-License-Identifier: Apache-2.0
// The record model (bounded per-process call trees from the event stream); design: docs/design/model.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "events.hpp"
#include "limits.hpp"
#include "module_params.hpp"
#include "py_context.hpp"
#include "symbol_table.hpp"
#include "tensor_layout.hpp"

namespace commdbg::model {

struct ModelLimits {
    size_t max_records = limits::kDefaultMaxRecords;  // retained records per process
    size_t max_depth = limits::kDefaultMaxDepth;      // nesting levels per thread
};

// Collective: role COLLECTIVE and the communicator lifecycle (COMM_INIT /
// SPLIT / END, with coll NONE: shown by name).  Op: OP and OTHER.
// Module: an nn.Module call seen in the Python stacks (ctx set), or a record of
// role ANNOTATION.  Scope: a record_function(USER_SCOPE) scope.
enum class RecordKind : uint8_t { Collective, Op, Module, Scope };
const char* to_string(RecordKind k);  // "Collective", "Op", "Module", "Scope"

inline constexpr uint32_t kNoRecord = 0xffffffffu;
inline constexpr uint32_t kNoStack = 0xffffffffu;  // Record::stack: no Python stack captured
inline constexpr uint32_t kNoCtx = 0xffffffffu;    // Record::ctx: not a context record
inline constexpr uint32_t kNoSym = 0xffffffffu;    // Record::sym of a module record: no probe
inline constexpr uint64_t kUserScope = 7;          // at::RecordScope::USER_SCOPE
// CtxLink::key of a scope its label opened (torch >= 2) and no RecordFunction
// was seen for: closed by the thread's next exit naming none (LIFO).  No
// RecordFunction lies at address 1.
inline constexpr uint64_t kLabelScope = 1;

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
    kBackward = 1u << 13,    // a module record: it ran on behalf of gradients (autograd)
    kHasTensors = 1u << 14,  // a collective: ctx is its tensor set (ProcessTree::tensor_set)
    kRecompute = 1u << 15,   // a module record with kBackward: its forward run again inside
                             // backward (activation checkpointing), not a second forward
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
    uint32_t stack = kNoStack;  // ProcessTree::py_stack(): the caller's Python stack
    uint32_t ctx = kNoCtx;      // Scope: its label (text id); Module from frames: module_info id;
                                // Collective with kHasTensors: its tensor set id
    uint32_t dtype = 0;     // kHasDtype: raw ncclDataType_t
    uint32_t redop = 0;     // kHasRedop: raw ncclRedOp_t
    int32_t peer = 0;       // kHasPeer: root or peer rank (init: rank, split: color)
    uint16_t group_depth = 0;
    uint16_t flags = 0;
    RecordKind kind = RecordKind::Op;
    uint8_t coll = CD_COLL_NONE;  // cd_coll

    bool has(uint16_t f) const { return (flags & f) != 0; }
};
// 118 bytes of fields, no padding beyond the tail: 120.
static_assert(sizeof(Record) <= 120, "Record is the unit of the memory budget");

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
    ProcessTree(uint32_t pid, const capture::SymbolTable& syms) : pid_(pid), syms_(&syms) {}
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

    // ---- framework context, interned per process ----
    struct PyFrameRow {
        uint32_t qualname = 0, file = 0;  // text ids
        uint32_t line = 0;
        bool known = false;
        bool library = false;
    };
    struct PyStack {
        uint32_t first = 0;  // into the stack frame list
        uint16_t len = 0;
        uint16_t status = CD_PY_NONE;  // cd_py_status
        uint16_t flags = 0;            // CD_CTX_*
    };
    struct ModuleInfo {
        uint32_t fqn = 0, module_class = 0;  // text ids
        uint32_t node = kNoCtx;              // backward: the autograd node's class (text id)
    };
    std::string_view text(uint32_t id) const { return *texts_[id]; }
    const PyFrameRow& py_frame(uint32_t id) const { return frame_rows_[id]; }
    const PyStack& py_stack(uint32_t id) const { return stacks_[id]; }
    // The frame ids of a stack, innermost first.
    std::span<const uint32_t> py_stack_frames(const PyStack& s) const {
        return {stack_frames_.data() + s.first, s.len};
    }
    size_t py_stack_count() const { return stacks_.size(); }
    size_t py_frame_count() const { return frame_rows_.size(); }
    // A scope's label or a module record's dotted path ("<root>" for the
    // root); "" for other records.
    std::string_view context_name(const Record& r) const;
    // A scope or module record that names its context (ctx is theirs).
    static bool has_context(const Record& r) {
        return r.ctx != kNoCtx && (r.kind == RecordKind::Scope || r.kind == RecordKind::Module);
    }
    std::string_view module_class(const Record& r) const;  // "" unless a module record from frames
    // A backward module record's autograd node class ("MmBackward0", "PyNode"); "" when unknown.
    std::string_view autograd_node(const Record& r) const;

    // ---- backward attribution (docs/design/backward.md) ----
    // Nodes the engine ran in this window, and those of them no forward
    // record of this process had made (their records go unattributed).
    uint64_t autograd_nodes_run() const { return nodes_run_; }
    uint64_t autograd_nodes_unmapped() const { return nodes_unmapped_; }
    static constexpr size_t kMaxNodes = 1u << 16;   // nodes remembered per process (the oldest go)
    static constexpr size_t kMaxChains = 4096;      // distinct module chains; beyond: all forgotten

    // ---- tensors a c10d call was given, interned per process ----
    enum class TensorStatus : uint8_t {
        Ok,            // shape, dtype, numel and bytes as read
        Undefined,     // an undefined at::Tensor
        NotPlain,      // not a c10::TensorImpl itself: not read
        Unreadable,    // a read failed
        Symbolic,      // symbolic sizes: no shape
        TooManyDims,   // more dims than the kernel keeps: numel and dtype only
        Inconsistent,  // numel is not the product of the sizes, or no such dtype: nothing shown
        NoLayout,      // the process's layout is not known here: nothing shown
    };
    struct TensorInfo {
        uint32_t first_dim = 0;  // into the dims list (tensor_dims)
        uint8_t ndim = 0;
        TensorStatus status = TensorStatus::Unreadable;
        uint8_t param = 0;       // 0: the method's first tensor parameter, 1: its second
        uint32_t dtype = 0;      // text id of its name ("float32")
        int64_t numel = 0;
        uint64_t bytes = 0;
    };
    struct TensorSet {
        uint32_t first = 0;  // into the tensor list (tensor)
        uint8_t n = 0;
        uint8_t kinds = 0;   // events.h, cookie bits 60..63: the method's tensor parameters
        uint8_t status = 0;  // cd_tensors_status
        uint8_t flags = 0;   // CD_TENSORS_*
        uint16_t total[2] = {0, 0};  // tensors each parameter held
        int32_t group_rank = -1, group_size = -1;
    };
    const TensorSet& tensor_set(const Record& r) const { return tensor_sets_[r.ctx]; }
    const TensorInfo& tensor(uint32_t i) const { return tensor_rows_[i]; }
    std::span<const int64_t> tensor_dims(const TensorInfo& t) const {
        return {tensor_dims_.data() + t.first_dim, t.ndim};
    }
    size_t tensor_set_count() const { return tensor_sets_.size(); }

    // Collectives under each module: every collective-role record counted
    // under every module record enclosing it (transitively), the outermost
    // collective of a nest only (c10d allreduce, not the NCCL call inside).
    // Keyed by module path, then by coll_key.
    struct ModuleCommCounts {
        std::map<std::string, uint64_t> forward, backward;
    };
    std::map<std::string, ModuleCommCounts> module_comm_counts() const;
    // The module a backward collective is also counted for there (the one
    // whose backward began last, inside the record's own module: CommDebugMode's
    // name), or "" (docs/design/backward.md).
    std::string_view also_counted_for(const Record& r) const;

    // ---- the parameters of the modules seen (torch::ParameterSource) ----
    // Read once per module path a window, when its first record opens, in
    // that order; at most kMaxParamModules paths (the rest are counted).
    static constexpr size_t kMaxParamModules = 4096;
    const std::vector<std::pair<std::string, torch::ModuleParams>>& parameters() const { return params_; }
    uint64_t unread_parameter_modules() const { return params_lost_; }

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
    // One link of a thread's open context chain, outermost first.
    struct CtxLink {
        uint64_t key;         // scope: the RecordFunction's `this`; module: the module object
        uint32_t depth;       // Python stack depth, for ordering (see update_context)
        uint32_t rec;         // kNoRecord: not retained
        uint32_t last_child;  // for O(1) in-order append
        bool scope;
        bool backward;
        uint64_t node = 0;    // a backward module's innermost link: the node it runs
        uint32_t unit = kNoCtx;  // a backward scope naming the module it runs for (text id)
    };
    // The autograd engine running a node on a thread: from its evaluate_function
    // until a record's stack no longer holds the engine's Python entry below it.
    struct BackwardRun {
        uint64_t entry_code;   // the entry frame's code (_engine_run_backward); 0: none
        uint32_t entry_depth;  // its position from the outermost frame (1-based)
        uint64_t node;
        uint64_t vtable;       // the node's class; 0: unread
    };
    // A module running when a node was made, outermost first: as a record
    // made then would have nested in it.
    struct ChainModule {
        uint64_t module;
        std::string fqn, cls;
    };
    using Chain = std::vector<ChainModule>;
    struct ThreadState {
        std::vector<Frame> stack;
        std::vector<PendingLeaf> pending;
        std::vector<CtxLink> ctx;
        std::vector<BackwardRun> backward;  // outermost first (reentrant backward nests)
        std::optional<capture::CallEnter> pending_node;  // a node whose modules open with its first record
        bool label_opened = false;  // the thread's last event was a SCOPE_LABEL that opened a scope
        bool seen = false;  // emitted an event in this window
        struct {
            uint64_t serial = 0;  // 0: none
            uint32_t id = 0;
            uint16_t status = 0, flags = 0;
        } last_stack;  // the stack of its last record with one, interned
    };
    struct FrameKey {
        uint32_t qualname, file, line;
        bool known, library;
        bool operator==(const FrameKey&) const = default;
    };
    struct FrameKeyHash {
        size_t operator()(const FrameKey& k) const;
    };
    struct TextHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    ThreadState& thread(uint32_t tid);
    uint32_t append(Record r, ThreadState& th);
    void end_link(const CtxLink& l, uint64_t ts, bool inferred);
    uint32_t intern_text(std::string_view s);
    uint32_t intern_frame(const python::PyFrameInfo& f);
    uint32_t intern_stack(std::span<const python::PyFrameInfo* const> frames, uint16_t status, uint16_t flags);
    // The same for a thread's record whose frames have the resolver's
    // `serial` (PyContextResolver::stack): the thread's last stack again is
    // not interned again.
    uint32_t intern_stack(ThreadState& th, uint64_t serial, std::span<const python::PyFrameInfo* const> frames,
                          uint16_t status, uint16_t flags);
    uint32_t intern_module(std::string_view fqn, std::string_view cls, std::string_view node = {});
    uint32_t intern_chain(Chain c);
    // The chain of modules a module ran in, ending with it (from the chains
    // nodes were made under), or nullptr; `len` its length.
    const ChainModule* module_chain(std::string_view fqn, uint32_t& len) const;
    void remember_node(uint64_t node, uint32_t chain);
    uint32_t intern_tensors(const cd_tensors& t, const torch::TensorLayout* layout);
    bool nested_in_collective(const Record& r) const;
    void close_all(uint64_t ts);
    void reset_window();

    uint32_t pid_;
    const capture::SymbolTable* syms_;
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

    // Interned context: cleared with the records (reset_window).
    std::unordered_map<std::string, uint32_t, TextHash, std::equal_to<>> text_index_;
    std::vector<const std::string*> texts_;  // keys of text_index_ (nodes: stable)
    std::unordered_map<FrameKey, uint32_t, FrameKeyHash> frame_index_;
    std::vector<PyFrameRow> frame_rows_;
    std::unordered_multimap<uint64_t, uint32_t> stack_index_;  // content hash -> stack id
    std::vector<PyStack> stacks_;
    std::vector<uint32_t> stack_frames_;
    std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> module_index_;
    std::vector<ModuleInfo> modules_;
    std::unordered_map<std::string, uint32_t> tensor_index_;  // a set's contents -> its id
    std::vector<TensorSet> tensor_sets_;
    std::vector<TensorInfo> tensor_rows_;
    std::vector<int64_t> tensor_dims_;
    uint64_t last_root_ = 0;  // the outermost module of the last forward stack: FQNs start there
    std::vector<std::pair<std::string, torch::ModuleParams>> params_;
    std::unordered_map<std::string, bool> params_tried_;  // module paths asked this window
    std::unordered_map<std::string, uint32_t> params_retries_;  // asked again: not readable yet
    // Modules to read again at the next batch of records (TraceModel::
    // retry_parameters): FSDP2's unsharded parameters exist only once its
    // first pre-forward ran, which may be after the module's record was read.
    struct ParamRead {
        std::string path;
        uint64_t module = 0;
        size_t depth = 0;
    };
    std::vector<ParamRead> params_pending_;
    uint64_t params_lost_ = 0;
    // Backward attribution: kept across windows (a forward and its backward
    // may fall in two), bounded.
    std::vector<Chain> chains_;
    std::map<std::string, uint32_t> chain_index_;
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> module_chains_;  // fqn -> (chain, length)
    std::unordered_map<uint64_t, uint32_t> nodes_;  // Node* -> chain
    std::deque<uint64_t> node_order_;               // insertion order, for eviction
    std::unordered_map<uint64_t, std::string> node_names_;  // vtable -> class, bounded by kMaxChains
    uint64_t nodes_run_ = 0, nodes_unmapped_ = 0;
    // CommDebugMode's module in backward (its module tracker's name): the
    // module whose backward began last, as its full-backward pre-hook sets
    // it, kept until a forward; its chain's paths, outermost first.  The
    // node whose run began it, and what it was before that node (what the
    // node's tensor hooks, which run before that pre-hook, still see).
    std::vector<std::string> begun_, begun_before_;
    uint64_t begun_by_ = 0;
    // A backward collective under a module the last begun one lies inside
    // (FSDP2's reduce-scatter under its unit, blocks.0.up begun last): that
    // module's chain (text ids), counted for it as CommDebugMode does.
    std::unordered_map<uint32_t, std::vector<uint32_t>> credited_;
};

class TraceModel {
public:
    TraceModel(const capture::SymbolTable& syms, ModelLimits limits);
    explicit TraceModel(const capture::SymbolTable& syms) : TraceModel(syms, ModelLimits{}) {}

    // Names Python frames and module paths; null: stacks are kept as
    // "<unknown>" frames and no modules are seen.  Must outlive the model.
    void set_resolver(python::PyContextResolver* r) { resolver_ = r; }
    // Whether a scope (tgid, RecordFunction this) is still open in the target
    // now: a label read from its Python object at ingest is trusted only
    // then (the object dies at the scope's end and its address is reused by
    // the next one).  Unset: labels from Python objects are trusted.
    void set_scope_check(std::function<bool(uint32_t, uint64_t)> open) { scope_open_ = std::move(open); }
    // The TensorImpl layout a process's tensors were read with (dtype names,
    // element sizes); null: its tensors show no dtype and no bytes.
    void set_tensor_layouts(std::function<const torch::TensorLayout*(uint32_t)> f) { layouts_ = std::move(f); }
    // Reads a module's parameters when its first record of a window opens;
    // null: none are read.  Must outlive the model.
    void set_parameter_source(torch::ParameterSource* s) { params_ = s; }
    // Names an autograd node's class from its vtable in a process ("MmBackward0");
    // unset or "": the record shows none.
    void set_node_namer(std::function<std::string(uint32_t, uint64_t)> f) { node_namer_ = std::move(f); }
    // The module a record_function label says backward runs for (FSDP's
    // "FSDP::post_backward_reduce (blocks.0)": the unit's FQN), or nullopt.
    void set_unit_namer(std::function<std::optional<std::string>(std::string_view)> f) { unit_namer_ = std::move(f); }

    void on_event(const capture::Event& ev);
    // Reads again the parameters that were not readable yet (FSDP2 before
    // its first unshard), each at most kMaxParamRetries times in all: call
    // once per batch of records, so that the target has moved on meanwhile.
    // Whether it did any (modules are still not readable).
    bool retry_parameters();
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
    void on_enter(const capture::CallEnter& e);
    void on_exit(const capture::CallExit& e);
    void pop_returned(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e);
    uint32_t add_call(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                      const capture::SymbolInfo& info);
    bool admit(ProcessTree& p, const ProcessTree::ThreadState& th);
    void resolve_frames(const capture::CallEnter& e);
    void update_context(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                        bool entering = false);
    void want_modules(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e);
    void backward_runs(ProcessTree::ThreadState& th, const capture::CallEnter& e);
    void begin_backward(ProcessTree& p, const ProcessTree::Chain& chain, uint64_t node);
    void credit_backward(ProcessTree& p, const ProcessTree::ThreadState& th, uint32_t rec);
    void on_grad_fn(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                    const capture::SymbolInfo& info);
    void on_autograd_node(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                          const capture::SymbolInfo& info);
    std::string node_name(ProcessTree& p, uint32_t tgid, uint64_t vtable);
    void open_module(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e, size_t want);
    void read_parameters(ProcessTree& p, uint32_t tgid, std::vector<ProcessTree::ParamRead> todo);
    void enter_context(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                       const capture::SymbolInfo& info, bool after_label);
    void on_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                  const capture::SymbolInfo& info, bool after_label);
    bool opens_scope(const capture::CallEnter& e, const capture::SymbolInfo& info) const;
    std::string scope_label(const capture::CallEnter& e, uint64_t self, size_t* enter_at = nullptr) const;
    uint32_t scope_depth(const ProcessTree::ThreadState& th, const capture::CallEnter& e, size_t enter_at) const;
    void unit_modules(ProcessTree& p, const ProcessTree::ThreadState& th, uint32_t entry_depth);
    void begin_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e, uint64_t self);
    // Closes the scope keyed `self` (kLabelScope: the innermost a label opened).
    void end_scope(ProcessTree& p, ProcessTree::ThreadState& th, uint64_t self, uint64_t ts);

    // A module the current record's stack shows, outermost first.
    struct WantModule {
        uint64_t module;
        uint32_t depth;
        bool backward;
        const python::PyFrameInfo* frame;          // null: from a node's chain
        const ProcessTree::ChainModule* chained = nullptr;
        bool recompute = false;
        uint64_t node = 0, vtable = 0;             // the innermost module of a backward node's chain
    };
    // A link of the chain a record's stack asks for: an open scope (index
    // into the thread's chain) or a module (index into want_).
    struct Desired {
        bool scope;
        uint32_t idx;
    };
    std::string node_class(ProcessTree& p, uint32_t tgid, const WantModule& m);
    std::string_view py_function_node(uint32_t entry_depth) const;
    void name_py_nodes(ProcessTree& p, const ProcessTree::ThreadState& th, size_t kept);
    static constexpr std::string_view kPyNode = "PyNode";

    const capture::SymbolTable& syms_;
    ModelLimits limits_;
    python::PyContextResolver* resolver_ = nullptr;
    std::function<bool(uint32_t, uint64_t)> scope_open_;
    std::function<const torch::TensorLayout*(uint32_t)> layouts_;
    torch::ParameterSource* params_ = nullptr;
    std::function<std::string(uint32_t, uint64_t)> node_namer_;
    std::function<std::optional<std::string>(std::string_view)> unit_namer_;
    // Scratch of on_enter, kept for its capacity.
    std::vector<const python::PyFrameInfo*> frames_;  // the record's frames, resolved, innermost first
    uint64_t frames_serial_ = 0;                       // PyContextResolver::stack's, for frames_
    std::vector<WantModule> want_;
    std::vector<Desired> desired_;
    // Of the current event: the unit the scope it begins names (empty: none),
    // and whether its stack runs backward (want_modules).
    std::string begin_unit_;
    uint32_t begin_depth_ = 0;
    bool in_backward_ = false;
    std::unordered_map<uint32_t, std::unique_ptr<ProcessTree>> procs_;
    uint32_t last_tgid_ = 0;
    ProcessTree* last_proc_ = nullptr;
};

}  // namespace commdbg::model
