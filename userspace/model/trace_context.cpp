// SPDX-License-Identifier: Apache-2.0
// TraceModel's framework context: a record's Python frames named through the
// resolver, the nn.Module chain they show and record_function scopes, kept
// per thread as context links that records nest under.
#include <algorithm>
#include <tuple>

#include "model.hpp"

namespace commdbg::model {

namespace {

// Open context links per thread (Python frames are at most CD_MAX_PY_FRAMES;
// the rest are scopes): beyond it, scopes whose ends never came stop piling up.
constexpr size_t kMaxCtxLinks = 4 * CD_MAX_PY_FRAMES;
// Submodules below a module seen whose parameters are read (the module tree's own bound).
constexpr size_t kMaxParamDepth = 32;
// Reads of a module whose parameters are not readable yet (FSDP2 before its
// first unshard) before what could be read is kept.
constexpr uint32_t kMaxParamRetries = 8;

// A frame when there is no resolver: counted, never named.
const python::PyFrameInfo kUnresolved{};

std::string module_fqn(python::PyContextResolver* res, uint32_t pid, uint64_t root, uint64_t module) {
    if (root == 0) return "<unknown>";
    if (module == root) return "<root>";
    std::optional<std::string> path = res ? res->module_path(pid, root, module) : std::nullopt;
    if (!path) return "<unknown>";
    return path->empty() ? "<root>" : *path;
}

}  // namespace

// ---- TraceModel: framework context ----------------------------------------

void TraceModel::resolve_frames(const capture::CallEnter& e) {
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
        if (frames_[i]->kind == python::PyFrameKind::BackwardEntry) entry = i;
    for (size_t i = n; i-- > 0;) {
        const python::PyFrameInfo& f = *frames_[i];
        bool backward = entry < n && i < entry;
        if (f.module == 0 || (!backward && f.kind != python::PyFrameKind::ModuleCall)) continue;
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
// `entering`: the event is a module call's entry (CD_ROLE_MODULE_ENTER), its
// innermost frame nn.Module._call_impl.  That module's call is a new one even
// where its link looks the same (the same module called again, or a sibling
// whose frame CPython placed where the last one's was): its old link and
// what is deeper end here; the new call's link opens with its first record.
void TraceModel::update_context(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                                bool entering) {
    want_modules(p);
    const bool from_call_impl = !frames_.empty() && frames_[0]->kind == python::PyFrameKind::ModuleCall;
    const WantModule* entered = entering && from_call_impl && !want_.empty() ? &want_.back() : nullptr;
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
        return &m != entered && !l.scope && l.key == m.module && l.backward == m.backward && l.depth == m.depth;
    };
    size_t keep = 0;
    while (keep < th.ctx.size() && keep < desired_.size() && same(th.ctx[keep], desired_[keep])) ++keep;
    for (size_t i = th.ctx.size(); i-- > keep;) p.end_link(th.ctx[i], e.ts_ns, true);
    th.ctx.resize(keep);
    if (entering) return;
    for (size_t i = keep; i < desired_.size(); ++i)
        if (!desired_[i].scope) open_module(p, th, e, desired_[i].idx);
}

void TraceModel::open_module(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e, size_t want) {
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
        if (params_ && !m.backward && fqn != "<unknown>") read_parameters(p, e.tgid, fqn, m.module);
    }
    th.ctx.push_back({m.module, m.depth, rec, kNoRecord, false, m.backward});
}

// As CommDebugMode's forward pre-hook does: a module's own parameters, the
// first time its path runs forward in a window; and those of the modules
// below it (a Linear issues no record of its own to be seen by), depth first
// as named_modules() lists them.
void TraceModel::read_parameters(ProcessTree& p, uint32_t tgid, const std::string& fqn, uint64_t module) {
    std::vector<std::tuple<std::string, uint64_t, size_t>> todo{{fqn, module, 0}};
    while (!todo.empty()) {
        auto [path, m, depth] = std::move(todo.back());
        todo.pop_back();
        if (p.params_tried_.count(path) != 0) continue;
        if (p.params_tried_.size() >= ProcessTree::kMaxParamModules) {
            ++p.params_lost_;
            continue;
        }
        p.params_tried_.emplace(path, true);
        std::optional<torch::ModuleParams> got = params_->module_parameters(tgid, m);
        if (!got) continue;
        if (got->retry && ++p.params_retries_[path] <= kMaxParamRetries) {
            p.params_tried_.erase(path);  // asked again when a record of this module opens
            continue;
        }
        if (depth < kMaxParamDepth)
            for (size_t i = got->children.size(); i-- > 0;) {
                auto& [name, child] = got->children[i];
                todo.emplace_back(path == "<root>" ? name : path + "." + name, child, depth + 1);
            }
        std::vector<std::pair<std::string, uint64_t>>().swap(got->children);
        if (!got->params.empty() || got->unread != 0) p.params_.emplace_back(path, std::move(*got));
    }
}

void TraceModel::on_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                          const capture::SymbolInfo& info) {
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
void TraceModel::begin_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                             const capture::SymbolInfo& info) {
    const python::PyFrameInfo* enter = nullptr;
    size_t at = 0;
    for (; at < frames_.size() && !enter; ++at)
        if (frames_[at]->kind == python::PyFrameKind::RecordFunctionEnter) enter = frames_[at];
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
    if (py_stack_complete(e)) depth = static_cast<uint32_t>(enter ? frames_.size() - at : frames_.size());
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

}  // namespace commdbg::model
