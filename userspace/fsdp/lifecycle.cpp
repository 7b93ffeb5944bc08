// SPDX-License-Identifier: Apache-2.0
// Profiles and the trace items the lifecycle reads (lifecycle.hpp); the
// analysis itself is in lifecycle_checks.cpp.
#include "lifecycle.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <numeric>
#include <sstream>

#include "model.hpp"
#include "record_facts.hpp"

namespace commdbg::fsdp {

extern const std::vector<std::pair<std::string, std::string>> kBuiltinProfileTexts;

namespace {

constexpr std::array<std::string_view, kEventKinds> kKindNames = {
    "optimizer_step", "root_forward", "pre_forward", "post_forward", "all_gather", "all_gather_copy_out",
    "forward_prefetch", "backward_prefetch", "pre_backward", "post_backward", "grad_reduce", "root_post_backward",
};

// A label pattern as an RE2 regex: literals escaped, `{unit}` a
// group, `{any}` anything, `[...]` optional.  Returns the regex text and the
// unit's group (0: none), or what is wrong with the pattern.
Result<std::pair<std::string, int>> compile_pattern(const std::string& pat) {
    std::string re;
    int groups = 0, unit_group = 0;
    bool optional = false;
    for (size_t i = 0; i < pat.size(); ++i) {
        const char c = pat[i];
        if (c == '[' || c == ']') {
            if ((c == '[') == optional) return Result<std::pair<std::string, int>>::fail("unbalanced [ ] at " + std::to_string(i));
            re += c == '[' ? "(?:" : ")?";
            optional = c == '[';
        } else if (c == '{') {
            const size_t end = pat.find('}', i);
            if (end == std::string::npos) return Result<std::pair<std::string, int>>::fail("{ without } at " + std::to_string(i));
            const std::string name = pat.substr(i + 1, end - i - 1);
            if (name == "unit") {
                if (unit_group) return Result<std::pair<std::string, int>>::fail("{unit} given twice");
                re += "(.*)";
                unit_group = ++groups;
            } else if (name == "any") {
                re += ".*";
            } else {
                return Result<std::pair<std::string, int>>::fail("unknown placeholder {" + name + "} (known: {unit}, {any})");
            }
            i = end;
        } else {
            if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
            re += c;
        }
    }
    if (optional) return Result<std::pair<std::string, int>>::fail("[ without ]");
    return std::pair{re, unit_group};
}

Result<Profile::Rule> parse_rule(const nlohmann::json& e, size_t i) {
    using R = Result<Profile::Rule>;
    const std::string at = "events[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("event") || !e["event"].is_string() || !e.contains("label") ||
        !e["label"].is_string())
        return R::fail(at + ": wants {\"event\": NAME, \"label\": PATTERN}");
    auto kind = event_kind(e["event"].get<std::string>());
    if (!kind) {
        std::string known;
        for (auto n : kKindNames) known += (known.empty() ? "" : ", ") + std::string(n);
        return R::fail(at + ": unknown event \"" + bounded(e["event"].get<std::string>()) + "\" (known: " + known + ")");
    }
    const std::string label = e["label"].get<std::string>();
    const std::string quoted = "label \"" + bounded(label) + "\"";
    if (auto problem = pattern_length_problem(label)) return R::fail(at + ": " + quoted + " " + *problem);
    auto re = compile_pattern(label);
    if (!re) return R::fail(at + ": " + quoted + ": " + re.error());
    auto compiled = Pattern::compile(re->first);
    if (!compiled) return R::fail(at + ": " + quoted + ": " + compiled.error());
    return Profile::Rule{.kind = *kind, .pattern = label, .re = std::move(compiled.value()), .unit_group = re->second};
}

}  // namespace

std::string_view to_string(EventKind k) { return kKindNames[static_cast<size_t>(k)]; }

std::optional<EventKind> event_kind(std::string_view name) {
    for (size_t i = 0; i < kKindNames.size(); ++i)
        if (kKindNames[i] == name) return static_cast<EventKind>(i);
    return std::nullopt;
}

std::optional<Match> Profile::match(std::string_view label) const {
    std::string unit;
    for (const Rule& r : rules) {
        if (!r.re.full_match(label, r.unit_group, unit)) continue;
        return Match{r.kind, unit.empty() ? root_unit : unit};
    }
    return std::nullopt;
}

Result<Profile> parse_profile(const std::string& text, const std::string& origin) {
    using R = Result<Profile>;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return R::fail("lifecycle profile " + origin + ": not valid JSON");
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("events") ||
        !j["events"].is_array() || j["events"].empty())
        return R::fail("lifecycle profile " + origin + ": wants {\"name\": ..., \"events\": [...]} with at least one event");
    Profile p;
    p.name = j["name"].get<std::string>();
    p.description = j.value("description", std::string());
    p.root_unit = j.value("root_unit", std::string("<root>"));
    if (j.contains("backward_end_frees_all_gathers")) {
        if (!j["backward_end_frees_all_gathers"].is_boolean())
            return R::fail("lifecycle profile " + origin + ": backward_end_frees_all_gathers wants true or false");
        p.backward_end_frees_all_gathers = j["backward_end_frees_all_gathers"].get<bool>();
    }
    for (size_t i = 0; i < j["events"].size(); ++i) {
        auto rule = parse_rule(j["events"][i], i);
        if (!rule) return R::fail("lifecycle profile " + origin + ": " + rule.error());
        p.rules.push_back(std::move(rule.value()));
    }
    return p;
}

const std::vector<Profile>& builtin_profiles() {
    static const std::vector<Profile> profiles = [] {
        std::vector<Profile> out;
        for (const auto& [name, text] : kBuiltinProfileTexts) {
            // A broken built-in is a build defect; the unit tests parse every one.
            if (auto r = parse_profile(text, "built-in " + name)) out.push_back(std::move(r.value()));
        }
        return out;
    }();
    return profiles;
}

Result<Profile> load_profile(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Result<Profile>::fail("lifecycle profile " + path + ": cannot read the file — check the path");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_profile(ss.str(), path);
}

const Profile* detect_profile(const std::vector<TraceItem>& items, const std::vector<Profile>& first) {
    for (const auto* list : {&first, &builtin_profiles()})
        for (const Profile& p : *list)
            for (const TraceItem& it : items)
                if (it.scope && p.match(it.name)) return &p;
    return nullptr;
}

// In place: a dump's items can be most of what `check --from` holds.
void sort_by_start(std::vector<TraceItem>& items) {
    auto earlier = [](const TraceItem& a, const TraceItem& b) { return a.start_ns < b.start_ns; };
    if (std::is_sorted(items.begin(), items.end(), earlier)) return;
    std::vector<uint32_t> order(items.size());  // position i takes the item at order[i]
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return earlier(items[a], items[b]); });
    std::vector<int32_t> where(items.size());
    for (uint32_t i = 0; i < order.size(); ++i) where[order[i]] = static_cast<int32_t>(i);
    for (TraceItem& it : items)
        if (it.parent >= 0) it.parent = where[it.parent];
    // Each cycle of the permutation once; a position done points to itself.
    for (uint32_t i = 0; i < order.size(); ++i) {
        if (order[i] == i) continue;
        TraceItem held = std::move(items[i]);
        uint32_t j = i;
        for (uint32_t from; (from = order[j]) != i; j = from) {
            items[j] = std::move(items[from]);
            order[j] = j;
        }
        items[j] = std::move(held);
        order[j] = j;
    }
}

namespace {

struct TreeWalk {
    const model::ProcessTree& t;
    const capture::SymbolTable& syms;
    std::vector<TraceItem>& out;

    // A collective's bytes, or where it carries none (a c10d call), those of
    // the collectives it issued (its NCCL calls).
    uint64_t bytes_of(uint32_t idx) const {
        const auto& recs = t.records();
        if (auto b = record_bytes(recs[idx])) return *b;
        uint64_t sum = 0;
        for (uint32_t c = recs[idx].first_child; c != model::kNoRecord; c = recs[c].next_sibling)
            if (recs[c].kind == model::RecordKind::Collective) sum += bytes_of(c);
        return sum;
    }

    // `scope`: the enclosing scope item; `in_coll`: inside a collective.
    void visit(uint32_t idx, int32_t scope, bool in_coll) {
        const auto& recs = t.records();
        const model::Record& r = recs[idx];
        if (r.kind == model::RecordKind::Scope) {
            out.push_back({.scope = true, .name = std::string(t.context_name(r)), .tid = r.tid,
                           .start_ns = r.start_ns, .bytes = 0, .parent = scope});
            scope = static_cast<int32_t>(out.size() - 1);
        } else if (r.kind == model::RecordKind::Collective && r.coll != CD_COLL_NONE && !in_coll) {
            const capture::SymbolInfo* s = syms.find(r.sym);
            out.push_back({.scope = false, .name = model::coll_key(s ? s->layer : "?", static_cast<cd_coll>(r.coll)),
                           .tid = r.tid, .start_ns = r.start_ns, .bytes = bytes_of(idx), .parent = scope});
            in_coll = true;
        }
        for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs[c].next_sibling) visit(c, scope, in_coll);
    }
};

}  // namespace

std::vector<TraceItem> items_from_tree(const model::ProcessTree& t, const capture::SymbolTable& syms) {
    std::vector<TraceItem> out;
    TreeWalk w{t, syms, out};
    for (uint32_t r : t.roots()) w.visit(r, -1, false);
    sort_by_start(out);
    return out;
}

}  // namespace commdbg::fsdp
