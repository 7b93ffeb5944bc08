// SPDX-License-Identifier: Apache-2.0
#include "model.hpp"

#include <algorithm>
#include <type_traits>

#include "nccl.hpp"

namespace commdbg {

namespace {

// Pending leaves per thread: NCCL calls do not nest through their API, and the
// kernel keeps CD_MAX_INFLIGHT return states; anything older lost its exit.
constexpr size_t kMaxPendingLeaves = 2 * CD_MAX_INFLIGHT;
// Placeholders past max_depth still go on the stack (for the sp rule) up to
// this many extra levels; beyond it the stack stops growing (bounded memory
// against a stream whose sp never shrinks, e.g. fibers switching stacks).
constexpr size_t kExtraStack = 1024;
// Open context links per thread (Python frames are at most CD_MAX_PY_FRAMES;
// the rest are scopes): beyond it, scopes whose ends never came stop piling up.
constexpr size_t kMaxCtxLinks = 4 * CD_MAX_PY_FRAMES;

// A frame when there is no resolver: counted, never named.
const PyFrameInfo kUnresolved{};

bool is_scope_role(cd_role r) {
    return r == CD_ROLE_SCOPE_LABEL || r == CD_ROLE_SCOPE_BEGIN || r == CD_ROLE_SCOPE_END;
}

// A stack that shows the whole Python side of the thread: one cut at
// max_frames or by a fault lacks the outermost frames, so its depths and
// its root module cannot be compared with other stacks'.
bool stack_complete(const CallEnter& e) {
    return e.py_status == CD_PY_NO_TSTATE || (e.py_status == CD_PY_OK && !(e.ctx_flags & CD_CTX_TRUNCATED));
}

std::string module_fqn(PyContextResolver* res, uint32_t pid, uint64_t root, uint64_t module) {
    if (root == 0) return "<unknown>";
    if (module == root) return "<root>";
    std::optional<std::string> path = res ? res->module_path(pid, root, module) : std::nullopt;
    if (!path) return "<unknown>";
    return path->empty() ? "<root>" : *path;
}

RecordKind kind_of(cd_role role) {
    switch (role) {
    case CD_ROLE_COLLECTIVE:
    case CD_ROLE_COMM_INIT:
    case CD_ROLE_COMM_SPLIT:
    case CD_ROLE_COMM_END: return RecordKind::Collective;
    case CD_ROLE_ANNOTATION: return RecordKind::Module;
    default: return RecordKind::Op;
    }
}

// A stack word the kernel did not read (CD_TRACE_STACK_ARGS) has no value.
bool slot_value(const CallEnter& e, uint8_t slot, uint64_t& out) {
    if (slot >= CD_NUM_ARGS || (slot >= CD_REG_SLOTS && !e.stack_args)) return false;
    out = e.args[slot];
    return true;
}

}  // namespace

const char* to_string(RecordKind k) {
    switch (k) {
    case RecordKind::Collective: return "Collective";
    case RecordKind::Op: return "Op";
    case RecordKind::Module: return "Module";
    case RecordKind::Scope: return "Scope";
    }
    return "?";
}

const char* to_string(DropCause c) {
    switch (c) {
    case DropCause::Budget: return "budget";
    case DropCause::Depth: return "depth";
    }
    return "?";
}

std::string coll_key(std::string_view layer, cd_coll coll) {
    std::string k(layer);
    k += '.';
    k += coll_name(coll);
    return k;
}

std::optional<uint64_t> host_enqueue_ns(const Record& r) {
    if (!r.has(kReturnProbed) || !r.has(kHasRet) || r.end_ns < r.start_ns) return std::nullopt;
    return r.end_ns - r.start_ns;
}

// ---- ProcessTree ----------------------------------------------------------

std::vector<uint32_t> ProcessTree::threads() const {
    std::vector<uint32_t> out;
    for (const auto& [tid, th] : threads_)
        if (th.seen) out.push_back(tid);
    std::sort(out.begin(), out.end());
    return out;
}

std::map<std::string, uint64_t> ProcessTree::coll_counts() const {
    std::map<std::string, uint64_t> out;
    for (uint32_t id = 0; id < calls_.size(); ++id) {
        const SymbolInfo* s = syms_->find(id);
        if (calls_[id] == 0 || !s || s->role != CD_ROLE_COLLECTIVE) continue;
        out[coll_key(s->layer, s->coll)] += calls_[id];
    }
    return out;
}

std::optional<std::string> ProcessTree::incomplete_warning() const {
    uint64_t lost = dropped_total();
    if (lost == 0) return std::nullopt;
    uint64_t total = lost + records_.size();
    return "record tree incomplete: " + std::to_string(lost) + " of " + std::to_string(total) +
           " calls not retained (budget: " + std::to_string(dropped(DropCause::Budget)) +
           ", depth: " + std::to_string(dropped(DropCause::Depth)) + ")";
}

size_t ProcessTree::memory_bytes() const {
    size_t n = records_.capacity() * sizeof(Record) + roots_.capacity() * sizeof(uint32_t) +
               calls_.capacity() * sizeof(uint64_t);
    // Hash and tree nodes: key + value + two pointers (next / cached hash), roughly.
    constexpr size_t kNode = 2 * sizeof(void*);
    n += threads_.bucket_count() * sizeof(void*);
    for (const auto& [tid, th] : threads_)
        n += sizeof(tid) + sizeof(th) + kNode + th.stack.capacity() * sizeof(Frame) +
             th.pending.capacity() * sizeof(PendingLeaf) + th.ctx.capacity() * sizeof(CtxLink) +
             th.pending_label.capacity();
    n += text_index_.bucket_count() * sizeof(void*) + texts_.capacity() * sizeof(void*);
    for (const auto& [text, id] : text_index_) n += sizeof(text) + text.capacity() + sizeof(id) + kNode;
    n += frame_index_.bucket_count() * sizeof(void*) +
         frame_index_.size() * (sizeof(FrameKey) + sizeof(uint32_t) + kNode) +
         frame_rows_.capacity() * sizeof(PyFrameRow);
    n += stack_index_.bucket_count() * sizeof(void*) + stack_index_.size() * (2 * sizeof(uint64_t) + kNode) +
         stacks_.capacity() * sizeof(PyStack) + stack_frames_.capacity() * sizeof(uint32_t);
    n += module_index_.size() * (4 * sizeof(uint32_t) + 3 * sizeof(void*)) + modules_.capacity() * sizeof(ModuleInfo);
    return n;
}

ProcessTree::ThreadState& ProcessTree::thread(uint32_t tid) {
    if (last_thread_ && last_tid_ == tid) return *last_thread_;
    last_thread_ = &threads_[tid];  // node-based: the pointer survives rehashing
    last_tid_ = tid;
    return *last_thread_;
}

uint32_t ProcessTree::append(Record r, ThreadState& th) {
    auto idx = static_cast<uint32_t>(records_.size());
    // The parent: the more recently opened of the nearest retained native
    // frame (placeholders are skipped, see model.hpp) and the innermost
    // retained context link.  Records are appended in entry order, so the
    // larger index is the more recent.
    uint32_t* last_child = nullptr;
    for (auto it = th.stack.rbegin(); it != th.stack.rend(); ++it) {
        if (it->rec == kNoRecord) continue;
        r.parent = it->rec, last_child = &it->last_child;
        break;
    }
    for (auto it = th.ctx.rbegin(); it != th.ctx.rend(); ++it) {
        if (it->rec == kNoRecord) continue;
        if (r.parent == kNoRecord || it->rec > r.parent) r.parent = it->rec, last_child = &it->last_child;
        break;
    }
    if (r.parent == kNoRecord) {
        roots_.push_back(idx);
    } else {
        if (*last_child == kNoRecord)
            records_[r.parent].first_child = idx;
        else
            records_[*last_child].next_sibling = idx;
        *last_child = idx;
    }
    records_.push_back(r);
    return idx;
}

void ProcessTree::end_link(const CtxLink& l, uint64_t ts, bool inferred) {
    if (l.rec == kNoRecord || records_[l.rec].end_ns != 0) return;
    records_[l.rec].end_ns = ts;
    if (inferred) records_[l.rec].flags |= kEndInferred;
}

void ProcessTree::close_all(uint64_t ts) {
    for (auto& [tid, th] : threads_) {
        for (const Frame& f : th.stack) {
            if (f.rec == kNoRecord) continue;
            Record& r = records_[f.rec];
            if (r.end_ns == 0) {
                r.end_ns = ts;
                r.flags |= kEndInferred | kEndAtExit;
            }
        }
        for (const CtxLink& l : th.ctx) {
            if (l.rec == kNoRecord || records_[l.rec].end_ns != 0) continue;
            records_[l.rec].end_ns = ts;
            records_[l.rec].flags |= kEndInferred | kEndAtExit;
        }
        th.stack.clear();
        th.pending.clear();
        th.ctx.clear();
    }
}

void ProcessTree::reset_window() {
    // Capacity is kept: it is bounded by the budget, and the next window
    // would grow back to it through reallocations and page faults.
    records_.clear();
    roots_.clear();
    calls_.clear();
    dropped_ = {};
    unmatched_exits_ = unknown_symbols_ = calls_seen_ = nested_collectives_ = 0;
    for (auto& [tid, th] : threads_) {
        th.seen = false;
        for (Frame& f : th.stack) f.rec = f.last_child = kNoRecord;
        for (PendingLeaf& p : th.pending) p.rec = kNoRecord;
        for (CtxLink& l : th.ctx) l.rec = l.last_child = kNoRecord;
    }
    // Only records refer to interned context; the last root stays (modules
    // of the next window are named from it).
    text_index_.clear();
    texts_.clear();
    frame_index_.clear();
    frame_rows_.clear();
    stack_index_.clear();
    stacks_.clear();
    stack_frames_.clear();
    module_index_.clear();
    modules_.clear();
}

// ---- ProcessTree: framework context ---------------------------------------

size_t ProcessTree::FrameKeyHash::operator()(const FrameKey& k) const {
    uint64_t h = (uint64_t{k.qualname} << 32 | k.file) * 0x9e3779b97f4a7c15ull;
    h ^= (uint64_t{k.line} << 2 | uint64_t{k.known} << 1 | uint64_t{k.library}) + (h >> 29);
    return static_cast<size_t>(h * 0xbf58476d1ce4e5b9ull);
}

uint32_t ProcessTree::intern_text(std::string_view s) {
    if (auto it = text_index_.find(s); it != text_index_.end()) return it->second;
    auto id = static_cast<uint32_t>(texts_.size());
    auto [it, added] = text_index_.emplace(std::string(s), id);
    texts_.push_back(&it->first);
    return id;
}

uint32_t ProcessTree::intern_frame(const PyFrameInfo& f) {
    FrameKey k{intern_text(f.qualname), intern_text(f.file), f.line, f.known, f.library};
    auto [it, added] = frame_index_.emplace(k, static_cast<uint32_t>(frame_rows_.size()));
    if (added) frame_rows_.push_back({k.qualname, k.file, k.line, k.known, k.library});
    return it->second;
}

uint32_t ProcessTree::intern_stack(std::span<const PyFrameInfo* const> frames, uint16_t status, uint16_t flags) {
    // The new stack's frames go at the end of the list; a stack seen before
    // takes them back.
    const size_t first = stack_frames_.size();
    const size_t len = std::min<size_t>(frames.size(), 0xffff);
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t{status} << 16 | flags);
    for (size_t i = 0; i < len; ++i) {
        uint32_t id = intern_frame(*frames[i]);
        stack_frames_.push_back(id);
        h = (h ^ id) * 0x100000001b3ull;
    }
    auto same = [&](const PyStack& s) {
        return s.len == len && s.status == status && s.flags == flags &&
               std::equal(stack_frames_.begin() + s.first, stack_frames_.begin() + s.first + len,
                          stack_frames_.begin() + first);
    };
    for (auto [it, end] = stack_index_.equal_range(h); it != end; ++it) {
        if (!same(stacks_[it->second])) continue;
        stack_frames_.resize(first);
        return it->second;
    }
    auto id = static_cast<uint32_t>(stacks_.size());
    stacks_.push_back({static_cast<uint32_t>(first), static_cast<uint16_t>(len), status, flags});
    stack_index_.emplace(h, id);
    return id;
}

uint32_t ProcessTree::intern_module(std::string_view fqn, std::string_view cls) {
    std::pair key{intern_text(fqn), intern_text(cls)};
    auto [it, added] = module_index_.emplace(key, static_cast<uint32_t>(modules_.size()));
    if (added) modules_.push_back({key.first, key.second});
    return it->second;
}

std::string_view ProcessTree::context_name(const Record& r) const {
    if (r.ctx == kNoCtx) return {};
    if (r.kind == RecordKind::Scope) return text(r.ctx);
    if (r.kind == RecordKind::Module) return text(modules_[r.ctx].fqn);
    return {};
}

std::string_view ProcessTree::module_class(const Record& r) const {
    if (r.ctx == kNoCtx || r.kind != RecordKind::Module) return {};
    return text(modules_[r.ctx].module_class);
}

bool ProcessTree::nested_in_collective(const Record& r) const {
    for (uint32_t a = r.parent; a != kNoRecord; a = records_[a].parent) {
        const SymbolInfo* s = syms_->find(records_[a].sym);
        if (s && s->role == CD_ROLE_COLLECTIVE) return true;
    }
    return false;
}

std::map<std::string, ProcessTree::ModuleCommCounts> ProcessTree::module_comm_counts() const {
    std::map<std::string, ModuleCommCounts> out;
    std::vector<std::pair<uint32_t, bool>> counted;  // (fqn, backward): a recursive module counts once
    for (const Record& r : records_) {
        const SymbolInfo* s = syms_->find(r.sym);
        if (!s || s->role != CD_ROLE_COLLECTIVE || nested_in_collective(r)) continue;
        const std::string key = coll_key(s->layer, s->coll);
        counted.clear();
        for (uint32_t a = r.parent; a != kNoRecord; a = records_[a].parent) {
            const Record& m = records_[a];
            if (m.kind != RecordKind::Module || m.ctx == kNoCtx) continue;
            std::pair id{modules_[m.ctx].fqn, m.has(kBackward)};
            if (std::find(counted.begin(), counted.end(), id) != counted.end()) continue;
            counted.push_back(id);
            ModuleCommCounts& c = out[std::string(text(id.first))];
            ++(id.second ? c.backward : c.forward)[key];
        }
    }
    return out;
}

// ---- TraceModel -----------------------------------------------------------

TraceModel::TraceModel(const SymbolTable& syms, ModelLimits limits)
    : syms_(syms), limits_(limits) {}

ProcessTree& TraceModel::proc(uint32_t tgid) {
    if (last_proc_ && last_tgid_ == tgid) return *last_proc_;
    auto& slot = procs_[tgid];
    if (!slot) slot = std::make_unique<ProcessTree>(tgid, syms_);
    last_tgid_ = tgid;
    last_proc_ = slot.get();
    return *last_proc_;
}

const ProcessTree* TraceModel::process(uint32_t tgid) const {
    auto it = procs_.find(tgid);
    return it == procs_.end() ? nullptr : it->second.get();
}

std::vector<uint32_t> TraceModel::pids() const {
    std::vector<uint32_t> out;
    out.reserve(procs_.size());
    for (const auto& [pid, p] : procs_) out.push_back(pid);
    std::sort(out.begin(), out.end());
    return out;
}

void TraceModel::reset() {
    for (auto it = procs_.begin(); it != procs_.end();) {
        if (it->second->exited()) {
            it = procs_.erase(it);
        } else {
            it->second->reset_window();
            ++it;
        }
    }
    last_proc_ = nullptr;
}

void TraceModel::on_event(const Event& ev) {
    std::visit(
        [this](const auto& e) {
            using T = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<T, CallEnter>) {
                on_enter(e);
            } else if constexpr (std::is_same_v<T, CallExit>) {
                on_exit(e);
            } else if constexpr (std::is_same_v<T, Call>) {
                on_enter(e.enter);
                on_exit(e.exit);
            } else if constexpr (std::is_same_v<T, ProcFork>) {
                ProcessTree& p = proc(e.tgid);
                p.parent_pid_ = e.parent_tgid;
            } else if constexpr (std::is_same_v<T, ProcExit>) {
                ProcessTree& p = proc(e.tgid);
                p.close_all(e.ts_ns);
                p.exit_code_ = e.exit_code;
                // Interned names are copies: what the resolver holds can go.
                if (resolver_) resolver_->forget(e.tgid);
            }
            // DlChange: the session's business (re-attach), not the tree's.
        },
        ev);
}

void TraceModel::on_enter(const CallEnter& e) {
    ProcessTree& p = proc(e.tgid);
    uint32_t sym = CD_COOKIE_SYM(e.cookie);
    const SymbolInfo* info = syms_.find(sym);
    if (!info) {
        ++p.unknown_symbols_;
        return;
    }
    ++p.calls_seen_;
    if (sym >= p.calls_.size()) p.calls_.resize(std::max<size_t>(sym + 1, 2 * p.calls_.size()));
    ++p.calls_[sym];

    ProcessTree::ThreadState& th = p.thread(e.tid);
    th.seen = true;
    pop_returned(p, th, e);

    cd_role role = info->role;
    if (role == CD_ROLE_GROUP_START || role == CD_ROLE_GROUP_END) return;
    resolve_frames(e);
    if (stack_complete(e)) update_context(p, th, e);
    bool collective = role == CD_ROLE_COLLECTIVE;
    if (collective && !th.stack.empty() && th.stack.back().collective) ++p.nested_collectives_;

    // Scope markers are not calls to show: what they open is a Scope record.
    uint32_t idx = kNoRecord;
    if (is_scope_role(role))
        on_scope(p, th, e, *info);
    else
        idx = add_call(p, th, e, *info);

    if (info->return_probe) {
        if (th.pending.size() >= kMaxPendingLeaves) th.pending.erase(th.pending.begin());
        th.pending.push_back({e.sp, e.cookie, e.ts_ns, idx});
    } else if (th.stack.size() < limits_.max_depth + kExtraStack) {
        th.stack.push_back({e.sp, idx, kNoRecord, collective});
    }
}

void TraceModel::pop_returned(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e) {
    // Which open frames have returned: the kernel knows, having checked each
    // frame's return-address slot (a later sibling may enter at a deeper sp).
    // Without its depth, the sp rule: a frame at or above the new sp returned.
    auto returned = [&] {
        if (e.frame_depth != CD_DEPTH_UNKNOWN) return th.stack.size() > e.frame_depth;
        return !th.stack.empty() && th.stack.back().sp <= e.sp;
    };
    while (returned()) {
        uint32_t rec = th.stack.back().rec;
        if (rec != kNoRecord && p.records_[rec].end_ns == 0) {
            p.records_[rec].end_ns = e.ts_ns;
            p.records_[rec].flags |= kEndInferred;
        }
        th.stack.pop_back();
    }
    // A pending leaf at or above this sp returned too; its exit was lost.
    std::erase_if(th.pending, [&](const auto& l) { return l.sp <= e.sp; });
}

// Whether a new record fits the budget and the depth limit; counts the drop
// when not.  A record's depth is its native frames plus its context links.
bool TraceModel::admit(ProcessTree& p, const ProcessTree::ThreadState& th) {
    if (p.records_.size() >= limits_.max_records) {
        ++p.dropped_[static_cast<size_t>(DropCause::Budget)];
        return false;
    }
    if (th.stack.size() + th.ctx.size() >= limits_.max_depth) {
        ++p.dropped_[static_cast<size_t>(DropCause::Depth)];
        return false;
    }
    // Grow to at most the budget: a full tree holds no slack capacity.
    if (p.records_.size() == p.records_.capacity())
        p.records_.reserve(std::min(limits_.max_records, std::max<size_t>(64, 2 * p.records_.capacity())));
    return true;
}

uint32_t TraceModel::add_call(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e,
                              const SymbolInfo& info) {
    if (!admit(p, th)) return kNoRecord;
    Record r;
    r.start_ns = e.ts_ns;
    r.sym = CD_COOKIE_SYM(e.cookie);
    r.tid = e.tid;
    r.kind = kind_of(info.role);
    r.coll = static_cast<uint8_t>(info.coll);
    r.group_depth = static_cast<uint16_t>(std::min<uint32_t>(e.group_depth, 0xffff));
    const ArgSlots& s = info.slots;
    uint64_t v = 0;
    if (slot_value(e, s.count, v)) r.count = v, r.flags |= kHasCount;
    if (slot_value(e, s.dtype, v)) r.dtype = static_cast<uint32_t>(v), r.flags |= kHasDtype;
    if (slot_value(e, s.redop, v)) r.redop = static_cast<uint32_t>(v), r.flags |= kHasRedop;
    if (slot_value(e, s.peer, v)) r.peer = static_cast<int32_t>(v), r.flags |= kHasPeer;
    if (slot_value(e, s.comm, v)) r.comm = v, r.flags |= kHasComm;
    if (slot_value(e, s.stream, v)) r.stream = v, r.flags |= kHasStream;
    if (slot_value(e, s.sendbuf, v)) r.sendbuf = v, r.flags |= kHasSendBuf;
    if (slot_value(e, s.recvbuf, v)) r.recvbuf = v, r.flags |= kHasRecvBuf;
    if (info.return_probe) r.flags |= kReturnProbed;
    if (e.py_status != CD_PY_NONE) r.stack = p.intern_stack(frames_, e.py_status, e.ctx_flags);
    return p.append(r, th);
}

// ---- TraceModel: framework context ----------------------------------------

void TraceModel::resolve_frames(const CallEnter& e) {
    frames_.clear();
    if (e.py_status == CD_PY_NONE) return;
    for (const cd_py_frame& f : e.py_frames)
        frames_.push_back(resolver_ ? &resolver_->frame(e.tgid, f) : &kUnresolved);
}

// The modules the record's stack shows, outermost first: nn.Module calls
// outside the innermost autograd entry run forward; frames of a module
// inside it (hooks, autograd functions) run on behalf of its gradients.
// A module's depth is its outermost frame's position from the outermost
// frame (1-based); the frames of one call (_wrapped_call_impl, _call_impl)
// are one module.
void TraceModel::want_modules(ProcessTree& p) {
    want_.clear();
    const size_t n = frames_.size();
    size_t entry = n;
    for (size_t i = 0; i < n && entry == n; ++i)
        if (frames_[i]->kind == PyFrameKind::BackwardEntry) entry = i;
    for (size_t i = n; i-- > 0;) {
        const PyFrameInfo& f = *frames_[i];
        bool backward = entry < n && i < entry;
        if (f.module == 0 || (!backward && f.kind != PyFrameKind::ModuleCall)) continue;
        if (!want_.empty() && want_.back().module == f.module && want_.back().backward == backward) continue;
        want_.push_back({f.module, static_cast<uint32_t>(n - i), backward, &f});
    }
    if (!want_.empty() && !want_.front().backward) p.last_root_ = want_.front().module;
}

// The thread's chain becomes the record's modules merged with its open
// scopes by depth (a module at a scope's depth called the code that opened
// it: outside).  The common prefix stays; the rest of the old chain ends
// where this record starts (a scope among it lost its end: it ends too), and
// the new modules open.
void TraceModel::update_context(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e) {
    want_modules(p);
    desired_.clear();
    size_t w = 0;
    for (uint32_t i = 0; i < th.ctx.size(); ++i) {
        if (!th.ctx[i].scope) continue;
        for (; w < want_.size() && want_[w].depth <= th.ctx[i].depth; ++w) desired_.push_back({false, uint32_t(w)});
        desired_.push_back({true, i});
    }
    for (; w < want_.size(); ++w) desired_.push_back({false, uint32_t(w)});

    auto same = [&](const ProcessTree::CtxLink& l, const Desired& d) {
        if (d.scope) return l.scope && &l == &th.ctx[d.idx];
        const WantModule& m = want_[d.idx];
        return !l.scope && l.key == m.module && l.backward == m.backward && l.depth == m.depth;
    };
    size_t keep = 0;
    while (keep < th.ctx.size() && keep < desired_.size() && same(th.ctx[keep], desired_[keep])) ++keep;
    for (size_t i = th.ctx.size(); i-- > keep;) p.end_link(th.ctx[i], e.ts_ns, true);
    th.ctx.resize(keep);
    for (size_t i = keep; i < desired_.size(); ++i)
        if (!desired_[i].scope) open_module(p, th, e, desired_[i].idx);
}

void TraceModel::open_module(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e, size_t want) {
    if (th.ctx.size() >= kMaxCtxLinks) return;
    const WantModule& m = want_[want];
    uint32_t rec = kNoRecord;
    if (admit(p, th)) {
        Record r;
        r.start_ns = e.ts_ns;
        r.sym = kNoSym;
        r.tid = e.tid;
        r.kind = RecordKind::Module;
        if (m.backward) r.flags |= kBackward;
        // Backward frames show no root: name them from the last forward's.
        std::string fqn = module_fqn(resolver_, e.tgid, p.last_root_, m.module);
        r.ctx = p.intern_module(fqn, m.frame->module_class);
        rec = p.append(r, th);
    }
    th.ctx.push_back({m.module, m.depth, rec, kNoRecord, false, m.backward});
}

void TraceModel::on_scope(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e, const SymbolInfo& info) {
    uint64_t v = 0;
    switch (info.role) {
    case CD_ROLE_SCOPE_LABEL:
        th.pending_label = e.label;
        th.has_label = true;
        break;
    case CD_ROLE_SCOPE_BEGIN:
        // RecordScope is a uint8_t enum: only the register's low byte is the argument.
        if (slot_value(e, info.slots.peer, v) && (v & 0xff) == kUserScope) begin_scope(p, th, e, info);
        break;
    case CD_ROLE_SCOPE_END:
        if (slot_value(e, info.slots.count, v)) end_scope(p, th, v, e.ts_ns);
        break;
    default: break;
    }
}

// The label: torch >= 2 sends it just before (record_function_enter_new);
// torch 1.13 only shows it as the name of the record_function whose
// __enter__ is on the stack.  The scope's depth is that of the frame that
// entered it: the frames outside the innermost __enter__.
void TraceModel::begin_scope(ProcessTree& p, ProcessTree::ThreadState& th, const CallEnter& e, const SymbolInfo& info) {
    const PyFrameInfo* enter = nullptr;
    size_t at = 0;
    for (; at < frames_.size() && !enter; ++at)
        if (frames_[at]->kind == PyFrameKind::RecordFunctionEnter) enter = frames_[at];
    uint64_t self = 0;
    slot_value(e, info.slots.count, self);
    std::string label = "<unnamed>";
    if (th.has_label) {
        label = std::move(th.pending_label), th.has_label = false;
    } else if (!e.label.empty()) {
        label = e.label;  // read by the kernel from the record_function object (torch 1.13)
    } else if (enter) {
        // Read at ingest from the record_function object: its own only if the
        // scope is still open now (see set_scope_check).
        if (!enter->label.empty() && (!scope_open_ || scope_open_(e.tgid, self))) label = enter->label;
    } else if (e.py_status != CD_PY_NONE) {
        // No label and no record_function on the stack: a RecordFunction of
        // torch's own (c10d's Work around each collective), not a user scope.
        return;
    }
    uint32_t depth = th.ctx.empty() ? 0 : th.ctx.back().depth;  // no usable stack: innermost
    if (stack_complete(e)) depth = static_cast<uint32_t>(enter ? frames_.size() - at : frames_.size());
    if (th.ctx.size() >= kMaxCtxLinks) return;

    uint32_t rec = kNoRecord;
    if (admit(p, th)) {
        Record r;
        r.start_ns = e.ts_ns;
        r.sym = CD_COOKIE_SYM(e.cookie);
        r.tid = e.tid;
        r.kind = RecordKind::Scope;
        r.ctx = p.intern_text(label);
        if (e.py_status != CD_PY_NONE) r.stack = p.intern_stack(frames_, e.py_status, e.ctx_flags);
        rec = p.append(r, th);
    }
    th.ctx.push_back({self, depth, rec, kNoRecord, true, false});
}

// An end of a scope this thread opened closes it and what it still holds
// open (scopes whose ends were lost, modules called inside); any other end
// belongs to a RecordFunction that is no scope here (the dispatcher's, with
// a profiler on).
void TraceModel::end_scope(ProcessTree& p, ProcessTree::ThreadState& th, uint64_t self, uint64_t ts) {
    auto it = std::find_if(th.ctx.rbegin(), th.ctx.rend(), [&](const auto& l) { return l.scope && l.key == self; });
    if (it == th.ctx.rend()) return;
    size_t at = static_cast<size_t>(th.ctx.rend() - it) - 1;
    for (size_t i = th.ctx.size(); i-- > at + 1;) p.end_link(th.ctx[i], ts, true);
    p.end_link(th.ctx[at], ts, false);
    th.ctx.resize(at);
}

void TraceModel::on_exit(const CallExit& e) {
    ProcessTree& p = proc(e.tgid);
    const SymbolInfo* info = syms_.from_cookie(e.cookie);
    if (info && (info->role == CD_ROLE_GROUP_START || info->role == CD_ROLE_GROUP_END)) return;
    ProcessTree::ThreadState& th = p.thread(e.tid);
    th.seen = true;
    auto it = std::find_if(th.pending.rbegin(), th.pending.rend(), [&](const auto& l) {
        return l.cookie == e.cookie && l.enter_ts == e.enter_ts_ns;
    });
    if (it == th.pending.rend()) {
        ++p.unmatched_exits_;
        return;
    }
    if (it->rec != kNoRecord) {
        Record& r = p.records_[it->rec];
        r.end_ns = e.ts_ns;
        r.ret = e.ret;
        r.flags |= kHasRet;
        if (info && info->slots.out < CD_NUM_ARGS && e.out_value != 0) {
            r.new_comm = e.out_value;
            r.flags |= kHasNewComm;
        }
    }
    th.pending.erase(std::next(it).base());
}

}  // namespace commdbg
