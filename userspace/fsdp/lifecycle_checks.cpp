// SPDX-License-Identifier: Apache-2.0
// The lifecycle analysis (lifecycle.hpp): one pass over the trace items in
// start order, a step at a time.
//
// A micro-step begins at the root's forward; a global step ends at the
// optimizer's step.  A prefetch's source is the unit whose pre-forward
// (pre-backward) began last on that pass: FSDP2 prefetches right after the
// source's own pre-forward hook, outside its scope (an implicit backward
// prefetch runs inside the pre-backward scope: the same unit).  Checks that
// need a whole step (a pending all-gather, a bypassed unit, the gradient
// sync policy) run at the optimizer boundary and only on steps the window
// saw from their start; prefetches are checked when their micro-step ends.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "lifecycle.hpp"

namespace commdbg::fsdp {

namespace {

struct Prefetch {
    bool backward;
    std::string source, target;
    size_t source_pos;  // the source's position in its pass when it prefetched
    Evidence at;
};

struct GradReduce {
    int micro_step;
    std::string unit;
    Evidence at;
};

// Events that a unit itself runs (not a prefetch naming its target, not the
// root's or the optimizer's boundaries).
bool names_unit(EventKind k) {
    switch (k) {
    case EventKind::PreForward:
    case EventKind::PostForward:
    case EventKind::AllGather:
    case EventKind::AllGatherCopyOut:
    case EventKind::PreBackward:
    case EventKind::PostBackward:
    case EventKind::GradReduce: return true;
    default: return false;
    }
}

Evidence evidence(const TraceItem& it) { return {it.name, it.tid, it.start_ns}; }

class Analysis {
public:
    Analysis(const std::vector<TraceItem>& items, const Profile& p, const Options& o) : items_(items), profile_(p) {
        out_.profile = p.name;
        out_.from_start = o.from_start;
        lost_ = o.records_lost;
        process_ended_ = o.process_ended;
        step_complete_ = o.from_start;
    }

    Findings run() {
        matches_.reserve(items_.size());
        for (const TraceItem& it : items_)
            matches_.push_back(it.scope ? profile_.match(it.name) : std::nullopt);
        for (size_t i = 0; i < items_.size(); ++i) {
            if (items_[i].scope) {
                if (matches_[i]) on_event(i, *matches_[i]);
            } else {
                on_collective(i);
            }
        }
        // Cut by the window's end (or by lost records): what it did not reach
        // is not a finding, and ranks cut at different points are not
        // compared there.  Ended by the process, it is whole as far as it went.
        if (open_ && !prefetches_.empty())
            out_.notes.push_back("the last micro-step did not end in the window: its prefetches were not checked");
        if (open_ && !process_ended_) out_.micro_steps.back().partial = true;
        end_micro_step(/*complete=*/false);
        if (!out_.micro_steps.empty() && (out_.micro_steps.back().global_step == global_step_))
            out_.notes.push_back(out_.optimizer_steps == 0
                                     ? "no optimizer step in the window: the checks at the optimizer boundary "
                                       "(pending_all_gather, bypassed_child, grad_sync_non_final_micro_step) did not run"
                                     : "the last step did not reach its optimizer step in the window: its "
                                       "optimizer-boundary checks did not run");
        if (!out_.from_start && out_.optimizer_steps > 0)
            out_.notes.push_back("the window began with the process running: step 0 may have begun before it and "
                                 "was not checked at its optimizer boundary");
        if (lost_)
            out_.notes.push_back(std::to_string(lost_) + " records of this process were dropped: the lifecycle "
                                 "around them is incomplete and findings there may not be real (a larger "
                                 "--max-records / --ringbuf-kb keeps them)");
        out_.units.assign(units_.begin(), units_.end());
        return std::move(out_);
    }

private:
    void on_event(size_t i, const Match& m) {
        const TraceItem& it = items_[i];
        if (names_unit(m.kind)) units_.insert(m.unit);
        switch (m.kind) {
        case EventKind::OptimizerStep: optimizer_step(it); break;
        case EventKind::RootForward: begin_micro_step(false); break;
        case EventKind::PreForward:
            cur().forward.push_back(m.unit);
            cur().forward_at.push_back(evidence(it));
            step_forward_.insert(m.unit);
            last_source_[0] = m.unit;
            break;
        case EventKind::PreBackward:
            cur().backward.push_back(m.unit);
            cur().backward_at.push_back(evidence(it));
            step_backward_.emplace(m.unit, evidence(it));
            last_source_[1] = m.unit;
            break;
        case EventKind::ForwardPrefetch:
        case EventKind::BackwardPrefetch: on_prefetch(it, m); break;
        case EventKind::AllGather: pending_[m.unit] = evidence(it); break;
        case EventKind::AllGatherCopyOut: pending_.erase(m.unit); break;
        case EventKind::PostBackward: step_backward_.emplace(m.unit, evidence(it)); break;
        case EventKind::GradReduce:
            step_backward_.emplace(m.unit, evidence(it));
            reduces_.push_back({cur().micro_step, m.unit, evidence(it)});
            break;
        case EventKind::RootPostBackward:
            if (profile_.backward_end_frees_all_gathers) pending_.clear();
            break;
        case EventKind::PostForward: break;
        }
    }

    void on_prefetch(const TraceItem& it, const Match& m) {
        const bool backward = m.kind == EventKind::BackwardPrefetch;
        const std::string& source = last_source_[backward];
        const auto& pass = backward ? cur().backward : cur().forward;
        if (source.empty() || pass.empty()) return;  // its source ran before the window
        prefetches_.push_back({backward, source, m.unit, pass.size() - 1, evidence(it)});
    }

    // A collective under a unit's scope belongs to that unit; under its
    // gradient reduction, it is one of that reduction's collectives.
    void on_collective(size_t i) {
        const TraceItem& it = items_[i];
        const Match* owner = nullptr;
        // A parent starts before its child: the walk only goes back (a dump
        // edited by hand cannot make it loop).
        for (int32_t p = it.parent, below = static_cast<int32_t>(i); p >= 0 && p < below && !owner;
             below = p, p = items_[p].parent)
            if (matches_[p] && matches_[p]->kind != EventKind::OptimizerStep) owner = &*matches_[p];
        if (!open_ && !owner) return;  // outside every micro-step: not the lifecycle's
        MicroStep& m = cur();
        m.collectives.push_back({it.name, owner ? owner->unit : std::string(), it.bytes, evidence(it)});
        if (owner && owner->kind == EventKind::GradReduce)
            reduce_colls_[{m.micro_step, owner->unit}].push_back(m.collectives.size() - 1);
    }

    MicroStep& cur() {
        if (!open_) begin_micro_step(true);
        return out_.micro_steps.back();
    }

    void begin_micro_step(bool partial) {
        end_micro_step();
        MicroStep m;
        m.global_step = global_step_;
        m.micro_step = micro_in_step_++;
        // Begun before the window: it did not start at the root's forward,
        // and the window did not start with the process.
        m.partial = partial && !(out_.from_start && out_.micro_steps.empty());
        if (m.partial) step_complete_ = false;
        out_.micro_steps.push_back(std::move(m));
        open_ = true;
        last_source_[0].clear();
        last_source_[1].clear();
    }

    void end_micro_step(bool complete = true) {
        if (!open_) return;
        open_ = false;
        const MicroStep& m = out_.micro_steps.back();
        if (complete && !m.partial)
            for (const Prefetch& p : prefetches_) check_prefetch(m, p);
        prefetches_.clear();
    }

    void check_prefetch(const MicroStep& m, const Prefetch& p) {
        const auto& pass = p.backward ? m.backward : m.forward;
        const std::string phase = p.backward ? "backward" : "forward";
        std::optional<size_t> before;
        for (size_t j = 0; j < pass.size(); ++j) {
            if (pass[j] != p.target) continue;
            if (j > p.source_pos) return;  // ran after its source: as configured
            before = j;
        }
        Finding f{.check = before ? "prefetch_order" : "prefetch_target_not_run", .message = {},
                  .global_step = m.global_step, .micro_step = m.micro_step, .phase = phase, .unit = p.source,
                  .records = {p.at}};
        if (before)
            f.message = p.source + " prefetched " + p.target + " at positions " + std::to_string(p.source_pos) + "->" +
                        std::to_string(*before) + " in " + phase + ": the target had already run";
        else
            f.message = p.source + " prefetched " + p.target + ", but the target did not execute in " + phase;
        out_.violations.push_back(std::move(f));
    }

    void optimizer_step(const TraceItem& it);
    void check_grad_sync(int last_micro);

    const std::vector<TraceItem>& items_;
    const Profile& profile_;
    Findings out_;
    std::vector<std::optional<Match>> matches_;
    std::set<std::string> units_;
    uint64_t lost_ = 0;
    bool process_ended_ = false;
    int global_step_ = 0, micro_in_step_ = 0;
    bool open_ = false;
    bool step_complete_ = false;  // this step was seen from its start
    std::string last_source_[2];
    std::vector<Prefetch> prefetches_;
    std::map<std::string, Evidence> pending_;          // all-gathers issued, not consumed
    std::set<std::string> step_forward_;               // units that ran forward in this step
    std::multimap<std::string, Evidence> step_backward_;  // units whose parameters took part in backward
    std::vector<GradReduce> reduces_;
    std::map<std::pair<int, std::string>, std::vector<size_t>> reduce_colls_;  // collectives of a reduction
};

void Analysis::optimizer_step(const TraceItem& it) {
    end_micro_step();
    const Evidence at = evidence(it);
    if (step_complete_) {
        for (const auto& [unit, ag] : pending_)
            out_.violations.push_back({.check = "pending_all_gather",
                                       .message = "all-gather of " + unit + " was issued and not consumed when the "
                                                  "optimizer step began",
                                       .global_step = global_step_, .micro_step = -1, .phase = "optimizer",
                                       .unit = unit, .records = {ag, at}});
        std::set<std::string> reported;
        for (const auto& [unit, ev] : step_backward_) {
            if (step_forward_.count(unit) || !reported.insert(unit).second) continue;
            out_.violations.push_back({.check = "bypassed_child",
                                       .message = unit + " had no forward in step " + std::to_string(global_step_) +
                                                  ", yet its parameters took part in backward",
                                       .global_step = global_step_, .micro_step = -1, .phase = "backward",
                                       .unit = unit, .records = {ev}});
        }
        check_grad_sync(micro_in_step_ - 1);
    }
    ++out_.optimizer_steps;
    ++global_step_;
    micro_in_step_ = 0;
    step_complete_ = true;  // the next step begins here, inside the window
    pending_.clear();
    step_forward_.clear();
    step_backward_.clear();
    reduces_.clear();
    reduce_colls_.clear();
}

// Gradients reduced on a micro-step other than the last of the window.
void Analysis::check_grad_sync(int last_micro) {
    std::map<int, Finding> by_micro;
    for (const GradReduce& r : reduces_) {
        if (r.micro_step >= last_micro) continue;
        Finding& f = by_micro[r.micro_step];
        f.records.push_back(r.at);
        if (auto c = reduce_colls_.find({r.micro_step, r.unit}); c != reduce_colls_.end()) {
            const MicroStep* m = nullptr;
            for (const MicroStep& s : out_.micro_steps)
                if (s.global_step == global_step_ && s.micro_step == r.micro_step) m = &s;
            for (size_t k : c->second) {
                ++f.extra_collectives;
                if (m) f.extra_bytes += m->collectives[k].bytes;
            }
        }
        f.unit += (f.unit.empty() ? "" : ", ") + r.unit;
    }
    for (auto& [micro, f] : by_micro) {
        f.check = "grad_sync_non_final_micro_step";
        f.global_step = global_step_;
        f.micro_step = micro;
        f.phase = "backward";
        f.message = "gradients of " + f.unit + " were reduced in micro-step " + std::to_string(micro) + " of " +
                    std::to_string(last_micro + 1) + " (not the last of the accumulation): " +
                    std::to_string(f.extra_collectives) + " extra reduction collectives, " +
                    (f.extra_bytes ? std::to_string(f.extra_bytes) + " bytes"
                                   : std::string("bytes unknown (the collective layer traced carries no sizes)"));
        out_.warnings.push_back(std::move(f));
    }
}

// The first point where `b`'s micro-step differs from the reference's `a`.
std::optional<Finding> diverge(const MicroStep& a, const MicroStep& b, const std::string& an, const std::string& bn) {
    Finding f;
    f.check = "rank_divergence";
    f.global_step = b.global_step;
    f.micro_step = b.micro_step;
    auto at = [](const auto& v, size_t k) { return k < v.size() ? v[k] : std::string("nothing"); };
    for (int backward = 0; backward < 2; ++backward) {
        const auto& x = backward ? a.backward : a.forward;
        const auto& y = backward ? b.backward : b.forward;
        const auto& xe = backward ? a.backward_at : a.forward_at;
        const auto& ye = backward ? b.backward_at : b.forward_at;
        size_t k = 0;
        while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
        if (k == x.size() && k == y.size()) continue;
        f.phase = backward ? "backward" : "forward";
        f.unit = k < y.size() ? y[k] : x[k];
        f.message = bn + " ran " + at(y, k) + " at " + f.phase + " position " + std::to_string(k) + " where " + an +
                    " ran " + at(x, k);
        if (k < xe.size()) f.records.push_back(xe[k]);
        if (k < ye.size()) f.records.push_back(ye[k]);
        return f;
    }
    auto coll = [](const MicroStep::Coll& c) {
        return c.key + " of " + std::to_string(c.bytes) + " bytes" + (c.unit.empty() ? "" : " (" + c.unit + ")");
    };
    const auto &x = a.collectives, &y = b.collectives;
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k].key == y[k].key && x[k].bytes == y[k].bytes) ++k;
    if (k == x.size() && k == y.size()) return std::nullopt;
    f.phase = "collectives";
    f.unit = k < y.size() ? y[k].unit : x[k].unit;
    f.message = bn + " issued " + (k < y.size() ? coll(y[k]) : "nothing") + " as collective " + std::to_string(k) +
                " of the micro-step where " + an + " issued " + (k < x.size() ? coll(x[k]) : "nothing");
    if (k < x.size()) f.records.push_back(x[k].at);
    if (k < y.size()) f.records.push_back(y[k].at);
    return f;
}

}  // namespace

std::vector<Finding> cross_rank(const std::vector<RankView>& ranks) {
    std::vector<Finding> out;
    if (ranks.size() < 2 || !ranks[0].report) return out;
    std::map<std::pair<int, int>, const MicroStep*> ref;
    for (const MicroStep& m : ranks[0].report->micro_steps)
        if (!m.partial) ref[{m.global_step, m.micro_step}] = &m;
    for (size_t r = 1; r < ranks.size(); ++r) {
        if (!ranks[r].report) continue;
        for (const MicroStep& m : ranks[r].report->micro_steps) {
            auto it = ref.find({m.global_step, m.micro_step});
            if (m.partial || it == ref.end()) continue;
            if (auto f = diverge(*it->second, m, ranks[0].name, ranks[r].name)) {
                out.push_back(std::move(*f));
                break;  // the first point where this rank differs
            }
        }
    }
    return out;
}

Findings analyse(const std::vector<TraceItem>& items, const Profile& profile, const Options& o) {
    return Analysis(items, profile, o).run();
}

}  // namespace commdbg::fsdp
