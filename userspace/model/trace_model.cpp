// SPDX-License-Identifier: Apache-2.0
// TraceModel: events in, per-process record trees out.  Entries open records
// (within the budget and depth), the sp rule or the kernel's frame depth
// closes them, exits complete return-probed ones; the framework context
// (modules, scopes) is trace_context.cpp's.
#include <algorithm>
#include <type_traits>

#include "model.hpp"

namespace commdbg::model {

namespace {

// Pending leaves per thread: NCCL calls do not nest through their API, and the
// kernel keeps CD_MAX_INFLIGHT return states; anything older lost its exit.
constexpr size_t kMaxPendingLeaves = 2 * CD_MAX_INFLIGHT;
// Placeholders past max_depth still go on the stack (for the sp rule) up to
// this many extra levels; beyond it the stack stops growing (bounded memory
// against a stream whose sp never shrinks, e.g. fibers switching stacks).
constexpr size_t kExtraStack = 1024;

bool is_scope_role(cd_role r) {
    return r == CD_ROLE_SCOPE_LABEL || r == CD_ROLE_SCOPE_BEGIN || r == CD_ROLE_SCOPE_END;
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

}  // namespace

// ---- TraceModel -----------------------------------------------------------

TraceModel::TraceModel(const capture::SymbolTable& syms, ModelLimits limits)
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

void TraceModel::on_event(const capture::Event& ev) {
    std::visit(
        [this](const auto& e) {
            using T = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<T, capture::CallEnter>) {
                on_enter(e);
            } else if constexpr (std::is_same_v<T, capture::CallExit>) {
                on_exit(e);
            } else if constexpr (std::is_same_v<T, capture::Call>) {
                on_enter(e.enter);
                on_exit(e.exit);
            } else if constexpr (std::is_same_v<T, capture::ProcFork>) {
                ProcessTree& p = proc(e.tgid);
                p.parent_pid_ = e.parent_tgid;
            } else if constexpr (std::is_same_v<T, capture::ProcExit>) {
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

// The context `e` runs in.  In backward, a RecordFunction that opens no
// scope (the engine's around each node) changes no context: a node's modules
// open with its records.  A scope that names the module backward runs for
// opens that module first.  The RecordFunction of a scope its label opened
// (`after_label`) changes nothing more.
void TraceModel::enter_context(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                               const capture::SymbolInfo& info, bool after_label) {
    begin_unit_.clear();
    const cd_role role = info.role;
    if (!py_stack_complete(e) || (role == CD_ROLE_SCOPE_BEGIN && after_label)) return;
    const bool begin = role == CD_ROLE_SCOPE_BEGIN;
    if (begin && !th.backward.empty() && !opens_scope(e, info)) return;
    if ((begin || role == CD_ROLE_SCOPE_LABEL) && unit_namer_ && !th.backward.empty()) {
        uint64_t self = 0;
        slot_value(e, info.slots.count, self);
        size_t at = 0;
        if (auto unit = unit_namer_(scope_label(e, self, &at)))
            begin_unit_ = std::move(*unit), begin_depth_ = scope_depth(th, e, at);
    }
    update_context(p, th, e);
}

void TraceModel::on_enter(const capture::CallEnter& e) {
    ProcessTree& p = proc(e.tgid);
    uint32_t sym = CD_COOKIE_SYM(e.cookie);
    const capture::SymbolInfo* info = syms_.find(sym);
    if (!info) {
        ++p.unknown_symbols_;
        return;
    }
    ++p.calls_seen_;
    if (sym >= p.calls_.size()) p.calls_.resize(std::max<size_t>(sym + 1, 2 * p.calls_.size()));
    ++p.calls_[sym];

    ProcessTree::ThreadState& th = p.thread(e.tid);
    th.seen = true;
    // A RecordFunction right after a label is the one that label's scope
    // made (torch >= 2 where its constructor is probed): it opens nothing more.
    const bool after_label = std::exchange(th.label_opened, false);
    pop_returned(p, th, e);

    cd_role role = info->role;
    if (role == CD_ROLE_GROUP_START || role == CD_ROLE_GROUP_END) return;
    resolve_frames(e);
    if (role == CD_ROLE_MODULE_ENTER) {  // a boundary, not a call: no record, no native frame
        if (py_stack_complete(e)) update_context(p, th, e, true);
        return;
    }
    // Autograd nodes made and run: points in time that attribute backward, no record.
    if (role == CD_ROLE_GRAD_FN) {
        if (py_stack_complete(e)) on_grad_fn(p, th, e, *info);
        return;
    }
    if (role == CD_ROLE_AUTOGRAD_NODE) {
        on_autograd_node(p, th, e, *info);
        return;
    }
    // A call record after a node began: the node's modules open first, as
    // that node event's stack shows them (this record's may show none).
    if (th.pending_node && !is_scope_role(role)) {
        capture::CallEnter node = std::move(*th.pending_node);
        th.pending_node.reset();
        if (!py_stack_complete(e)) {
            resolve_frames(node);
            update_context(p, th, node);
            resolve_frames(e);
        }
    }
    enter_context(p, th, e, *info, after_label);
    bool collective = role == CD_ROLE_COLLECTIVE;
    if (collective && !th.stack.empty() && th.stack.back().collective) ++p.nested_collectives_;

    // Scope markers are not calls to show: what they open is a Scope record.
    uint32_t idx = kNoRecord;
    if (is_scope_role(role))
        on_scope(p, th, e, *info, after_label);
    else
        idx = add_call(p, th, e, *info);
    if (collective && idx != kNoRecord && in_backward_) credit_backward(p, th, idx);

    if (info->return_probe) {
        if (th.pending.size() >= kMaxPendingLeaves) th.pending.erase(th.pending.begin());
        th.pending.push_back({e.sp, e.cookie, e.ts_ns, idx});
    } else if (th.stack.size() < limits_.max_depth + kExtraStack) {
        th.stack.push_back({e.sp, idx, kNoRecord, collective});
    }
}

void TraceModel::pop_returned(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e) {
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

uint32_t TraceModel::add_call(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                              const capture::SymbolInfo& info) {
    if (!admit(p, th)) return kNoRecord;
    Record r;
    r.start_ns = e.ts_ns;
    r.sym = CD_COOKIE_SYM(e.cookie);
    r.tid = e.tid;
    r.kind = kind_of(info.role);
    r.coll = static_cast<uint8_t>(info.coll);
    r.group_depth = static_cast<uint16_t>(std::min<uint32_t>(e.group_depth, 0xffff));
    const capture::ArgSlots& s = info.slots;
    uint64_t v = 0;
    if (slot_value(e, s.count, v)) r.count = v, r.flags |= kHasCount;
    if (slot_value(e, s.dtype, v)) r.dtype = static_cast<uint32_t>(v), r.flags |= kHasDtype;
    if (!info.redop_is_options && slot_value(e, s.redop, v)) r.redop = static_cast<uint32_t>(v), r.flags |= kHasRedop;
    if (!info.root_is_options && slot_value(e, s.peer, v)) r.peer = static_cast<int32_t>(v), r.flags |= kHasPeer;
    if (slot_value(e, s.comm, v)) r.comm = v, r.flags |= kHasComm;
    if (slot_value(e, s.stream, v)) r.stream = v, r.flags |= kHasStream;
    if (slot_value(e, s.sendbuf, v)) r.sendbuf = v, r.flags |= kHasSendBuf;
    if (slot_value(e, s.recvbuf, v)) r.recvbuf = v, r.flags |= kHasRecvBuf;
    if (info.return_probe) r.flags |= kReturnProbed;
    if (e.py_status != CD_PY_NONE) r.stack = p.intern_stack(th, frames_serial_, frames_, e.py_status, e.ctx_flags);
    if (e.tensors && r.kind == RecordKind::Collective) {
        r.ctx = p.intern_tensors(*e.tensors, layouts_ ? layouts_(e.tgid) : nullptr);
        r.flags |= kHasTensors;
    }
    return p.append(r, th);
}

void TraceModel::on_exit(const capture::CallExit& e) {
    ProcessTree& p = proc(e.tgid);
    const capture::SymbolInfo* info = syms_.from_cookie(e.cookie);
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

}  // namespace commdbg::model
