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

bool slot_value(const CallEnter& e, uint8_t slot, uint64_t& out) {
    if (slot >= CD_NUM_ARGS) return false;
    out = e.args[slot];
    return true;
}

}  // namespace

const char* to_string(RecordKind k) {
    switch (k) {
    case RecordKind::Collective: return "Collective";
    case RecordKind::Op: return "Op";
    case RecordKind::Module: return "Module";
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
    // unordered_map node: key + value + next pointer + cached hash, roughly.
    n += threads_.bucket_count() * sizeof(void*);
    for (const auto& [tid, th] : threads_)
        n += sizeof(tid) + sizeof(th) + 2 * sizeof(void*) + th.stack.capacity() * sizeof(Frame) +
             th.pending.capacity() * sizeof(PendingLeaf);
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
    // Nearest retained ancestor; placeholders are skipped (see model.hpp).
    for (auto it = th.stack.rbegin(); it != th.stack.rend(); ++it) {
        if (it->rec == kNoRecord) continue;
        r.parent = it->rec;
        if (it->last_child == kNoRecord)
            records_[it->rec].first_child = idx;
        else
            records_[it->last_child].next_sibling = idx;
        it->last_child = idx;
        break;
    }
    if (r.parent == kNoRecord) roots_.push_back(idx);
    records_.push_back(r);
    return idx;
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
        th.stack.clear();
        th.pending.clear();
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
    }
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

    cd_role role = info->role;
    if (role == CD_ROLE_GROUP_START || role == CD_ROLE_GROUP_END) return;
    bool collective = role == CD_ROLE_COLLECTIVE;
    if (collective && !th.stack.empty() && th.stack.back().collective) ++p.nested_collectives_;

    uint32_t idx = kNoRecord;
    if (p.records_.size() >= limits_.max_records) {
        ++p.dropped_[static_cast<size_t>(DropCause::Budget)];
    } else if (th.stack.size() >= limits_.max_depth) {
        ++p.dropped_[static_cast<size_t>(DropCause::Depth)];
    } else {
        Record r;
        r.start_ns = e.ts_ns;
        r.sym = sym;
        r.tid = e.tid;
        r.kind = kind_of(role);
        r.coll = static_cast<uint8_t>(info->coll);
        r.group_depth = static_cast<uint16_t>(std::min<uint32_t>(e.group_depth, 0xffff));
        const ArgSlots& s = info->slots;
        uint64_t v = 0;
        if (slot_value(e, s.count, v)) r.count = v, r.flags |= kHasCount;
        if (slot_value(e, s.dtype, v)) r.dtype = static_cast<uint32_t>(v), r.flags |= kHasDtype;
        if (slot_value(e, s.redop, v)) r.redop = static_cast<uint32_t>(v), r.flags |= kHasRedop;
        if (slot_value(e, s.peer, v)) r.peer = static_cast<int32_t>(v), r.flags |= kHasPeer;
        if (slot_value(e, s.comm, v)) r.comm = v, r.flags |= kHasComm;
        if (slot_value(e, s.stream, v)) r.stream = v, r.flags |= kHasStream;
        if (slot_value(e, s.sendbuf, v)) r.sendbuf = v, r.flags |= kHasSendBuf;
        if (slot_value(e, s.recvbuf, v)) r.recvbuf = v, r.flags |= kHasRecvBuf;
        if (info->return_probe) r.flags |= kReturnProbed;
        // Grow to at most the budget: a full tree holds no slack capacity.
        if (p.records_.size() == p.records_.capacity())
            p.records_.reserve(std::min(limits_.max_records,
                                        std::max<size_t>(64, 2 * p.records_.capacity())));
        idx = p.append(r, th);
    }

    if (info->return_probe) {
        if (th.pending.size() >= kMaxPendingLeaves) th.pending.erase(th.pending.begin());
        th.pending.push_back({e.sp, e.cookie, e.ts_ns, idx});
    } else if (th.stack.size() < limits_.max_depth + kExtraStack) {
        th.stack.push_back({e.sp, idx, kNoRecord, collective});
    }
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
