// SPDX-License-Identifier: Apache-2.0
// Records and the per-process tree they form (ProcessTree): appending in
// entry order, closing, the window reset, and the framework context the
// records point to (interned texts, frames, stacks, modules).  TraceModel,
// which builds the trees from events, is in trace_model.cpp and
// trace_context.cpp.
#include "model.hpp"

#include <limits>

#include <algorithm>

#include "nccl.hpp"

namespace commdbg::model {

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
    k += capture::coll_name(coll);
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
        const capture::SymbolInfo* s = syms_->find(id);
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
             th.pending.capacity() * sizeof(PendingLeaf) + th.ctx.capacity() * sizeof(CtxLink);
    n += text_index_.bucket_count() * sizeof(void*) + texts_.capacity() * sizeof(void*);
    for (const auto& [text, id] : text_index_) n += sizeof(text) + text.capacity() + sizeof(id) + kNode;
    n += frame_index_.bucket_count() * sizeof(void*) +
         frame_index_.size() * (sizeof(FrameKey) + sizeof(uint32_t) + kNode) +
         frame_rows_.capacity() * sizeof(PyFrameRow);
    n += stack_index_.bucket_count() * sizeof(void*) + stack_index_.size() * (2 * sizeof(uint64_t) + kNode) +
         stacks_.capacity() * sizeof(PyStack) + stack_frames_.capacity() * sizeof(uint32_t);
    n += module_index_.size() * (4 * sizeof(uint32_t) + 3 * sizeof(void*)) + modules_.capacity() * sizeof(ModuleInfo);
    n += tensor_index_.bucket_count() * sizeof(void*);
    for (const auto& [key, id] : tensor_index_) n += sizeof(key) + key.capacity() + sizeof(id) + kNode;
    n += tensor_sets_.capacity() * sizeof(TensorSet) + tensor_rows_.capacity() * sizeof(TensorInfo) +
         tensor_dims_.capacity() * sizeof(int64_t);
    n += credited_.bucket_count() * sizeof(void*);
    for (const auto& [rec, chain] : credited_) n += sizeof(rec) + sizeof(chain) + chain.capacity() * sizeof(uint32_t) + kNode;
    for (const auto* v : {&begun_, &begun_before_})
        for (const auto& fqn : *v) n += sizeof(fqn) + fqn.capacity();
    n += params_tried_.bucket_count() * sizeof(void*);
    for (const auto& [fqn, tried] : params_tried_) n += sizeof(fqn) + fqn.capacity() + sizeof(tried) + kNode;
    for (const auto& [fqn, k] : params_retries_) n += sizeof(fqn) + fqn.capacity() + sizeof(k) + kNode;
    n += params_pending_.capacity() * sizeof(ParamRead);
    for (const auto& r : params_pending_) n += r.path.capacity();
    n += params_.capacity() * sizeof(params_[0]);
    for (const auto& th : threads_) {
        n += th.second.backward.capacity() * sizeof(BackwardRun);
        if (th.second.pending_node) n += th.second.pending_node->py_frames.capacity() * sizeof(cd_py_frame);
    }
    n += chains_.capacity() * sizeof(Chain) + nodes_.bucket_count() * sizeof(void*) +
         nodes_.size() * (2 * sizeof(uint64_t) + kNode) + node_order_.size() * sizeof(uint64_t);
    for (const Chain& c : chains_) {
        n += c.capacity() * sizeof(ChainModule);
        for (const ChainModule& m : c) n += m.fqn.capacity() + m.cls.capacity();
    }
    for (const auto& [key, id] : chain_index_) n += key.capacity() + sizeof(id) + kNode;
    n += module_chains_.bucket_count() * sizeof(void*);
    for (const auto& [fqn, at] : module_chains_) n += sizeof(fqn) + fqn.capacity() + sizeof(at) + kNode;
    for (const auto& [vt, name] : node_names_) n += sizeof(vt) + name.capacity() + kNode;
    for (const auto& [fqn, m] : params_) {
        n += fqn.capacity() + m.params.capacity() * sizeof(torch::ParamInfo);
        for (const auto& pi : m.params)
            n += pi.name.capacity() + pi.dtype.capacity() + (pi.shape.capacity() + pi.local_shape.capacity()) * 8 +
                 (pi.placements ? pi.placements->capacity() : 0);
    }
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
        th.last_stack = {};  // its id is the old window's
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
    tensor_index_.clear();
    tensor_sets_.clear();
    tensor_rows_.clear();
    tensor_dims_.clear();
    stack_frames_.clear();
    module_index_.clear();
    modules_.clear();
    credited_.clear();
    params_.clear();
    params_tried_.clear();
    params_retries_.clear();
    params_pending_.clear();
    params_lost_ = 0;
    nodes_run_ = nodes_unmapped_ = 0;
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

uint32_t ProcessTree::intern_frame(const python::PyFrameInfo& f) {
    FrameKey k{intern_text(f.qualname), intern_text(f.file), f.line, f.known, f.library};
    auto [it, added] = frame_index_.emplace(k, static_cast<uint32_t>(frame_rows_.size()));
    if (added) frame_rows_.push_back({k.qualname, k.file, k.line, k.known, k.library});
    return it->second;
}

uint32_t ProcessTree::intern_stack(ThreadState& th, uint64_t serial,
                                   std::span<const python::PyFrameInfo* const> frames, uint16_t status, uint16_t flags) {
    auto& last = th.last_stack;
    if (serial != 0 && last.serial == serial && last.status == status && last.flags == flags) return last.id;
    const uint32_t id = intern_stack(frames, status, flags);
    last.serial = serial, last.id = id, last.status = status, last.flags = flags;
    return id;
}

uint32_t ProcessTree::intern_stack(std::span<const python::PyFrameInfo* const> frames, uint16_t status,
                                   uint16_t flags) {
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

uint32_t ProcessTree::intern_module(std::string_view fqn, std::string_view cls, std::string_view node) {
    std::tuple key{intern_text(fqn), intern_text(cls), node.empty() ? kNoCtx : intern_text(node)};
    auto [it, added] = module_index_.emplace(key, static_cast<uint32_t>(modules_.size()));
    if (added) modules_.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key)});
    return it->second;
}

// A chain interned: nodes made under the same modules share one.  Past
// kMaxChains every node and chain is forgotten (their backward records then
// go unattributed, counted in nodes_unmapped_), never a wrong one kept.
uint32_t ProcessTree::intern_chain(Chain c) {
    std::string key;
    for (const ChainModule& m : c) {
        key.append(reinterpret_cast<const char*>(&m.module), sizeof(m.module));
        key += m.fqn;
        key += '\0';
        key += m.cls;
        key += '\0';
    }
    if (auto it = chain_index_.find(key); it != chain_index_.end()) return it->second;
    if (chains_.size() >= kMaxChains) {
        chains_.clear();
        chain_index_.clear();
        module_chains_.clear();
        nodes_.clear();
        node_order_.clear();
    }
    auto id = static_cast<uint32_t>(chains_.size());
    for (uint32_t k = 0; k < c.size(); ++k) module_chains_.insert_or_assign(c[k].fqn, std::pair{id, k + 1});
    chains_.push_back(std::move(c));
    chain_index_.emplace(std::move(key), id);
    return id;
}

const ProcessTree::ChainModule* ProcessTree::module_chain(std::string_view fqn, uint32_t& len) const {
    auto it = module_chains_.find(std::string(fqn));
    if (it == module_chains_.end()) return nullptr;
    len = it->second.second;
    return chains_[it->second.first].data();
}

void ProcessTree::remember_node(uint64_t node, uint32_t chain) {
    auto [it, added] = nodes_.insert_or_assign(node, chain);
    if (!added) return;
    node_order_.push_back(node);
    while (node_order_.size() > kMaxNodes) {
        nodes_.erase(node_order_.front());
        node_order_.pop_front();
    }
}

// One tensor as the kernel read it, checked: a shape whose product is not
// its numel, or a dtype the file does not have, is shown as nothing.
uint32_t ProcessTree::intern_tensors(const cd_tensors& t, const torch::TensorLayout* layout) {
    TensorSet set;
    set.n = std::min<uint8_t>(t.ntensors, CD_MAX_TENSORS);
    set.kinds = t.kinds, set.status = t.status, set.flags = t.flags;
    set.total[0] = t.total[0], set.total[1] = t.total[1];
    set.group_rank = t.group_rank, set.group_size = t.group_size;
    std::vector<TensorInfo> rows(set.n);
    std::vector<std::vector<int64_t>> dims(set.n);
    std::string key(reinterpret_cast<const char*>(&set), sizeof(set));
    for (uint8_t i = 0; i < set.n; ++i) {
        const cd_tensor& k = t.t[i];
        TensorInfo& row = rows[i];
        row.param = k.param;
        switch (k.status) {
        case CD_TENSOR_OK: row.status = TensorStatus::Ok; break;
        case CD_TENSOR_UNDEFINED: row.status = TensorStatus::Undefined; break;
        case CD_TENSOR_NOT_PLAIN: row.status = TensorStatus::NotPlain; break;
        case CD_TENSOR_SYMBOLIC: row.status = TensorStatus::Symbolic; break;
        default: row.status = TensorStatus::Unreadable; break;
        }
        if (row.status == TensorStatus::Ok && !layout) row.status = TensorStatus::NoLayout;
        if (row.status == TensorStatus::Ok && k.ndim > CD_TENSOR_DIMS) row.status = TensorStatus::TooManyDims;
        if (row.status == TensorStatus::Ok) {
            int64_t product = 1;
            bool plausible = k.numel >= 0;
            for (uint8_t d = 0; d < k.ndim && plausible; ++d) {
                int64_t sz = k.sizes[d];
                if (sz < 0 || (sz && product > std::numeric_limits<int64_t>::max() / sz)) plausible = false;
                else product *= sz;
            }
            if (!plausible || product != k.numel) row.status = TensorStatus::Inconsistent;
            else dims[i].assign(k.sizes, k.sizes + k.ndim);
        }
        if ((row.status == TensorStatus::Ok || row.status == TensorStatus::TooManyDims) &&
            k.dtype >= layout->itemsizes.size())
            row.status = TensorStatus::Inconsistent, dims[i].clear();
        if (row.status == TensorStatus::Ok || row.status == TensorStatus::TooManyDims) {
            row.numel = k.numel;
            row.dtype = intern_text(torch::dtype_name(*layout, k.dtype));
            row.bytes = uint64_t(k.numel) * layout->itemsizes[k.dtype];
        }
        row.ndim = static_cast<uint8_t>(dims[i].size());
        key.append(reinterpret_cast<const char*>(&row), sizeof(row));
        key.append(reinterpret_cast<const char*>(dims[i].data()), dims[i].size() * sizeof(int64_t));
    }
    if (auto it = tensor_index_.find(key); it != tensor_index_.end()) return it->second;
    set.first = static_cast<uint32_t>(tensor_rows_.size());
    for (uint8_t i = 0; i < set.n; ++i) {
        rows[i].first_dim = static_cast<uint32_t>(tensor_dims_.size());
        tensor_dims_.insert(tensor_dims_.end(), dims[i].begin(), dims[i].end());
        tensor_rows_.push_back(rows[i]);
    }
    auto id = static_cast<uint32_t>(tensor_sets_.size());
    tensor_sets_.push_back(set);
    tensor_index_.emplace(std::move(key), id);
    return id;
}

std::string_view ProcessTree::context_name(const Record& r) const {
    if (!has_context(r)) return {};
    if (r.kind == RecordKind::Scope) return text(r.ctx);
    if (r.kind == RecordKind::Module) return text(modules_[r.ctx].fqn);
    return {};
}

std::string_view ProcessTree::module_class(const Record& r) const {
    if (r.ctx == kNoCtx || r.kind != RecordKind::Module) return {};
    return text(modules_[r.ctx].module_class);
}

std::string_view ProcessTree::autograd_node(const Record& r) const {
    if (r.ctx == kNoCtx || r.kind != RecordKind::Module || modules_[r.ctx].node == kNoCtx) return {};
    return text(modules_[r.ctx].node);
}

bool ProcessTree::nested_in_collective(const Record& r) const {
    for (uint32_t a = r.parent; a != kNoRecord; a = records_[a].parent) {
        const capture::SymbolInfo* s = syms_->find(records_[a].sym);
        if (s && s->role == CD_ROLE_COLLECTIVE) return true;
    }
    return false;
}

std::string_view ProcessTree::also_counted_for(const Record& r) const {
    if (&r < records_.data() || &r >= records_.data() + records_.size()) return {};
    auto it = credited_.find(static_cast<uint32_t>(&r - records_.data()));
    return it == credited_.end() || it->second.empty() ? std::string_view() : text(it->second.back());
}

std::map<std::string, ProcessTree::ModuleCommCounts> ProcessTree::module_comm_counts() const {
    std::map<std::string, ModuleCommCounts> out;
    std::vector<std::pair<uint32_t, bool>> counted;  // (fqn, backward): a recursive module counts once
    for (const Record& r : records_) {
        const capture::SymbolInfo* s = syms_->find(r.sym);
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
        auto credit = credited_.find(static_cast<uint32_t>(&r - records_.data()));
        if (credit == credited_.end()) continue;
        for (uint32_t fqn : credit->second) {
            std::pair id{fqn, true};
            if (std::find(counted.begin(), counted.end(), id) != counted.end()) continue;
            counted.push_back(id);
            ++out[std::string(text(fqn))].backward[key];
        }
    }
    return out;
}

}  // namespace commdbg::model
