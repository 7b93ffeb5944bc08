// SPDX-License-Identifier: Apache-2.0
// Chrome trace event JSON ("ph":"X" complete events), loadable in Perfetto.
// A record whose end is unknown gets a bounded stand-in, clamped so that on
// every thread children stay inside their parents and events never overlap
// partially (the viewers' nesting rule).
#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include "render.hpp"
#include "text.hpp"
#include "wait_status.hpp"

namespace commdbg::output {

namespace {

using namespace render_parts;
using nlohmann::json;

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMinDurNs = 1000;  // stand-in length of a call whose exit never came

class TraceWriter {
public:
    using Sink = std::function<void(json&&)>;
    TraceWriter(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms, Sink sink)
        : p_(p), syms_(syms), recs_(p.tree->records()), emit_(std::move(sink)) {}

    void render() {
        render_threads();
        // Roots are siblings per thread: the next root of the same thread bounds
        // a root leaf whose end is unknown.
        std::map<uint32_t, std::vector<uint32_t>> roots_by_tid;
        for (uint32_t r : p_.tree->roots()) roots_by_tid[recs_[r].tid].push_back(r);
        for (const auto& [tid, roots] : roots_by_tid) {
            uint64_t floor = 0;
            for (size_t i = 0; i < roots.size(); ++i) {
                uint64_t next = i + 1 < roots.size() ? recs_[roots[i + 1]].start_ns : kNone;
                floor = emit(roots[i], floor, kNone, next);
            }
        }
        if (p_.fsdp) render_findings(*p_.fsdp);
    }

private:
    // Each lifecycle violation and warning as an instant event on the thread
    // of its last record, when that began (a pending all-gather: at the
    // optimizer step that found it).
    void render_findings(const fsdp::Findings& r) {
        for (const auto* list : {&r.violations, &r.warnings})
            for (const fsdp::Finding& f : *list) {
                if (f.records.empty()) continue;
                const fsdp::Evidence& at = f.records.back();
                json args = fsdp::to_json(f);
                args["severity"] = list == &r.violations ? "violation" : "warning";
                emit_({{"name", f.check}, {"cat", "fsdp"}, {"ph", "i"}, {"s", "t"},
                       {"ts", static_cast<double>(at.start_ns) / 1000.0}, {"pid", p_.pid}, {"tid", at.tid},
                       {"args", std::move(args)}});
            }
    }

    void render_threads() {
        json meta = {{"name", "process_name"}, {"ph", "M"}, {"ts", 0}, {"pid", p_.pid},
                     {"tid", p_.pid}};
        meta["args"] = {{"name", p_.command.empty() ? "pid " + std::to_string(p_.pid)
                                                    : p_.command + " (" + std::to_string(p_.pid) + ")"}};
        emit_(std::move(meta));
        for (uint32_t tid : p_.tree->threads()) {
            auto known = p_.thread_names.find(tid);
            std::string name = known != p_.thread_names.end() ? known->second : "tid " + std::to_string(tid);
            emit_({{"name", "thread_name"}, {"ph", "M"}, {"ts", 0}, {"pid", p_.pid},
                   {"tid", tid}, {"args", {{"name", std::move(name)}}}});
        }
    }

    // An end that says when the call returned: not unknown, not just the
    // process's exit (the last op of a thread would span to it).
    static bool end_known(const model::Record& r) { return r.end_ns != 0 && !r.has(model::kEndAtExit); }

    uint64_t subtree_last(uint32_t idx) const {
        const model::Record& r = recs_[idx];
        uint64_t last = end_known(r) ? std::max(r.start_ns, r.end_ns) : r.start_ns;
        for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs_[c].next_sibling)
            last = std::max(last, subtree_last(c));
        return last;
    }

    // Emits idx inside [lo, hi]; returns its end (the floor for the next sibling).
    uint64_t emit(uint32_t idx, uint64_t lo, uint64_t hi, uint64_t next_start) {
        const model::Record& r = recs_[idx];
        uint64_t start = std::max(r.start_ns, lo);
        if (hi != kNone) start = std::min(start, hi);
        uint64_t end;
        if (end_known(r)) {
            end = r.end_ns;
        } else if (r.first_child == model::kNoRecord) {
            end = std::min({start + kMinDurNs, next_start, hi});
        } else {
            // Still open when the window ended: it spans at least its children.
            end = hi != kNone ? hi : std::max(start + kMinDurNs, subtree_last(idx));
        }
        if (hi != kNone) end = std::min(end, hi);
        end = std::max(end, start);

        json ev = {{"name", record_name(r, p_, syms_)},
                   {"cat", record_layer(r, p_, syms_)},
                   {"ph", "X"},
                   {"ts", static_cast<double>(start) / 1000.0},
                   {"dur", static_cast<double>(end - start) / 1000.0},
                   {"pid", p_.pid},
                   {"tid", r.tid}};
        json args = json::object();
        collective_json(r, p_, syms_, args);
        if (!end_known(r)) args["end_unknown"] = true;
        if (r.has(model::kEndInferred)) args["end_inferred"] = true;
        if (r.has(model::kEndAtExit)) args["end_at_exit"] = true;
        if (r.has(model::kReturnProbed)) args["duration_is"] = "host enqueue time, not GPU time";
        py_stack_json(r, *p_.tree, args);
        ev["args"] = std::move(args);
        emit_(std::move(ev));

        uint64_t floor = start;
        for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs_[c].next_sibling) {
            uint32_t n = recs_[c].next_sibling;
            floor = emit(c, floor, end, n != model::kNoRecord ? recs_[n].start_ns : kNone);
        }
        return end;
    }

    const snapshot::ProcessSnapshot& p_;
    const capture::SymbolTable& syms_;
    const std::vector<model::Record>& recs_;
    Sink emit_;
};

void for_each_event(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms,
                    const TraceWriter::Sink& sink) {
    const auto sorted = by_pid(ps);
    for (const auto* p : sorted) {
        if (!p->tree) continue;
        TraceWriter(*p, syms, sink).render();
    }
}

}  // namespace

nlohmann::json chrome_trace(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms) {
    json events = json::array();
    for_each_event(ps, syms, [&](json&& ev) { events.push_back(std::move(ev)); });
    // No "displayTimeUnit": the format says it only changes the display, but
    // Perfetto builds before late 2021 read "ns" as the unit of ts/dur and put
    // every event 1000x too early and too short.  ts and dur are microseconds.
    return {{"traceEvents", std::move(events)}};
}

std::string chrome_trace_text(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms) {
    std::string out = "{\"traceEvents\":[";
    bool first = true;
    for_each_event(ps, syms, [&](json&& ev) {
        if (!first) out += ',';
        out += ev.dump();
        first = false;
    });
    out += "]}";
    return out;
}

}  // namespace commdbg::output
