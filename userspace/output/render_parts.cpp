// SPDX-License-Identifier: Apache-2.0
// What the renderers share: counts, visibility, communicator lookup.
#include "render.hpp"

#include <algorithm>
#include <array>

#include "nccl.hpp"

namespace commdbg::output {

namespace {

// Views, aliases, layout changes, dtype/device copies and allocations: they
// carry no communication meaning and swamp the table, so only level 3 shows
// them.  Matched on the ATen base name (namespace and overload stripped).
// CommDebugMode's own list (detach, t, view, _to_copy, as_strided,
// transpose) is in it, and resolve_conj / resolve_neg, which every DTensor op
// dispatches around itself.
constexpr std::array<std::string_view, 28> kTrivialOps = {
    "_reshape_alias", "_to_copy",   "_unsafe_view", "alias",        "as_strided",  "chunk",
    "clone",          "contiguous", "detach",       "empty",        "empty_like",  "empty_strided",
    "expand",         "lift_fresh", "permute",      "reshape",      "resolve_conj", "resolve_neg",
    "select",         "slice",      "split",        "squeeze",      "t",           "to",
    "transpose",      "unsqueeze",  "view",         "zeros_like"};

}  // namespace

bool is_trivial_op(std::string_view name) {
    if (name.starts_with("aten::")) name.remove_prefix(6);
    else return false;
    if (auto dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
    for (std::string_view t : kTrivialOps)
        if (t == name) return true;
    return false;
}

bool record_visible(const model::Record& r, const capture::SymbolTable& syms, int noise_level) {
    switch (r.kind) {
    case model::RecordKind::Collective: return true;
    case model::RecordKind::Module:
    case model::RecordKind::Scope: return noise_level >= 2;
    case model::RecordKind::Op:
        if (noise_level < 1) return false;
        if (noise_level >= 3) return true;
        return !is_trivial_op(record_name(r, syms));
    }
    return true;
}

namespace render_parts {

std::string_view record_name(const model::Record& r, const snapshot::ProcessSnapshot& p,
                             const capture::SymbolTable& syms) {
    if (model::ProcessTree::has_context(r) && p.tree) return p.tree->context_name(r);
    return record_name(r, syms);
}

std::string_view record_layer(const model::Record& r, const snapshot::ProcessSnapshot& /*p*/,
                              const capture::SymbolTable& syms) {
    if (r.kind == model::RecordKind::Module && r.ctx != model::kNoCtx) return "python";
    return record_layer(r, syms);
}

template <typename Json>
void py_stack_json(const model::Record& r, const model::ProcessTree& t, Json& o) {
    if (r.stack == model::kNoStack) return;
    const model::ProcessTree::PyStack& s = t.py_stack(r.stack);
    Json frames = Json::array();
    for (uint32_t id : t.py_stack_frames(s)) {
        const model::ProcessTree::PyFrameRow& f = t.py_frame(id);
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

template void py_stack_json(const model::Record&, const model::ProcessTree&, nlohmann::ordered_json&);
template void py_stack_json(const model::Record&, const model::ProcessTree&, nlohmann::json&);

std::string py_location(const model::Record& r, const model::ProcessTree& t) {
    if (r.stack == model::kNoStack) return {};
    for (uint32_t id : t.py_stack_frames(t.py_stack(r.stack))) {
        const model::ProcessTree::PyFrameRow& f = t.py_frame(id);
        if (f.library) continue;
        if (t.text(f.file).empty()) return std::string(t.text(f.qualname));  // "<unknown>": freed or unreadable
        return std::string(t.text(f.file)) + ":" + std::to_string(f.line) + " " + std::string(t.text(f.qualname));
    }
    return {};
}

std::vector<const snapshot::CounterRow*> sorted_counters(const snapshot::ProcessSnapshot& p,
                                                         const capture::SymbolTable& syms) {
    std::vector<const snapshot::CounterRow*> out;
    out.reserve(p.counters.size());
    for (const snapshot::CounterRow& c : p.counters) out.push_back(&c);
    auto name = [&](const snapshot::CounterRow* c) {
        const capture::SymbolInfo* s = syms.find(c->sym);
        return s ? std::string_view(s->name) : std::string_view("?");
    };
    std::stable_sort(out.begin(), out.end(), [&](const snapshot::CounterRow* a, const snapshot::CounterRow* b) {
        auto na = name(a), nb = name(b);
        if (na != nb) return na < nb;
        if (a->comm != b->comm) return a->comm < b->comm;
        return a->dtype < b->dtype;
    });
    return out;
}

}  // namespace render_parts

}  // namespace commdbg::output
