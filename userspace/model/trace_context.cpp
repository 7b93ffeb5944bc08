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
// first unshard) before what could be read is kept: at a batch of records
// each (TraceSession: 5 ms apart, then twice as far each time up to 2 s, so
// that 16 span ~17 s), or when the module opens again.
constexpr uint32_t kMaxParamRetries = 16;

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
    frames_serial_ = 0;
    if (e.py_status == CD_PY_NONE) return;
    if (resolver_) frames_serial_ = resolver_->stack(e.tgid, e.tid, e.py_frames, frames_);
    else frames_.assign(e.py_frames.size(), &kUnresolved);
}

// The modules the record's stack shows, outermost first: nn.Module calls
// outside the autograd engine's entries run forward.  At each entry the
// engine runs a node on the thread's behalf (backward_runs): the modules
// whose forward made that node run backward, and module calls above it run
// their forward again for it (activation checkpointing: recompute).  Where
// the node is not known, frames of a module inside the entry (hooks, autograd
// functions bound to it) run on behalf of its gradients.  A module's depth is
// its outermost frame's position from the outermost frame (1-based); the
// frames of one call (_wrapped_call_impl, _call_impl) are one module; a
// node's modules sit at its entry's depth.
void TraceModel::want_modules(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e) {
    want_.clear();
    const size_t n = frames_.size();
    backward_runs(th, e);
    auto add_chain = [&](const ProcessTree::BackwardRun& run, uint32_t depth) {
        auto it = p.nodes_.find(run.node);
        if (it == p.nodes_.end()) return false;
        const ProcessTree::Chain& chain = p.chains_[it->second];
        for (const ProcessTree::ChainModule& m : chain) want_.push_back({m.module, depth, true, nullptr, &m});
        if (!chain.empty()) want_.back().node = run.node, want_.back().vtable = run.vtable;
        return true;
    };
    // An engine worker's node: records with no entry and no forward module below.
    bool in_backward = false, node_known = false;
    const auto& runs = th.backward;
    if (!runs.empty() && runs.front().entry_code == 0) {
        bool forward = false;
        for (const python::PyFrameInfo* f : frames_) forward |= f->kind == python::PyFrameKind::ModuleCall;
        if (!forward) in_backward = true, node_known = add_chain(runs.front(), 0);
    }
    size_t r = 0;
    uint32_t entry_depth = 0;
    for (size_t i = n; i-- > 0;) {
        const python::PyFrameInfo& f = *frames_[i];
        if (f.kind == python::PyFrameKind::BackwardEntry) {
            in_backward = true;
            const auto depth = static_cast<uint32_t>(n - i);
            entry_depth = depth;
            while (r < runs.size() && (runs[r].entry_code == 0 || runs[r].entry_depth < depth)) ++r;
            node_known = r < runs.size() && runs[r].entry_depth == depth && add_chain(runs[r], depth);
            continue;
        }
        if (f.module == 0) continue;
        if (f.kind != python::PyFrameKind::ModuleCall && (!in_backward || node_known)) continue;  // the node says
        if (!want_.empty() && want_.back().module == f.module && want_.back().backward == in_backward &&
            want_.back().frame)
            continue;
        want_.push_back({f.module, static_cast<uint32_t>(n - i), in_backward, &f, nullptr,
                         in_backward && f.kind == python::PyFrameKind::ModuleCall && node_known});
    }
    in_backward_ = in_backward;
    if (!in_backward && !want_.empty()) {  // a forward: CommDebugMode's pre-hooks name it
        p.begun_.clear();
        p.begun_before_.clear();
        p.begun_by_ = 0;
    }
    if (in_backward) unit_modules(p, th, entry_depth);
    if (!want_.empty() && !want_.front().backward) p.last_root_ = want_.front().module;
}

// Inside a backward scope that names the module it runs for (FSDP's
// pre-backward, post-backward and gradient reduction of a unit, the
// lifecycle profiles' labels), the outermost such scope's module and those it
// ran in take the place of what the node or the frames say: what runs there
// is that unit's backward, whichever node's hook or callback (the root's final
// callback, after the last node) runs it.  They sit just outside that scope.
void TraceModel::unit_modules(ProcessTree& p, const ProcessTree::ThreadState& th, uint32_t entry_depth) {
    if (!unit_namer_) return;
    std::string_view unit;
    uint32_t depth = 0;
    for (const ProcessTree::CtxLink& l : th.ctx)
        if (l.scope && l.unit != kNoCtx) {
            unit = p.text(l.unit), depth = l.depth;
            break;
        }
    if (unit.empty() && !begin_unit_.empty()) unit = begin_unit_, depth = begin_depth_;
    if (unit.empty() || depth < entry_depth) return;
    uint32_t len = 0;
    const ProcessTree::ChainModule* chain = p.module_chain(unit, len);
    if (!chain) return;
    std::erase_if(want_, [](const WantModule& m) { return m.backward; });
    size_t at = 0;
    while (at < want_.size() && want_[at].depth <= depth) ++at;
    std::vector<WantModule> units;
    for (uint32_t k = 0; k < len; ++k) units.push_back({chain[k].module, depth, true, nullptr, &chain[k]});
    want_.insert(want_.begin() + static_cast<std::ptrdiff_t>(at), units.begin(), units.end());
}

// The thread's runs that a stack is inside: those whose engine entry frame
// (its code, at its depth) the stack still holds.  Runs under entries it no
// longer holds have ended (a reentrant backward returned, or backward did).
// An engine worker's run (no entry frame) lasts until one with an entry.
void TraceModel::backward_runs(ProcessTree::ThreadState& th, const capture::CallEnter& e) {
    auto& runs = th.backward;
    const size_t n = frames_.size();
    auto holds = [&](const ProcessTree::BackwardRun& r) {
        return r.entry_code == 0 || (r.entry_depth >= 1 && r.entry_depth <= n &&
                                     e.py_frames[n - r.entry_depth].code == r.entry_code);
    };
    size_t keep = 0;
    while (keep < runs.size() && holds(runs[keep])) ++keep;
    runs.resize(keep);
}

// CommDebugMode's module tracker names, in backward, the module whose
// full-backward pre-hook ran last: a pre-hook of the first node that module's
// call made (the one wrapping its output), run after that node's tensor hooks
// (FSDP2's pre-backward).  So a node of a module that began no later than the
// named one (it, or a module it lies in: blocks.N's own nodes after
// blocks.N.up's) leaves the name as it is; any other node's module begins.
void TraceModel::begin_backward(ProcessTree& p, const ProcessTree::Chain& chain, uint64_t node) {
    if (chain.empty()) return;
    const std::string& module = chain.back().fqn;
    if (std::find(p.begun_.begin(), p.begun_.end(), module) != p.begun_.end()) return;
    std::swap(p.begun_before_, p.begun_);
    p.begun_.clear();
    for (const ProcessTree::ChainModule& m : chain) p.begun_.push_back(m.fqn);
    p.begun_by_ = node;
}

// A backward collective record under a module that the last begun one lies
// inside is counted for the begun one and those between too, as
// CommDebugMode counts it (FSDP2's reduce-scatter of blocks.N, issued from
// the node its pre-forward made in blocks.N, after blocks.N.up began); the
// record stays where it runs.
void TraceModel::credit_backward(ProcessTree& p, const ProcessTree::ThreadState& th, uint32_t rec) {
    // While the node that began the module runs, its hooks may still run
    // before that pre-hook: they see the one before (a collective in its
    // body is under the node's own module, which lies in neither).
    const bool by_this_node = !th.backward.empty() && th.backward.back().node == p.begun_by_;
    const std::vector<std::string>& begun = by_this_node ? p.begun_before_ : p.begun_;
    if (begun.empty()) return;
    const ProcessTree::CtxLink* inner = nullptr;
    for (const ProcessTree::CtxLink& l : th.ctx)
        if (!l.scope && l.backward && l.rec != kNoRecord) inner = &l;
    if (!inner) return;
    const std::string_view module = p.text(p.modules_[p.records_[inner->rec].ctx].fqn);
    auto at = std::find(begun.begin(), begun.end(), module);
    if (at == begun.end() || at + 1 == begun.end()) return;
    std::vector<uint32_t> chain;
    for (++at; at != begun.end(); ++at) chain.push_back(p.intern_text(*at));
    p.credited_.emplace(rec, std::move(chain));
}

// A node made (a tensor's grad_fn set): the modules a record made now would
// nest in are the node's, kept until its backward runs it.
void TraceModel::on_grad_fn(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                            const capture::SymbolInfo& info) {
    uint64_t node = 0;
    if (!slot_value(e, info.slots.count, node) || node == 0) return;
    want_modules(p, th, e);
    ProcessTree::Chain chain;
    chain.reserve(want_.size());
    for (const WantModule& m : want_)
        chain.push_back(m.chained ? *m.chained
                                  : ProcessTree::ChainModule{m.module, module_fqn(resolver_, e.tgid, p.last_root_, m.module),
                                                             std::string(m.frame->module_class)});
    p.remember_node(node, p.intern_chain(std::move(chain)));
}

// The engine runs a node: records of this thread under the same engine
// entry are its, until the next node or the entry's return.
void TraceModel::on_autograd_node(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                                  const capture::SymbolInfo& info) {
    uint64_t node = 0;
    if (!slot_value(e, info.slots.count, node) || node == 0) return;
    ++p.nodes_run_;
    if (auto it = p.nodes_.find(node); it == p.nodes_.end()) ++p.nodes_unmapped_;
    else begin_backward(p, p.chains_[it->second], node);
    ProcessTree::BackwardRun run{0, 0, node, e.args[CD_NODE_VTABLE_SLOT]};
    const size_t n = frames_.size();
    if (e.py_status != CD_PY_NO_TSTATE) {
        if (!py_stack_complete(e)) {
            th.backward.clear();  // where it runs is not known: attribute nothing
            return;
        }
        for (size_t i = 0; i < n; ++i)
            if (frames_[i]->kind == python::PyFrameKind::BackwardEntry) {
                run.entry_code = e.py_frames[i].code;
                run.entry_depth = static_cast<uint32_t>(n - i);
                break;
            }
    }
    // Runs under entries this stack does not hold, or under this same one, are over.
    backward_runs(th, e);
    auto& runs = th.backward;
    if (run.entry_code == 0) {
        runs.clear();  // a worker: one run at a time
    } else {
        std::erase_if(runs, [](const auto& r) { return r.entry_code == 0; });
        while (!runs.empty() && runs.back().entry_depth >= run.entry_depth) runs.pop_back();
    }
    if (runs.size() < CD_MAX_PY_FRAMES) runs.push_back(run);
    // The last node's modules end here; this one's open with its first
    // record (a node that records nothing shows none), under the context of
    // this event, not of whatever native call that record is made in.
    th.pending_node.reset();
    if (run.entry_code == 0) return;
    update_context(p, th, e, true);
    th.pending_node = e;
}

// An autograd node's class from its vtable ("torch::autograd::generated::MmBackward0"
// shown as "MmBackward0"), cached per process.
std::string TraceModel::node_name(ProcessTree& p, uint32_t tgid, uint64_t vtable) {
    if (vtable == 0 || !node_namer_) return {};
    if (auto it = p.node_names_.find(vtable); it != p.node_names_.end()) return it->second;
    std::string name = node_namer_(tgid, vtable);
    if (auto colon = name.rfind("::"); colon != std::string::npos) name.erase(0, colon + 2);
    if (p.node_names_.size() < ProcessTree::kMaxChains) p.node_names_.emplace(vtable, name);
    return name;
}

// A Python autograd.Function's node (PyNode) as torch names it
// (grad_fn.name(): "AllReduceGradBackward"): the type of the node object its
// BackwardCFunction.apply frame runs as, the first such frame above the
// engine's entry at `entry_depth`; "" when the stack shows none.
std::string_view TraceModel::py_function_node(uint32_t entry_depth) const {
    const size_t n = frames_.size();
    for (size_t i = n; i-- > 0;)
        if (n - i > entry_depth && frames_[i]->kind == python::PyFrameKind::FunctionApply)
            return frames_[i]->label;
    return {};
}

// A backward module's node class: from its vtable, a PyNode from the stack.
std::string TraceModel::node_class(ProcessTree& p, uint32_t tgid, const WantModule& m) {
    std::string name = node_name(p, tgid, m.vtable);
    if (name != kPyNode) return name;
    const std::string_view py = py_function_node(m.depth);
    return py.empty() ? name : std::string(py);
}

// A PyNode's module record opened by a record without a stack (an ATen op
// the node ran first) is named by the first of its records that shows the
// node's BackwardCFunction.apply frame.
void TraceModel::name_py_nodes(ProcessTree& p, const ProcessTree::ThreadState& th, size_t kept) {
    for (size_t i = 0; i < kept; ++i) {
        const ProcessTree::CtxLink& l = th.ctx[i];
        if (l.scope || !l.backward || l.node == 0 || l.rec == kNoRecord) continue;
        Record& r = p.records_[l.rec];
        if (p.autograd_node(r) != kPyNode) continue;
        const std::string_view py = py_function_node(l.depth);
        if (py.empty()) continue;
        const ProcessTree::ModuleInfo info = p.modules_[r.ctx];
        r.ctx = p.intern_module(std::string(p.text(info.fqn)), std::string(p.text(info.module_class)), py);
    }
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
    want_modules(p, th, e);
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
        return &m != entered && !l.scope && l.key == m.module && l.backward == m.backward && l.depth == m.depth &&
               l.node == m.node;
    };
    size_t keep = 0;
    while (keep < th.ctx.size() && keep < desired_.size() && same(th.ctx[keep], desired_[keep])) ++keep;
    for (size_t i = th.ctx.size(); i-- > keep;) p.end_link(th.ctx[i], e.ts_ns, true);
    th.ctx.resize(keep);
    name_py_nodes(p, th, keep);
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
        if (m.recompute) r.flags |= kRecompute;
        // Backward frames show no root: name them from the last forward's;
        // a node's modules were named when it was made.
        std::string fqn = m.chained ? m.chained->fqn : module_fqn(resolver_, e.tgid, p.last_root_, m.module);
        std::string_view cls = m.chained ? std::string_view(m.chained->cls) : m.frame->module_class;
        r.ctx = p.intern_module(fqn, cls, m.node ? node_class(p, e.tgid, m) : std::string());
        rec = p.append(r, th);
        if (params_ && !m.backward && fqn != "<unknown>") read_parameters(p, e.tgid, {{fqn, m.module, 0}});
    }
    th.ctx.push_back({m.module, m.depth, rec, kNoRecord, false, m.backward, m.node});
}

// As CommDebugMode's forward pre-hook does: a module's own parameters, the
// first time its path runs forward in a window; and those of the modules
// below it (a Linear issues no record of its own to be seen by), depth first
// as named_modules() lists them.
void TraceModel::read_parameters(ProcessTree& p, uint32_t tgid, std::vector<ProcessTree::ParamRead> todo) {
    std::reverse(todo.begin(), todo.end());  // taken from the back: in the order given
    while (!todo.empty()) {
        ProcessTree::ParamRead r = std::move(todo.back());
        todo.pop_back();
        if (p.params_tried_.count(r.path) != 0) continue;
        if (p.params_tried_.size() >= ProcessTree::kMaxParamModules) {
            ++p.params_lost_;
            continue;
        }
        p.params_tried_.emplace(r.path, true);
        std::optional<torch::ModuleParams> got = params_->module_parameters(tgid, r.module);
        if (!got) continue;
        if (got->retry && ++p.params_retries_[r.path] <= kMaxParamRetries) {
            // Asked again at the next batch, or when a record of this module opens.
            p.params_tried_.erase(r.path);
            if (p.params_pending_.size() < ProcessTree::kMaxParamModules) p.params_pending_.push_back(std::move(r));
            continue;
        }
        if (r.depth < kMaxParamDepth)
            for (size_t i = got->children.size(); i-- > 0;) {
                auto& [name, child] = got->children[i];
                todo.push_back({r.path == "<root>" ? name : r.path + "." + name, child, r.depth + 1});
            }
        std::vector<std::pair<std::string, uint64_t>>().swap(got->children);
        if (!got->params.empty() || got->unread != 0) p.params_.emplace_back(r.path, std::move(*got));
    }
}

bool TraceModel::retry_parameters() {
    if (!params_) return false;
    bool any = false;
    for (auto& [tgid, p] : procs_) {
        if (p->params_pending_.empty()) continue;
        any = true;
        std::vector<ProcessTree::ParamRead> again;
        again.swap(p->params_pending_);
        read_parameters(*p, tgid, std::move(again));
    }
    return any;
}

// torch >= 2's record_function_enter_new (SCOPE_LABEL) opens a scope with its
// label.  Where RecordFunction's constructor is probed too (torch 1.13's
// Python never passes a label; a torch 2.x whose Python package is not beside
// it), the USER_SCOPE one right after it keys that scope by its `this`, and
// end() on it closes it; otherwise the record_function exit, which names no
// RecordFunction, closes the innermost scope a label opened (specs/torch-scopes.json).
void TraceModel::on_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e,
                          const capture::SymbolInfo& info, bool after_label) {
    uint64_t v = 0;
    switch (info.role) {
    case CD_ROLE_SCOPE_LABEL:
        begin_scope(p, th, e, kLabelScope);
        th.label_opened = true;
        break;
    case CD_ROLE_SCOPE_BEGIN:
        if (!slot_value(e, info.slots.count, v)) break;
        if (!after_label) {
            if (opens_scope(e, info)) begin_scope(p, th, e, v);
        } else if (!th.ctx.empty() && th.ctx.back().scope && th.ctx.back().key == kLabelScope) {
            th.ctx.back().key = v;
        }
        break;
    case CD_ROLE_SCOPE_END:
        end_scope(p, th, slot_value(e, info.slots.count, v) ? v : kLabelScope, e.ts_ns);
        break;
    default: break;
    }
}

// Whether a SCOPE_BEGIN opens a scope record: a USER_SCOPE RecordFunction
// with a label, or a record_function on its stack, or one whose stack is not
// known.  With a stack, no label and no record_function, it is a
// RecordFunction of torch's own (c10d's Work around each collective).
bool TraceModel::opens_scope(const capture::CallEnter& e, const capture::SymbolInfo& info) const {
    uint64_t v = 0;
    // RecordScope is a uint8_t enum: only the register's low byte is the argument.
    if (!slot_value(e, info.slots.peer, v) || (v & 0xff) != kUserScope) return false;
    if (!e.label.empty() || e.py_status == CD_PY_NONE) return true;
    return std::any_of(frames_.begin(), frames_.end(),
                       [](const auto* f) { return f->kind == python::PyFrameKind::RecordFunctionEnter; });
}

void TraceModel::begin_scope(ProcessTree& p, ProcessTree::ThreadState& th, const capture::CallEnter& e, uint64_t self) {
    size_t at = 0;
    std::string label = scope_label(e, self, &at);
    const uint32_t depth = scope_depth(th, e, at);
    if (th.ctx.size() >= kMaxCtxLinks) return;

    uint32_t rec = kNoRecord;
    if (admit(p, th)) {
        Record r;
        r.start_ns = e.ts_ns;
        r.sym = CD_COOKIE_SYM(e.cookie);
        r.tid = e.tid;
        r.kind = RecordKind::Scope;
        r.ctx = p.intern_text(label);
        if (e.py_status != CD_PY_NONE) r.stack = p.intern_stack(th, frames_serial_, frames_, e.py_status, e.ctx_flags);
        rec = p.append(r, th);
    }
    const uint32_t unit = in_backward_ && !begin_unit_.empty() ? p.intern_text(begin_unit_) : kNoCtx;
    th.ctx.push_back({self, depth, rec, kNoRecord, true, false, 0, unit});
}

// A scope's label: torch >= 2 sends it with the event that opens the scope
// (record_function_enter_new);
// torch 1.13 only shows it as the name of the record_function whose
// __enter__ is on the stack.  `enter_at`: past that frame (0: none).
std::string TraceModel::scope_label(const capture::CallEnter& e, uint64_t self, size_t* enter_at) const {
    const python::PyFrameInfo* enter = nullptr;
    size_t at = 0;
    for (; at < frames_.size() && !enter; ++at)
        if (frames_[at]->kind == python::PyFrameKind::RecordFunctionEnter) enter = frames_[at];
    if (enter_at) *enter_at = enter ? at : 0;
    // torch >= 2's label argument, or read by the kernel from the record_function object (torch 1.13)
    if (!e.label.empty()) return e.label;
    // Read at ingest from the record_function object: its own only if the
    // scope is still open now (see set_scope_check).
    if (enter && !enter->label.empty() && (!scope_open_ || scope_open_(e.tgid, self))) return enter->label;
    return "<unnamed>";
}

// The depth of the frame that entered a scope: the frames outside the
// innermost __enter__ (`enter_at` past it, 0: none: all of them).
uint32_t TraceModel::scope_depth(const ProcessTree::ThreadState& th, const capture::CallEnter& e, size_t enter_at) const {
    if (!py_stack_complete(e)) return th.ctx.empty() ? 0 : th.ctx.back().depth;  // no usable stack: innermost
    return static_cast<uint32_t>(enter_at ? frames_.size() - enter_at : frames_.size());
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
