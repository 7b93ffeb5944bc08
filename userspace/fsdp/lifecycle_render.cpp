// SPDX-License-Identifier: Apache-2.0
// The lifecycle's outputs (lifecycle.hpp): the "fsdp" JSON section and the
// "FSDP lifecycle" table section.
#include <map>

#include "lifecycle.hpp"

namespace commdbg::fsdp {

using nlohmann::ordered_json;

namespace {

// At most this many micro-steps in the table; the JSON has every one.
constexpr size_t kTableMicroSteps = 12;

ordered_json micro_step_json(const MicroStep& m) {
    ordered_json o;
    o["global_step"] = m.global_step;
    o["micro_step"] = m.micro_step;
    o["forward"] = m.forward;
    o["backward"] = m.backward;
    if (m.partial) o["partial"] = true;
    // Outermost collectives, then by the unit whose scope issued them ("" outside every unit's).
    ordered_json counts = ordered_json::object(), by_unit = ordered_json::object();
    for (const auto& c : m.collectives) {
        counts[c.key] = counts.value(c.key, 0) + 1;
        ordered_json& u = by_unit[c.unit];
        if (!u.is_object()) u = ordered_json::object();
        u[c.key] = u.value(c.key, 0) + 1;
    }
    o["comm_counts"] = std::move(counts);
    o["unit_comm_counts"] = std::move(by_unit);
    return o;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
    return s.empty() ? "-" : s;
}

std::string where(const Finding& f) {
    std::string s = "step " + std::to_string(f.global_step);
    if (f.micro_step >= 0) s += "." + std::to_string(f.micro_step);
    return s + (f.phase.empty() ? "" : " " + f.phase);
}

}  // namespace

ordered_json to_json(const Finding& f) {
    ordered_json o;
    o["check"] = f.check;
    o["message"] = f.message;
    o["global_step"] = f.global_step;
    o["micro_step"] = f.micro_step >= 0 ? ordered_json(f.micro_step) : ordered_json(nullptr);
    o["phase"] = f.phase;
    o["unit"] = f.unit;
    if (f.check == "grad_sync_non_final_micro_step") {
        o["extra_collectives"] = f.extra_collectives;
        o["extra_bytes"] = f.extra_bytes;
    }
    ordered_json recs = ordered_json::array();
    for (const Evidence& e : f.records) recs.push_back({{"name", e.name}, {"tid", e.tid}, {"start_ns", e.start_ns}});
    o["records"] = std::move(recs);
    return o;
}

ordered_json to_json(const Findings& r) {
    ordered_json o;
    o["profile"] = r.profile;
    o["window"] = r.from_start ? "from_start" : "attached";
    o["units"] = r.units;
    o["optimizer_steps"] = r.optimizer_steps;
    ordered_json steps = ordered_json::array();
    for (const MicroStep& m : r.micro_steps) steps.push_back(micro_step_json(m));
    o["micro_steps"] = std::move(steps);
    ordered_json v = ordered_json::array(), w = ordered_json::array();
    for (const Finding& f : r.violations) v.push_back(to_json(f));
    for (const Finding& f : r.warnings) w.push_back(to_json(f));
    o["violations"] = std::move(v);
    o["warnings"] = std::move(w);
    if (!r.notes.empty()) o["notes"] = r.notes;
    return o;
}

std::string render_findings(const std::vector<Finding>& fs, std::string_view title) {
    if (fs.empty()) return {};
    std::string s = "  " + std::string(title) + " (" + std::to_string(fs.size()) + "):\n";
    for (const Finding& f : fs) s += "    " + f.check + "  " + where(f) + ": " + f.message + "\n";
    return s;
}

std::string rank_view_name(int rank, const std::string& who) {
    return rank >= 0 ? "rank " + std::to_string(rank) + " (" + who + ")" : who;
}

std::string render_cross_rank(const std::vector<Finding>& cross, size_t ranks) {
    if (ranks < 2) return {};
    if (cross.empty()) return "FSDP across " + std::to_string(ranks) + " ranks: the same unit orders and collectives\n";
    return "FSDP across ranks:\n" + render_findings(cross, "violations");
}

std::string render_summary(size_t violations, size_t warnings, size_t processes) {
    return "commdbg check: " + std::to_string(violations) + " violation(s), " + std::to_string(warnings) +
           " warning(s) in " + std::to_string(processes) + " process(es)\n";
}

std::string render_section(const Findings& r) {
    std::string s = "FSDP lifecycle (" + r.profile + "): " + std::to_string(r.units.size()) + " units, " +
                    std::to_string(r.optimizer_steps) + " optimizer steps, " +
                    std::to_string(r.micro_steps.size()) + " micro-steps\n";
    size_t shown = 0;
    for (const MicroStep& m : r.micro_steps) {
        if (shown++ == kTableMicroSteps) {
            s += "  ... " + std::to_string(r.micro_steps.size() - kTableMicroSteps) + " more micro-steps (all in the JSON)\n";
            break;
        }
        const std::string head = "  step " + std::to_string(m.global_step) + "." + std::to_string(m.micro_step) +
                                 (m.partial ? " (partial)" : "");
        s += head + "  forward  " + join(m.forward, " > ") + "\n";
        s += std::string(head.size(), ' ') + "  backward " + join(m.backward, " > ") + "\n";
    }
    s += render_findings(r.violations, "violations");
    s += render_findings(r.warnings, "warnings");
    if (r.violations.empty() && r.warnings.empty()) s += "  no violation\n";
    for (const auto& n : r.notes) s += "  note: " + n + "\n";
    return s;
}

}  // namespace commdbg::fsdp
