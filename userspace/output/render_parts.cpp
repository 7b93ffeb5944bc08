// SPDX-License-Identifier: Apache-2.0
// What the renderers share: counts, visibility, communicator lookup.
#include "render.hpp"

#include <algorithm>
#include <array>

#include "nccl.hpp"

namespace commdbg {

namespace {

// Views, aliases, layout changes, dtype/device copies and allocations: they
// carry no communication meaning and swamp the table, so only level 3 shows
// them.  Matched on the ATen base name (namespace and overload stripped).
constexpr std::array<std::string_view, 26> kTrivialOps = {
    "_reshape_alias", "_to_copy", "_unsafe_view", "alias",   "as_strided", "chunk",
    "clone",          "contiguous", "detach",     "empty",   "empty_like", "empty_strided",
    "expand",         "lift_fresh", "permute",    "reshape", "select",     "slice",
    "split",          "squeeze",  "t",            "to",      "transpose",  "unsqueeze",
    "view",           "zeros_like"};

}  // namespace

bool is_trivial_op(std::string_view name) {
    if (name.starts_with("aten::")) name.remove_prefix(6);
    else return false;
    if (auto dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
    for (std::string_view t : kTrivialOps)
        if (t == name) return true;
    return false;
}

bool record_visible(const Record& r, const SymbolTable& syms, int noise_level) {
    switch (r.kind) {
    case RecordKind::Collective: return true;
    case RecordKind::Module:
    case RecordKind::Scope: return noise_level >= 2;
    case RecordKind::Op:
        if (noise_level < 1) return false;
        if (noise_level >= 3) return true;
        return !is_trivial_op(record_name(r, syms));
    }
    return true;
}

namespace render_parts {

std::string_view record_name(const Record& r, const ProcessSnapshot& p, const SymbolTable& syms) {
    if (r.ctx != kNoCtx && p.tree) return p.tree->context_name(r);
    return record_name(r, syms);
}

std::string_view record_layer(const Record& r, const ProcessSnapshot& /*p*/, const SymbolTable& syms) {
    if (r.kind == RecordKind::Module && r.ctx != kNoCtx) return "python";
    return record_layer(r, syms);
}

template <typename Json>
void py_stack_json(const Record& r, const ProcessTree& t, Json& o) {
    if (r.stack == kNoStack) return;
    const ProcessTree::PyStack& s = t.py_stack(r.stack);
    Json frames = Json::array();
    for (uint32_t id : t.py_stack_frames(s)) {
        const ProcessTree::PyFrameRow& f = t.py_frame(id);
        Json fj = Json::object();
        fj["qualname"] = std::string(t.text(f.qualname));
        fj["file"] = std::string(t.text(f.file));
        fj["line"] = f.line;
        frames.push_back(std::move(fj));
    }
    o["py_stack"] = std::move(frames);
    if (s.flags & CD_CTX_TRUNCATED) o["py_stack_truncated"] = true;
    if (s.status == CD_PY_FAULT) o["py_stack_partial"] = true;
}

template void py_stack_json(const Record&, const ProcessTree&, nlohmann::ordered_json&);
template void py_stack_json(const Record&, const ProcessTree&, nlohmann::json&);

std::string py_location(const Record& r, const ProcessTree& t) {
    if (r.stack == kNoStack) return {};
    for (uint32_t id : t.py_stack_frames(t.py_stack(r.stack))) {
        const ProcessTree::PyFrameRow& f = t.py_frame(id);
        if (f.library) continue;
        if (t.text(f.file).empty()) return std::string(t.text(f.qualname));  // "<unknown>": freed or unreadable
        return std::string(t.text(f.file)) + ":" + std::to_string(f.line) + " " + std::string(t.text(f.qualname));
    }
    return {};
}

std::vector<const CounterRow*> sorted_counters(const ProcessSnapshot& p, const SymbolTable& syms) {
    std::vector<const CounterRow*> out;
    out.reserve(p.counters.size());
    for (const CounterRow& c : p.counters) out.push_back(&c);
    auto name = [&](const CounterRow* c) {
        const SymbolInfo* s = syms.find(c->sym);
        return s ? std::string_view(s->name) : std::string_view("?");
    };
    std::stable_sort(out.begin(), out.end(), [&](const CounterRow* a, const CounterRow* b) {
        auto na = name(a), nb = name(b);
        if (na != nb) return na < nb;
        if (a->comm != b->comm) return a->comm < b->comm;
        return a->dtype < b->dtype;
    });
    return out;
}

}  // namespace render_parts

}  // namespace commdbg
