// SPDX-License-Identifier: Apache-2.0
// The FSDP lifecycle checks on synthetic event streams: the label sequences
// torch 2.6's FSDP2 emits (see docs/design/fsdp-labels.md), written out step by step,
// with one fault at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bounded_time.hpp"
#include "lifecycle.hpp"

namespace commdbg::fsdp {
namespace {

const Profile& fsdp2() {
    for (const Profile& p : builtin_profiles())
        if (p.name == "torch-fsdp2") return p;
    throw std::runtime_error("no built-in torch-fsdp2 profile");
}

// A trace written as nested scopes and collectives, one microsecond apart.
struct Stream {
    std::vector<TraceItem> items;
    std::vector<int32_t> open;
    uint64_t t = 1'000'000;
    uint32_t tid = 100;

    Stream& begin(const std::string& label) {
        items.push_back({.scope = true, .name = label, .tid = tid, .start_ns = t += 1000, .bytes = 0,
                         .parent = open.empty() ? -1 : open.back()});
        open.push_back(static_cast<int32_t>(items.size() - 1));
        return *this;
    }
    Stream& end() {
        open.pop_back();
        return *this;
    }
    Stream& leaf(const std::string& label) { return begin(label).end(); }
    Stream& coll(const std::string& key, uint64_t bytes) {
        items.push_back({.scope = false, .name = key, .tid = tid, .start_ns = t += 1000, .bytes = bytes,
                         .parent = open.empty() ? -1 : open.back()});
        return *this;
    }
};

std::string with(const std::string& label, const std::string& unit) {
    return unit == "<root>" ? label : label + " (" + unit + ")";
}

const std::vector<std::string> kUnits = {"layers.0", "layers.1", "layers.2", "layers.3"};

struct StepPlan {
    bool sync = true;  // reduce gradients (the last micro-step of an accumulation)
    std::vector<std::pair<std::string, std::string>> forward_prefetch;  // source -> target
    std::vector<std::string> skip_forward;  // units whose pre-forward never runs (their backward still does)
    std::vector<std::string> order = kUnits;
};

void all_gather(Stream& s, const std::string& u) {
    s.begin(with("FSDP::all_gather", u)).coll("c10d.all_gather", 1024).end();
    s.begin(with("FSDP::all_gather_copy_out", u)).end();
}

// One micro-step as FSDP2 labels it: the root's forward, each unit's
// pre-forward (all-gather, copy-out) and its explicit prefetches, then the
// backward in reverse, reducing gradients when `sync`.
void micro_step(Stream& s, const StepPlan& p) {
    s.leaf("FSDP::root_pre_forward");
    for (const auto& u : p.order) {
        if (std::count(p.skip_forward.begin(), p.skip_forward.end(), u)) continue;
        s.begin(with("FSDP::pre_forward", u));
        all_gather(s, u);
        s.end();
        for (const auto& [src, dst] : p.forward_prefetch)
            if (src == u) s.leaf("FSDP::forward_prefetch for " + dst);
        s.leaf(with("FSDP::post_forward", u));
    }
    for (auto it = p.order.rbegin(); it != p.order.rend(); ++it) {
        if (!std::count(p.skip_forward.begin(), p.skip_forward.end(), *it)) {
            s.begin(with("FSDP::pre_backward", *it));
            all_gather(s, *it);
            s.end();
        }
        s.leaf(with("FSDP::post_backward_accumulate", *it));
        s.leaf(with("FSDP::post_backward_reshard", *it));
        if (p.sync) s.begin(with("FSDP::post_backward_reduce", *it)).coll("c10d.reduce_scatter", 512).end();
    }
    s.leaf("FSDP::root_post_backward_callback");
}

// `steps` optimizer steps of `micro` micro-steps, gradients synced on the
// last micro-step only; `plan(step, micro)` may change one.
template <typename F>
Stream training(int steps, int micro, F&& plan) {
    Stream s;
    for (int g = 0; g < steps; ++g) {
        for (int m = 0; m < micro; ++m) {
            StepPlan p;
            p.sync = m == micro - 1;
            plan(g, m, p);
            micro_step(s, p);
        }
        s.leaf("Optimizer.step#SGD.step");
        s.leaf("Optimizer.zero_grad#SGD.zero_grad");
    }
    return s;
}
Stream training(int steps, int micro) {
    return training(steps, micro, [](int, int, StepPlan&) {});
}

Findings check(const Stream& s, bool from_start = true) { return analyse(s.items, fsdp2(), Options{from_start}); }

TEST(Lifecycle, BuiltinProfileParsesAndNamesUnitsAndTheRoot) {
    const Profile& p = fsdp2();
    auto m = p.match("FSDP::pre_forward (layers.1)");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->kind, EventKind::PreForward);
    EXPECT_EQ(m->unit, "layers.1");
    // The root's labels carry no FQN; its prefetch target is "".
    EXPECT_EQ(p.match("FSDP::all_gather")->unit, "<root>");
    EXPECT_EQ(p.match("FSDP::forward_prefetch for ")->unit, "<root>");
    EXPECT_EQ(p.match("FSDP::backward_prefetch for layers.0")->kind, EventKind::BackwardPrefetch);
    // A unit of several modules is named as FSDP2 names it.
    EXPECT_EQ(p.match("FSDP::post_backward_reduce (layers.0, layers.1)")->unit, "layers.0, layers.1");
    EXPECT_EQ(p.match("Optimizer.step#AdamW.step")->kind, EventKind::OptimizerStep);
    EXPECT_FALSE(p.match("Optimizer.zero_grad#SGD.zero_grad"));
    EXPECT_FALSE(p.match("FSDP::pre_forwardX"));
    EXPECT_FALSE(p.match("my_phase"));
}

TEST(Lifecycle, ProfileErrorsSayWhatIsWrong) {
    auto bad = [](const std::string& text) {
        auto r = parse_profile(text, "f.json");
        EXPECT_FALSE(r);
        return r ? std::string() : r.error();
    };
    EXPECT_NE(bad("{").find("not valid JSON"), std::string::npos);
    EXPECT_NE(bad(R"({"name": "x", "events": []})").find("at least one event"), std::string::npos);
    std::string e = bad(R"({"name": "x", "events": [{"event": "warp", "label": "a"}]})");
    EXPECT_NE(e.find("unknown event \"warp\""), std::string::npos) << e;
    EXPECT_NE(e.find("pre_forward"), std::string::npos) << "lists the known events: " << e;
    e = bad(R"({"name": "x", "events": [{"event": "pre_forward", "label": "a {who}"}]})");
    EXPECT_NE(e.find("unknown placeholder {who}"), std::string::npos) << e;
    e = bad(R"({"name": "x", "events": [{"event": "pre_forward", "label": "a [b"}]})");
    EXPECT_NE(e.find("[ without ]"), std::string::npos) << e;
    // Regex metacharacters in a label are literal.
    auto ok = parse_profile(R"j({"name": "x", "events": [{"event": "pre_forward", "label": "a.b+({unit})"}]})j", "f");
    ASSERT_TRUE(ok) << ok.error();
    EXPECT_EQ(ok->match("a.b+(u)")->unit, "u");
    EXPECT_FALSE(ok->match("aXbb(u)"));
}

// Labels come from the traced process: a profile's pattern must answer in
// time linear in the label, whatever the pattern (twelve {any} backtracked
// for over a minute on a 61-byte label).
TEST(Lifecycle, LabelPatternOfTwelveAnyAnswersInBoundedTime) {
    std::string label_pattern;
    for (int i = 0; i < 12; ++i) label_pattern += "{any}";
    auto p = parse_profile(R"({"name": "x", "events": [{"event": "pre_forward", "label": ")" + label_pattern +
                               R"(!{unit}"}]})",
                           "f.json");
    ASSERT_TRUE(p) << p.error();
    const std::string miss(61, 'a');
    auto got = timing::finishes_within(timing::kPatternTimeBound, [prof = p.value(), miss] {
        return std::pair{prof.match(miss), prof.match(miss + "!u")};
    });
    ASSERT_TRUE(got) << "no answer within " << timing::kPatternTimeBound.count() << " s";
    EXPECT_FALSE(got->first);
    ASSERT_TRUE(got->second);
    EXPECT_EQ(got->second->unit, "u");
}

TEST(Lifecycle, OverLongLabelPatternIsRefusedWithABoundedMessage) {
    const std::string label(500000, 'a');
    auto p = parse_profile(R"({"name": "x", "events": [{"event": "pre_forward", "label": ")" + label + R"("}]})",
                           "f.json");
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().find("f.json: events[0]: label"), std::string::npos) << p.error().substr(0, 300);
    EXPECT_NE(p.error().find("500000 bytes, over the " + std::to_string(kMaxPatternBytes) + "-byte limit"),
              std::string::npos)
        << p.error().substr(0, 300);
    EXPECT_LT(p.error().size(), 400u) << "the label is quoted in part only";
}

TEST(Lifecycle, CleanRunHasNoFindingAndTheReferenceTraceEvidence) {
    auto s = training(3, 2, [](int, int, StepPlan& p) {
        p.forward_prefetch = {{"layers.0", "layers.1"}, {"layers.1", "layers.2"}, {"layers.2", "layers.3"}};
    });
    Findings r = check(s);
    EXPECT_TRUE(r.violations.empty()) << to_json(r).dump(2);
    EXPECT_TRUE(r.warnings.empty()) << to_json(r).dump(2);
    EXPECT_TRUE(r.notes.empty()) << to_json(r).dump(2);
    EXPECT_EQ(r.units, kUnits);
    EXPECT_EQ(r.optimizer_steps, 3u);
    ASSERT_EQ(r.micro_steps.size(), 6u);
    for (size_t i = 0; i < r.micro_steps.size(); ++i) {
        const MicroStep& m = r.micro_steps[i];
        EXPECT_EQ(m.global_step, static_cast<int>(i / 2));
        EXPECT_EQ(m.micro_step, static_cast<int>(i % 2));
        EXPECT_FALSE(m.partial);
        EXPECT_EQ(m.forward, kUnits);
        EXPECT_EQ(m.backward, std::vector<std::string>(kUnits.rbegin(), kUnits.rend()));
        // Forward and backward all-gathers of 4 units, reductions on the last micro-step.
        EXPECT_EQ(m.collectives.size(), m.micro_step == 1 ? 12u : 8u);
        EXPECT_EQ(m.collectives.front().unit, "layers.0");
    }
    auto j = to_json(r);
    EXPECT_EQ(j["window"], "from_start");
    EXPECT_EQ(j["micro_steps"][1]["comm_counts"]["c10d.reduce_scatter"], 4);
    // Each unit's forward and backward all-gather, and on the synced micro-step its reduce-scatter.
    for (const auto& u : kUnits) {
        EXPECT_EQ(j["micro_steps"][1]["unit_comm_counts"][u]["c10d.all_gather"], 2) << u;
        EXPECT_EQ(j["micro_steps"][1]["unit_comm_counts"][u]["c10d.reduce_scatter"], 1) << u;
        EXPECT_FALSE(j["micro_steps"][0]["unit_comm_counts"][u].contains("c10d.reduce_scatter")) << u;
    }
    EXPECT_NE(render_section(r).find("no violation"), std::string::npos);
}

TEST(Lifecycle, PrefetchOfAUnitThatRanEarlierIsOutOfOrder) {
    auto s = training(2, 2, [](int, int, StepPlan& p) { p.forward_prefetch = {{"layers.2", "layers.0"}}; });
    Findings r = check(s);
    ASSERT_EQ(r.violations.size(), 4u) << "one per micro-step: " << to_json(r).dump(2);
    for (size_t i = 0; i < 4; ++i) {
        const Finding& f = r.violations[i];
        EXPECT_EQ(f.check, "prefetch_order");
        EXPECT_EQ(f.unit, "layers.2");
        EXPECT_EQ(f.phase, "forward");
        EXPECT_EQ(f.global_step, static_cast<int>(i / 2));
        EXPECT_EQ(f.micro_step, static_cast<int>(i % 2));
        EXPECT_EQ(f.message, "layers.2 prefetched layers.0 at positions 2->0 in forward: the target had already run");
        ASSERT_EQ(f.records.size(), 1u);
        EXPECT_EQ(f.records[0].name, "FSDP::forward_prefetch for layers.0");
    }
}

TEST(Lifecycle, PrefetchOfAUnitThatNeverRunsIsNamed) {
    auto s = training(1, 2, [](int, int, StepPlan& p) { p.forward_prefetch = {{"layers.1", "unused"}}; });
    Findings r = check(s);
    ASSERT_EQ(r.violations.size(), 2u) << to_json(r).dump(2);
    for (const Finding& f : r.violations) {
        EXPECT_EQ(f.check, "prefetch_target_not_run");
        EXPECT_EQ(f.message, "layers.1 prefetched unused, but the target did not execute in forward");
    }
    // A prefetch label alone does not make its target a unit of the model.
    EXPECT_EQ(r.units, kUnits);
}

TEST(Lifecycle, AllGatherLeftAtTheOptimizerStepIsPending) {
    Stream s;
    for (int g = 0; g < 2; ++g) {
        micro_step(s, StepPlan{});
        // unshard(async_op=True) with nothing consuming it, on step 1 only.
        if (g == 1) s.begin("FSDP::all_gather (layers.3)").coll("c10d.all_gather", 1024).end();
        s.leaf("Optimizer.step#SGD.step");
    }
    Findings r = check(s);
    ASSERT_EQ(r.violations.size(), 1u) << to_json(r).dump(2);
    const Finding& f = r.violations[0];
    EXPECT_EQ(f.check, "pending_all_gather");
    EXPECT_EQ(f.unit, "layers.3");
    EXPECT_EQ(f.global_step, 1);
    EXPECT_EQ(f.micro_step, -1);
    EXPECT_EQ(f.phase, "optimizer");
    ASSERT_EQ(f.records.size(), 2u);
    EXPECT_EQ(f.records[0].name, "FSDP::all_gather (layers.3)");
    EXPECT_EQ(f.records[1].name, "Optimizer.step#SGD.step");
    EXPECT_LT(f.records[0].start_ns, f.records[1].start_ns);
}

TEST(Lifecycle, AllGatherConsumedBeforeTheStepIsNotPending) {
    Stream s;
    micro_step(s, StepPlan{});
    all_gather(s, "layers.3");
    s.leaf("Optimizer.step#SGD.step");
    EXPECT_TRUE(check(s).violations.empty());
}

TEST(Lifecycle, UnitWithoutForwardWhoseParametersGotGradientsIsBypassed) {
    auto s = training(3, 1, [](int g, int, StepPlan& p) {
        if (g >= 1) p.skip_forward = {"layers.1"};
    });
    Findings r = check(s);
    ASSERT_EQ(r.violations.size(), 2u) << to_json(r).dump(2);
    for (int i = 0; i < 2; ++i) {
        const Finding& f = r.violations[i];
        EXPECT_EQ(f.check, "bypassed_child");
        EXPECT_EQ(f.unit, "layers.1");
        EXPECT_EQ(f.global_step, i + 1);
        EXPECT_EQ(f.message, "layers.1 had no forward in step " + std::to_string(i + 1) +
                                 ", yet its parameters took part in backward");
        ASSERT_FALSE(f.records.empty());
        EXPECT_EQ(f.records[0].name, "FSDP::post_backward_accumulate (layers.1)");
    }
    EXPECT_EQ(r.micro_steps[1].forward, (std::vector<std::string>{"layers.0", "layers.2", "layers.3"}));
}

TEST(Lifecycle, ForwardInAnotherMicroStepOfTheStepIsNotABypass) {
    auto s = training(1, 2, [](int, int m, StepPlan& p) {
        if (m == 1) p.skip_forward = {"layers.1"};
    });
    EXPECT_TRUE(check(s).violations.empty());
}

TEST(Lifecycle, GradientsReducedBeforeTheLastMicroStepAreAWarningWithTheExtraCount) {
    auto s = training(2, 3, [](int, int, StepPlan& p) { p.sync = true; });
    Findings r = check(s);
    EXPECT_TRUE(r.violations.empty()) << to_json(r).dump(2);
    ASSERT_EQ(r.warnings.size(), 4u) << "micro-steps 0 and 1 of each step: " << to_json(r).dump(2);
    for (size_t i = 0; i < 4; ++i) {
        const Finding& f = r.warnings[i];
        EXPECT_EQ(f.check, "grad_sync_non_final_micro_step");
        EXPECT_EQ(f.global_step, static_cast<int>(i / 2));
        EXPECT_EQ(f.micro_step, static_cast<int>(i % 2));
        EXPECT_EQ(f.extra_collectives, 4u);
        EXPECT_EQ(f.extra_bytes, 4u * 512);
        EXPECT_EQ(f.unit, "layers.3, layers.2, layers.1, layers.0");
        EXPECT_EQ(f.records.size(), 4u);
    }
    EXPECT_EQ(to_json(r)["warnings"][0]["extra_bytes"], 2048);
}

TEST(Lifecycle, NoOptimizerStepRunsNoBoundaryCheckAndSaysSo) {
    Stream s;
    micro_step(s, StepPlan{});
    s.begin("FSDP::all_gather (layers.3)").coll("c10d.all_gather", 1024).end();
    Findings r = check(s);
    EXPECT_TRUE(r.violations.empty()) << "a pending all-gather is only known at the boundary";
    EXPECT_EQ(r.optimizer_steps, 0u);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("no optimizer step in the window"), std::string::npos);
    ASSERT_EQ(r.micro_steps.size(), 1u);
    EXPECT_EQ(r.micro_steps[0].forward, kUnits);
}

TEST(Lifecycle, WindowThatStartsMidStepSkipsThatStepsBoundaryChecks) {
    // The window opens in step 0's backward: layers.1's forward was not seen.
    Stream s;
    s.leaf("FSDP::post_backward_accumulate (layers.1)");
    s.begin("FSDP::all_gather (layers.3)").coll("c10d.all_gather", 1024).end();
    s.leaf("FSDP::root_post_backward_callback");
    s.leaf("Optimizer.step#SGD.step");
    Stream rest = training(1, 1, [](int, int, StepPlan& p) { p.skip_forward = {"layers.1"}; });
    const auto base = static_cast<int32_t>(s.items.size());
    for (auto it : rest.items) {
        it.start_ns += s.t;
        if (it.parent >= 0) it.parent += base;
        s.items.push_back(it);
    }
    Findings r = check(s, /*from_start=*/false);
    ASSERT_GE(r.micro_steps.size(), 2u);
    EXPECT_TRUE(r.micro_steps[0].partial);
    EXPECT_FALSE(r.micro_steps[1].partial);
    EXPECT_EQ(r.micro_steps[1].global_step, 1);
    EXPECT_EQ(r.micro_steps[1].micro_step, 0);
    // Step 0: nothing reported; step 1, seen whole: its bypass is.
    ASSERT_EQ(r.violations.size(), 1u) << to_json(r).dump(2);
    EXPECT_EQ(r.violations[0].check, "bypassed_child");
    EXPECT_EQ(r.violations[0].global_step, 1);
    EXPECT_EQ(to_json(r)["window"], "attached");
    ASSERT_FALSE(r.notes.empty());
}

TEST(Lifecycle, RootUnitIsNamedRoot) {
    Stream s;
    s.leaf("FSDP::root_pre_forward");
    s.begin("FSDP::pre_forward").begin("FSDP::all_gather").coll("c10d.all_gather", 64).end();
    s.leaf("FSDP::all_gather_copy_out").end();
    s.leaf("FSDP::forward_prefetch for layers.0");
    s.begin("FSDP::pre_forward (layers.0)").end();
    s.begin("FSDP::pre_backward (layers.0)").end();
    s.begin("FSDP::pre_backward").end();
    s.leaf("Optimizer.step#SGD.step");
    Findings r = check(s);
    EXPECT_EQ(r.units, (std::vector<std::string>{"<root>", "layers.0"}));
    ASSERT_EQ(r.micro_steps.size(), 1u);
    EXPECT_EQ(r.micro_steps[0].forward, (std::vector<std::string>{"<root>", "layers.0"}));
    EXPECT_EQ(r.micro_steps[0].backward, (std::vector<std::string>{"layers.0", "<root>"}));
    EXPECT_EQ(r.micro_steps[0].collectives.at(0).unit, "<root>");
    // The root prefetched layers.0, which ran after it.
    EXPECT_TRUE(r.violations.empty()) << to_json(r).dump(2);
}

TEST(Lifecycle, UnitOfSeveralModulesIsOneUnit) {
    Stream s;
    s.leaf("FSDP::root_pre_forward");
    s.begin("FSDP::pre_forward (layers.0, layers.1)").end();
    s.leaf("FSDP::post_backward_accumulate (layers.0, layers.1)");
    s.leaf("Optimizer.step#SGD.step");
    Findings r = check(s);
    EXPECT_EQ(r.units, (std::vector<std::string>{"layers.0, layers.1"}));
    EXPECT_TRUE(r.violations.empty()) << to_json(r).dump(2);
}

TEST(Lifecycle, RanksThatRanDifferentUnitOrdersDivergeAtTheFirstPoint) {
    auto a = training(3, 2);
    auto b = training(3, 2, [](int g, int m, StepPlan& p) {
        if (g == 1 && m == 0) p.order = {"layers.0", "layers.2", "layers.1", "layers.3"};
    });
    Findings ra = check(a), rb = check(b);
    EXPECT_TRUE(cross_rank({{"rank 0", &ra}, {"rank 1", &ra}}).empty());
    auto fs = cross_rank({{"rank 0", &ra}, {"rank 1", &rb}});
    ASSERT_EQ(fs.size(), 1u);
    const Finding& f = fs[0];
    EXPECT_EQ(f.check, "rank_divergence");
    EXPECT_EQ(f.global_step, 1);
    EXPECT_EQ(f.micro_step, 0);
    EXPECT_EQ(f.phase, "forward");
    EXPECT_EQ(f.unit, "layers.2");
    EXPECT_EQ(f.message, "rank 1 ran layers.2 at forward position 1 where rank 0 ran layers.1");
    ASSERT_EQ(f.records.size(), 2u);
    EXPECT_EQ(f.records[0].name, "FSDP::pre_forward (layers.1)");
    EXPECT_EQ(f.records[1].name, "FSDP::pre_forward (layers.2)");
}

TEST(Lifecycle, RanksWithTheSameOrderButOtherCollectivesDiverge) {
    auto a = training(2, 1);
    Stream b = training(2, 1);
    // Rank 1's layers.2 forward all-gather moved 2048 bytes, not 1024.
    size_t seen = 0;
    for (auto& it : b.items)
        if (!it.scope && it.name == "c10d.all_gather" && ++seen == 8 + 3) it.bytes = 2048;
    Findings ra = check(a), rb = check(b);
    auto fs = cross_rank({{"rank 0", &ra}, {"rank 1", &rb}});
    ASSERT_EQ(fs.size(), 1u);
    EXPECT_EQ(fs[0].phase, "collectives");
    EXPECT_EQ(fs[0].global_step, 1);
    EXPECT_EQ(fs[0].unit, "layers.2");
    EXPECT_EQ(fs[0].message, "rank 1 issued c10d.all_gather of 2048 bytes (layers.2) as collective 2 of the "
                             "micro-step where rank 0 issued c10d.all_gather of 1024 bytes (layers.2)");
}

// The processes read_dump hands over, or its error in place of them.
struct ReadDump {
    std::vector<DumpedProcess> ps;
    std::string error;
};
ReadDump read_text(const std::string& text) {
    ReadDump out;
    std::istringstream in(text);
    auto r = read_dump(in, [&](DumpedProcess&& p) { out.ps.push_back(std::move(p)); });
    if (!r) out.error = r.error();
    else EXPECT_EQ(*r, out.ps.size());
    return out;
}

TEST(Lifecycle, ItemsFromAJsonDumpKeepOnlyOutermostCollectivesUnderTheirScope) {
    auto d = read_text(R"j({"records": [
      {"type": "scope", "name": "FSDP::all_gather (layers.0)", "tid": 7, "start_ns": 10, "children": [
        {"type": "op", "name": "aten::cat", "tid": 7, "start_ns": 11, "children": [
          {"type": "collective", "layer": "c10d", "collective": "all_gather", "bytes": 64, "tid": 7, "start_ns": 12,
           "children": [{"type": "collective", "layer": "c10d", "collective": "all_gather", "tid": 7,
                         "start_ns": 13, "children": []}]}]}]},
      {"type": "collective", "layer": "nccl", "collective": "all_reduce", "tid": 8, "start_ns": 5, "children": []}
    ]})j");
    ASSERT_EQ(d.error, "");
    ASSERT_EQ(d.ps.size(), 1u);
    const auto& items = d.ps[0].items;
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].name, "nccl.all_reduce");  // start order across threads
    EXPECT_EQ(items[0].parent, -1);
    EXPECT_TRUE(items[1].scope);
    EXPECT_EQ(items[1].name, "FSDP::all_gather (layers.0)");
    EXPECT_EQ(items[2].name, "c10d.all_gather");
    EXPECT_EQ(items[2].bytes, 64u);
    EXPECT_EQ(items[2].parent, 1);
    EXPECT_EQ(items[2].tid, 7u);
    EXPECT_FALSE(d.ps[0].from_start);
    EXPECT_TRUE(read_text(R"({"fsdp": {"window": "from_start"}})").ps.at(0).from_start);
}

// The reader sees a record's fields as they come: "children" before "type"
// still puts a collective under its scope and sums its children's bytes.
TEST(Lifecycle, DumpRecordsAreReadInAnyKeyOrder) {
    auto d = read_text(R"j({"records": [
      {"children": [
        {"children": [{"bytes": 40, "collective": "all_gather", "type": "collective", "layer": "nccl", "start_ns": 12},
                      {"bytes": 24, "type": "collective", "layer": "nccl", "collective": "all_gather", "start_ns": 13}],
         "start_ns": 11, "tid": 7, "collective": "all_gather", "layer": "c10d", "type": "collective"}],
       "start_ns": 10, "tid": 7, "name": "FSDP::all_gather (layers.0)", "type": "scope"}]})j");
    ASSERT_EQ(d.error, "");
    const auto& items = d.ps.at(0).items;
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].name, "FSDP::all_gather (layers.0)");
    EXPECT_EQ(items[1].name, "c10d.all_gather");
    EXPECT_EQ(items[1].parent, 0);
    EXPECT_EQ(items[1].bytes, 64u);  // its NCCL calls', as in a live trace
}

// The multi-process form: each process's own fields; the top object's are no process then.
TEST(Lifecycle, DumpProcessesCarryTheirPidRankLossAndEnd) {
    auto d = read_text(R"j({"records": [{"type": "scope", "name": "top", "start_ns": 1}], "processes": [
      {"process": {"pid": 41, "exit_code": null, "signal": 9}, "dropped_records": 3,
       "communicators": [{"rank": -1}, {"rank": 2}, {"rank": 0}], "fsdp": {"window": "from_start"}},
      {"process": {"pid": 42, "exit_code": null}, "thread_names": {"7": [[[{"x": 1}]]]}}]})j");
    ASSERT_EQ(d.error, "");
    ASSERT_EQ(d.ps.size(), 2u);
    EXPECT_EQ(d.ps[0].pid, 41u);
    EXPECT_EQ(d.ps[0].rank, 2);  // the first rank a communicator knows
    EXPECT_EQ(d.ps[0].dropped_records, 3u);
    EXPECT_TRUE(d.ps[0].ended);
    EXPECT_TRUE(d.ps[0].from_start);
    EXPECT_EQ(d.ps[1].pid, 42u);
    EXPECT_EQ(d.ps[1].rank, -1);
    EXPECT_FALSE(d.ps[1].ended);  // still running
    EXPECT_TRUE(d.ps[1].items.empty());
}

// An error deep in the records names the path with its middle elided: the message stays a line.
TEST(Lifecycle, DumpErrorDeepInTheRecordsNamesAShortPath) {
    std::string text = R"({"records": [)";
    for (int i = 0; i < 1000; ++i) text += R"({"children": [)";
    text += R"({"tid": "7"})";
    for (int i = 0; i < 1000; ++i) text += "]}";
    auto d = read_text(text + "]}");
    EXPECT_EQ(d.error, "field \"records[0].children[0].children[0]...children[0].children[0].children[0].children[0].tid\": "
                       "expected an unsigned integer, got a string");
}

TEST(Lifecycle, ProfileFromAFileRecognisesAnotherFrameworksLabelsFirst) {
    // A scheduler of its own that labels its steps "hsdp/<event>:<unit>".
    const std::string path = ::testing::TempDir() + "/hsdp-profile.json";
    {
        std::ofstream f(path);
        f << R"j({"name": "my-hsdp", "root_unit": "model",
                  "events": [{"event": "optimizer_step", "label": "train/step"},
                             {"event": "root_forward", "label": "hsdp/begin"},
                             {"event": "pre_forward", "label": "hsdp/fwd:{unit}"},
                             {"event": "all_gather", "label": "hsdp/gather:{unit}"},
                             {"event": "all_gather_copy_out", "label": "hsdp/use:{unit}"},
                             {"event": "pre_backward", "label": "hsdp/bwd:{unit}"}]})j";
    }
    auto p = load_profile(path);
    ASSERT_TRUE(p) << p.error();
    Stream s;
    for (int g = 0; g < 2; ++g) {
        s.leaf("hsdp/begin");
        for (const char* u : {"blocks.0", "blocks.1"}) s.begin(std::string("hsdp/fwd:") + u).end();
        for (const char* u : {"blocks.1", "blocks.0"}) s.begin(std::string("hsdp/bwd:") + u).end();
        if (g == 1) s.begin("hsdp/gather:blocks.0").coll("nccl.all_gather", 256).end();
        s.leaf("train/step");
    }
    const std::vector<Profile> mine = {*p};
    const Profile* found = detect_profile(s.items, mine);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found->name, "my-hsdp");
    EXPECT_EQ(detect_profile(s.items), nullptr) << "no built-in profile knows these labels";
    Findings r = analyse(s.items, *found, Options{true});
    EXPECT_EQ(r.units, (std::vector<std::string>{"blocks.0", "blocks.1"}));
    EXPECT_EQ(r.optimizer_steps, 2u);
    ASSERT_EQ(r.micro_steps.size(), 2u);
    EXPECT_EQ(r.micro_steps[1].backward, (std::vector<std::string>{"blocks.1", "blocks.0"}));
    ASSERT_EQ(r.violations.size(), 1u) << to_json(r).dump(2);
    EXPECT_EQ(r.violations[0].check, "pending_all_gather");
    EXPECT_EQ(r.violations[0].unit, "blocks.0");
    EXPECT_EQ(r.violations[0].global_step, 1);
    auto missing = load_profile(::testing::TempDir() + "/no-such-profile.json");
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().find("cannot read the file"), std::string::npos);
}


TEST(Lifecycle, MicroStepCutByTheWindowsEndIsNotChecked) {
    // The window ends right after layers.0 prefetched layers.1 in forward.
    Stream s = training(1, 1);
    s.leaf("FSDP::root_pre_forward");
    s.begin("FSDP::pre_forward (layers.0)").end();
    s.leaf("FSDP::forward_prefetch for layers.1");
    Findings r = check(s);
    EXPECT_TRUE(r.violations.empty()) << to_json(r).dump(2);
    ASSERT_EQ(r.micro_steps.size(), 2u);
    bool said = false;
    for (const auto& n : r.notes) said = said || n.find("prefetches were not checked") != std::string::npos;
    EXPECT_TRUE(said) << to_json(r).dump(2);
    EXPECT_TRUE(r.micro_steps.back().partial) << "cut by the window: not compared across ranks";
    // Another rank's window ended later in the same micro-step: no divergence there.
    Stream later = s;
    later.begin("FSDP::pre_forward (layers.1)").end();
    Findings rl = check(later);
    EXPECT_TRUE(cross_rank({{"rank 0", &r}, {"rank 1", &rl}}).empty());
    // Ended by the process, the micro-step is whole as far as it went.
    Findings ended = analyse(s.items, fsdp2(), Options{.from_start = true, .process_ended = true});
    EXPECT_FALSE(ended.micro_steps.back().partial);
    // The same prefetch in a micro-step that ended is checked.
    s.leaf("Optimizer.step#SGD.step");
    r = check(s);
    ASSERT_EQ(r.violations.size(), 1u) << to_json(r).dump(2);
    EXPECT_EQ(r.violations[0].check, "prefetch_target_not_run");
}

}  // namespace
}  // namespace commdbg::fsdp
