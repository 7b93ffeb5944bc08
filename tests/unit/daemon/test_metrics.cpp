// SPDX-License-Identifier: Apache-2.0
// MetricsRegistry: counter monotonicity, the series cap and its overflow
// counter, retire + expire after the ttl, and the text exposition format,
// checked by a small parser written independently of the renderer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <regex>
#include <sstream>

#include "metrics.hpp"

using namespace commdbg;
using namespace commdbg::daemon;
using namespace std::chrono_literals;

namespace {

using Clock = MetricsRegistry::Clock;
const Clock::time_point t0 = Clock::time_point{} + 1000h;

struct Sample {
    std::string name;
    Labels labels;
    double value = 0;
};

struct Exposition {
    std::vector<Sample> samples;
    std::vector<std::pair<std::string, std::string>> help;  // name, text (unescaped)
    std::vector<std::pair<std::string, std::string>> type;  // name, type
    std::vector<std::string> errors;                        // lines that did not parse
};

std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            char n = s[++i];
            out += n == 'n' ? '\n' : n;
        } else {
            out += s[i];
        }
    }
    return out;
}

// Independent of metrics.cpp: a line grammar for 0.0.4 text exposition.
Exposition parse(const std::string& text) {
    static const std::regex help_re(R"(^# HELP ([a-zA-Z_][a-zA-Z0-9_]*) (.*)$)");
    static const std::regex type_re(R"(^# TYPE ([a-zA-Z_][a-zA-Z0-9_]*) (counter|gauge|untyped)$)");
    static const std::regex sample_re(R"(^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})? (\S+)$)");
    static const std::regex label_re(R"(^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)\"(,|$))");
    Exposition e;
    if (text.empty() || text.back() != '\n') e.errors.push_back("<text does not end in a newline>");
    std::istringstream in(text);
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
        if (std::regex_match(line, m, help_re)) {
            e.help.emplace_back(m[1], unescape(m[2]));
        } else if (std::regex_match(line, m, type_re)) {
            e.type.emplace_back(m[1], m[2]);
        } else if (std::regex_match(line, m, sample_re)) {
            Sample s;
            s.name = m[1];
            std::string body = m[2];
            std::string value = m[3];
            bool ok = true;
            while (!body.empty()) {
                std::smatch lm;
                if (!std::regex_search(body, lm, label_re)) {
                    ok = false;
                    break;
                }
                s.labels.emplace_back(lm[1], unescape(lm[2]));
                body = lm.suffix();
            }
            char* end = nullptr;
            s.value = std::strtod(value.c_str(), &end);
            if (!ok || end != value.c_str() + value.size()) e.errors.push_back(line);
            else e.samples.push_back(s);
        } else {
            e.errors.push_back(line);
        }
    }
    return e;
}

std::optional<double> value_of(const MetricsRegistry& r, const std::string& name, const Labels& labels) {
    for (const auto& s : parse(r.render()).samples) {
        if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
}

size_t count_lines_starting(const std::string& text, const std::string& prefix) {
    std::istringstream in(text);
    std::string line;
    size_t n = 0;
    while (std::getline(in, line)) n += line.rfind(prefix, 0) == 0;
    return n;
}

}  // namespace

// ---- monotonicity -----------------------------------------------------------

TEST(Metrics, CounterIgnoresLowerValue) {
    MetricsRegistry r;
    r.describe("calls_total", "Calls.", "counter");
    Labels l = {{"kind", "all_reduce"}};
    r.set("calls_total", l, 10, 0, t0);
    r.set("calls_total", l, 4, 0, t0);
    EXPECT_EQ(value_of(r, "calls_total", l), 10);
    r.set("calls_total", l, 12, 0, t0);
    EXPECT_EQ(value_of(r, "calls_total", l), 12);
}

TEST(Metrics, GaugeAcceptsLowerValue) {
    MetricsRegistry r;
    r.describe("inflight", "In flight.", "gauge");
    r.set("inflight", {}, 10, 0, t0);
    r.set("inflight", {}, 4, 0, t0);
    EXPECT_EQ(value_of(r, "inflight", {}), 4);
}

// ---- cap and overflow -------------------------------------------------------

TEST(Metrics, NewSeriesBeyondCapIsDroppedAndCounted) {
    MetricsRegistry r(2);
    r.describe("calls_total", "Calls.", "counter");
    r.set("calls_total", {{"k", "a"}}, 1, 0, t0);
    r.set("calls_total", {{"k", "b"}}, 1, 0, t0);
    r.set("calls_total", {{"k", "c"}}, 1, 0, t0);
    r.set("other_total", {}, 1, 0, t0);
    EXPECT_EQ(r.series(), 2u);
    EXPECT_EQ(r.overflowed(), 2u);
    EXPECT_FALSE(value_of(r, "calls_total", {{"k", "c"}}));
    EXPECT_FALSE(value_of(r, "other_total", {}));
    EXPECT_EQ(value_of(r, "commdbg_series_overflow_total", {}), 2);
    // Stored series still update at the cap.
    r.set("calls_total", {{"k", "a"}}, 7, 0, t0);
    EXPECT_EQ(value_of(r, "calls_total", {{"k", "a"}}), 7);
    EXPECT_EQ(r.overflowed(), 2u);
}

TEST(Metrics, OverflowCounterIsRenderedWhenNothingElseIs) {
    MetricsRegistry r;
    std::string text = r.render();
    EXPECT_NE(text.find("# TYPE commdbg_series_overflow_total counter\n"), std::string::npos) << text;
    EXPECT_EQ(value_of(r, "commdbg_series_overflow_total", {}), 0);
}

TEST(Metrics, DueRetiredSeriesMakeRoomAtTheCap) {
    MetricsRegistry r(1, 60s);
    r.set("x", {{"pid", "7"}}, 1, 7, t0);
    r.retire_pid(7, t0);
    r.set("x", {{"pid", "8"}}, 1, 8, t0 + 30s);
    EXPECT_EQ(r.overflowed(), 1u);
    r.set("x", {{"pid", "8"}}, 1, 8, t0 + 60s);
    EXPECT_EQ(r.overflowed(), 1u);
    EXPECT_EQ(r.series(), 1u);
    EXPECT_TRUE(value_of(r, "x", {{"pid", "8"}}));
}

// ---- retire and expire ------------------------------------------------------

TEST(Metrics, RetiredSeriesKeepValueUntilTtlThenExpire) {
    MetricsRegistry r(100, 60s);
    r.describe("calls_total", "Calls.", "counter");
    r.set("calls_total", {{"pid", "7"}}, 5, 7, t0);
    r.set("calls_total", {{"pid", "8"}}, 6, 8, t0);
    r.set("calls_total", {}, 11, 0, t0);
    r.retire_pid(7, t0 + 10s);
    r.expire(t0 + 69s);
    EXPECT_EQ(r.series(), 3u);
    EXPECT_EQ(value_of(r, "calls_total", {{"pid", "7"}}), 5);
    r.expire(t0 + 70s);
    EXPECT_EQ(r.series(), 2u);
    EXPECT_FALSE(value_of(r, "calls_total", {{"pid", "7"}}));
    EXPECT_EQ(value_of(r, "calls_total", {{"pid", "8"}}), 6);
    EXPECT_EQ(value_of(r, "calls_total", {}), 11);
    // Series not tied to a process never expire.
    r.expire(t0 + 1000h);
    EXPECT_EQ(r.series(), 2u);
}

TEST(Metrics, LateSampleDoesNotExtendARetiredSeries) {
    MetricsRegistry r(100, 60s);
    r.set("x", {{"pid", "7"}}, 1, 7, t0);
    r.retire_pid(7, t0);
    r.set("x", {{"pid", "7"}}, 2, 7, t0 + 50s);
    r.retire_pid(7, t0 + 50s);
    r.expire(t0 + 60s);
    EXPECT_EQ(r.series(), 0u);
}

TEST(Metrics, SeriesCreatedAfterRetireShareTheDeadline) {
    MetricsRegistry r(100, 60s);
    r.retire_pid(7, t0);
    r.set("x", {{"pid", "7"}}, 1, 7, t0 + 5s);
    r.expire(t0 + 59s);
    EXPECT_EQ(r.series(), 1u);
    r.expire(t0 + 60s);
    EXPECT_EQ(r.series(), 0u);
    // The retirement itself is gone too: the pid may be reused.
    r.set("x", {{"pid", "7"}}, 1, 7, t0 + 61s);
    r.expire(t0 + 1000h);
    EXPECT_EQ(r.series(), 1u);
}

// ---- validation -------------------------------------------------------------

TEST(Metrics, InvalidNamesAndCounterValuesAreDroppedAndCounted) {
    MetricsRegistry r;
    r.describe("calls_total", "Calls.", "counter");
    r.set("1calls", {}, 1, 0, t0);
    r.set("calls-total", {}, 1, 0, t0);
    r.set("", {}, 1, 0, t0);
    r.set("calls_total", {{"bad label", "v"}}, 1, 0, t0);
    r.set("calls_total", {{"9", "v"}}, 1, 0, t0);
    r.set("calls_total", {{"k", "a"}, {"k", "b"}}, 1, 0, t0);
    r.set("calls_total", {}, -1, 0, t0);
    r.set("calls_total", {}, std::nan(""), 0, t0);
    r.set("commdbg_series_overflow_total", {}, 99, 0, t0);
    EXPECT_EQ(r.series(), 0u);
    EXPECT_EQ(r.invalid(), 9u);
    EXPECT_EQ(r.overflowed(), 0u);
    EXPECT_EQ(value_of(r, "commdbg_series_invalid_total", {}), 9);
    EXPECT_EQ(value_of(r, "commdbg_series_overflow_total", {}), 0);
}

// ---- exposition format ------------------------------------------------------

TEST(Metrics, HelpAndTypeOncePerFamilyBeforeItsSamples) {
    MetricsRegistry r;
    r.describe("calls_total", "Calls seen.", "counter");
    r.describe("depth", "Depth.", "gauge");
    r.set("calls_total", {{"k", "a"}}, 1, 0, t0);
    r.set("calls_total", {{"k", "b"}}, 2, 0, t0);
    r.set("depth", {}, 3, 0, t0);
    std::string text = r.render();
    EXPECT_EQ(count_lines_starting(text, "# HELP calls_total "), 1u) << text;
    EXPECT_EQ(count_lines_starting(text, "# TYPE calls_total "), 1u) << text;
    EXPECT_EQ(count_lines_starting(text, "# TYPE depth "), 1u) << text;
    EXPECT_NE(text.find("# HELP calls_total Calls seen.\n# TYPE calls_total counter\n"
                        "calls_total{k=\"a\"} 1\ncalls_total{k=\"b\"} 2\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("# HELP depth Depth.\n# TYPE depth gauge\ndepth 3\n"), std::string::npos) << text;
}

TEST(Metrics, UndescribedFamilyIsUntypedWithoutHelp) {
    MetricsRegistry r;
    r.set("loose", {}, 1, 0, t0);
    std::string text = r.render();
    EXPECT_EQ(count_lines_starting(text, "# HELP loose"), 0u) << text;
    EXPECT_NE(text.find("# TYPE loose untyped\nloose 1\n"), std::string::npos) << text;
}

TEST(Metrics, FamiliesSortedByNameAndSeriesByLabels) {
    MetricsRegistry r;
    r.set("zeta", {}, 1, 0, t0);
    r.set("alpha", {{"k", "c"}}, 1, 0, t0);
    r.set("alpha", {{"k", "a"}, {"z", "1"}}, 1, 0, t0);
    r.set("alpha", {{"k", "b"}}, 1, 0, t0);
    r.set("alpha", {{"k", "a"}}, 1, 0, t0);
    auto e = parse(r.render());
    ASSERT_TRUE(e.errors.empty()) << e.errors.front();
    std::vector<std::pair<std::string, Labels>> got;
    for (const auto& s : e.samples) got.emplace_back(s.name, s.labels);
    std::vector<std::pair<std::string, Labels>> want = {
        {"alpha", {{"k", "a"}}},
        {"alpha", {{"k", "a"}, {"z", "1"}}},
        {"alpha", {{"k", "b"}}},
        {"alpha", {{"k", "c"}}},
        {"zeta", {}},
        {"commdbg_series_overflow_total", {}},
        {"commdbg_series_invalid_total", {}},
        {"commdbg_series_folded_total", {}},
    };
    EXPECT_EQ(got, want);
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
    MetricsRegistry r;
    r.describe("x", "a \\ b\nc \"q\"", "gauge");
    r.set("x", {{"path", "C:\\dir \"q\"\nnext"}}, 1, 0, t0);
    std::string text = r.render();
    EXPECT_NE(text.find("x{path=\"C:\\\\dir \\\"q\\\"\\nnext\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# HELP x a \\\\ b\\nc \"q\"\n"), std::string::npos) << text;
    EXPECT_EQ(escape_label_value("a\\\"\n"), "a\\\\\\\"\\n");
}

TEST(Metrics, IntegralValuesPrintAsIntegers) {
    EXPECT_EQ(format_metric_value(3.0), "3");
    EXPECT_EQ(format_metric_value(0.0), "0");
    EXPECT_EQ(format_metric_value(1e15), "1000000000000000");
    EXPECT_EQ(format_metric_value(18014398509481984.0), "18014398509481984");
    EXPECT_EQ(format_metric_value(2.5), "2.5");
    EXPECT_EQ(format_metric_value(-0.125), "-0.125");
    EXPECT_EQ(format_metric_value(std::nan("")), "NaN");
    EXPECT_EQ(format_metric_value(HUGE_VAL), "+Inf");
}

TEST(Metrics, RenderedTextParsesAndRoundTrips) {
    MetricsRegistry r;
    r.describe("commdbg_calls_total", "NCCL calls by kind.\nCumulative.", "counter");
    r.describe("commdbg_bytes", "Bytes.", "gauge");
    std::vector<Sample> in = {
        {"commdbg_calls_total", {{"pid", "7"}, {"kind", "all_reduce"}}, 13},
        {"commdbg_calls_total", {{"pid", "7"}, {"kind", "weird \"kind\"\\\n"}}, 2},
        {"commdbg_calls_total", {{"pid", "8"}, {"kind", ""}}, 1},
        {"commdbg_bytes", {{"comm", "0x1f"}}, 2.75},
        {"commdbg_bytes", {}, 123456789012},
    };
    for (const auto& s : in) r.set(s.name, s.labels, s.value, 0, t0);
    auto e = parse(r.render());
    ASSERT_TRUE(e.errors.empty()) << "unparsed: " << e.errors.front();
    for (const auto& s : in) {
        bool found = false;
        for (const auto& o : e.samples) found |= o.name == s.name && o.labels == s.labels && o.value == s.value;
        EXPECT_TRUE(found) << s.name << " value " << s.value;
    }
    EXPECT_EQ(e.samples.size(), in.size() + 3);  // + overflow, invalid and folded counters
    std::vector<std::pair<std::string, std::string>> want_help = {
        {"commdbg_bytes", "Bytes."},
        {"commdbg_calls_total", "NCCL calls by kind.\nCumulative."},
    };
    ASSERT_GE(e.help.size(), 2u);
    EXPECT_EQ(std::vector(e.help.begin(), e.help.begin() + 2), want_help);
    for (const auto& [name, type] : e.type) {
        EXPECT_EQ(type, name == "commdbg_bytes" ? "gauge" : "counter") << name;
    }
}

// ---- process identity (issue 13, finding 11) ----------------------------------

// A new process that got the pid of an exited one starts its own series: its
// lower count is not ignored, and it does not expire with the old process.
TEST(Metrics, RecycledPidStartsAFreshSeries) {
    MetricsRegistry r(100, 60s);
    r.describe("calls_total", "Calls.", "counter");
    const Labels l = {{"pid", "7"}};
    const ProcessKey old_proc{7, 1000}, new_proc{7, 5000};
    r.set("calls_total", l, 100, old_proc, t0);
    r.retire(old_proc, t0);
    r.set("calls_total", l, 3, new_proc, t0 + 10s);
    EXPECT_EQ(value_of(r, "calls_total", l), 3);
    r.set("calls_total", l, 4, new_proc, t0 + 20s);
    EXPECT_EQ(value_of(r, "calls_total", l), 4);
    // The old process's deadline passes: the new one's series stays.
    r.expire(t0 + 60s);
    EXPECT_EQ(value_of(r, "calls_total", l), 4);
    // Its own retirement still applies.
    r.retire(new_proc, t0 + 100s);
    r.expire(t0 + 160s);
    EXPECT_FALSE(value_of(r, "calls_total", l));
}

// A series created for a recycled pid does not inherit the old process's deadline.
TEST(Metrics, RecycledPidDoesNotShareTheOldDeadline) {
    MetricsRegistry r(100, 60s);
    const ProcessKey old_proc{7, 1000}, new_proc{7, 5000};
    r.retire(old_proc, t0);
    r.set("x", {{"pid", "7"}}, 1, new_proc, t0 + 5s);
    r.expire(t0 + 60s);
    EXPECT_EQ(r.series(), 1u);
}

// ---- overflow counts series, not refreshes (issue 13, finding 14) -----------

TEST(Metrics, OverflowCountsEachRefusedSeriesOnce) {
    MetricsRegistry r(1);
    r.describe("calls_total", "Calls.", "counter");
    r.set("calls_total", {{"k", "a"}}, 1, 0, t0);
    for (int refresh = 0; refresh < 1000; ++refresh) {
        r.set("calls_total", {{"k", "b"}}, refresh, 0, t0);
        r.set("calls_total", {{"k", "c"}}, refresh, 9, t0);
    }
    EXPECT_EQ(r.overflowed(), 2u);
    EXPECT_EQ(value_of(r, "commdbg_series_overflow_total", {}), 2);
}

// Once a refused series is stored, refusing it again later counts again; and
// the memory of refused series goes with their process.
TEST(Metrics, OverflowForgetsRefusedSeriesOfExpiredProcesses) {
    MetricsRegistry r(1, 60s);
    r.set("x", {{"k", "a"}}, 1, 7, t0);
    r.set("x", {{"k", "b"}}, 1, 8, t0);
    r.set("x", {{"k", "b"}}, 1, 8, t0);
    EXPECT_EQ(r.overflowed(), 1u);
    r.retire_pid(8, t0);
    r.expire(t0 + 60s);
    // pid 8 is gone and forgotten: the same labels again are a new refusal.
    r.set("x", {{"k", "b"}}, 1, 8, t0 + 61s);
    EXPECT_EQ(r.overflowed(), 2u);
    // A recycled pid is another process: its refusal counts too.
    r.set("x", {{"k", "b"}}, 1, ProcessKey{8, 77}, t0 + 62s);
    EXPECT_EQ(r.overflowed(), 3u);
    r.set("x", {{"k", "b"}}, 2, ProcessKey{8, 77}, t0 + 63s);
    EXPECT_EQ(r.overflowed(), 3u);
}

// ---- shares per uid and folding (issue 21, point 6) -------------------------

namespace {

// `n` processes of `uid`, pids from `first`, each with one calls series of
// value `calls`; retired at once when `exit`.
void run_processes(MetricsRegistry& r, uint32_t uid, uint32_t first, int n, double calls, bool exit,
                   Clock::time_point now) {
    for (uint32_t pid = first; pid < first + static_cast<uint32_t>(n); ++pid) {
        const ProcessKey p{pid, 100};
        r.assign(p, uid);
        const std::string id = std::to_string(pid);
        r.set("calls_total", {{"collective", "all_reduce"}, {"comm", "c" + id}, {"pid", id}}, calls, p, now);
        if (exit) r.retire(p, now);
    }
}

double sum_of(const MetricsRegistry& r, const std::string& name) {
    double sum = 0;
    for (const auto& s : parse(r.render()).samples) sum += s.name == name ? s.value : 0;
    return sum;
}

}  // namespace

TEST(Metrics, UidOtherThanRootHoldsAQuarterOfTheSeries) {
    MetricsRegistry r(100, 60s);
    r.describe("calls_total", "Calls.", "counter");
    run_processes(r, 1000, 1, 30, 1, false, t0);  // live: nothing of theirs may go
    EXPECT_EQ(r.series(), 25u);
    EXPECT_EQ(r.overflowed(), 5u);
    EXPECT_EQ(r.live_series_of(1000), 25u);
    run_processes(r, 0, 1000, 75, 1, false, t0);
    EXPECT_EQ(r.series(), 100u);
    EXPECT_EQ(r.overflowed(), 5u);
}

TEST(Metrics, OtherUidsTogetherLeaveRootAQuarter) {
    MetricsRegistry r(100, 60s);
    for (uint32_t uid = 1001; uid <= 1004; ++uid) run_processes(r, uid, uid * 100, 25, 1, false, t0);
    EXPECT_EQ(r.series(), 75u);
    EXPECT_EQ(r.overflowed(), 25u);
    run_processes(r, 0, 1, 25, 1, false, t0);
    EXPECT_EQ(r.series(), 100u);
    EXPECT_EQ(r.live_series_of(0), 25u);
}

// A uid's short processes, far past its share: their series are folded into
// the uid's total as they must make room, the total keeps every call, and a
// process still running keeps its own series.
TEST(Metrics, ExitedSeriesOfAUidFoldIntoItsTotalWhenItsShareIsFull) {
    MetricsRegistry r(100, 600s);
    r.describe("calls_total", "Calls.", "counter");
    r.set_fold_keep({"collective"});
    run_processes(r, 1000, 1, 1, 7, false, t0);  // pid 1 runs on
    double made = 7;
    for (uint32_t pid = 2; pid < 200; ++pid) {
        run_processes(r, 1000, pid, 1, pid, true, t0 + std::chrono::seconds(pid));
        made += pid;
        ASSERT_LE(r.series(), 25u);
    }
    EXPECT_EQ(r.overflowed(), 0u);
    EXPECT_GT(r.folded(), 150u);
    EXPECT_EQ(sum_of(r, "calls_total"), made);
    EXPECT_EQ(value_of(r, "calls_total", {{"collective", "all_reduce"}, {"comm", "c1"}, {"pid", "1"}}), 7);
    const Labels total = {{"collective", "all_reduce"}, {"comm", ""}, {"pid", "exited"}, {"uid", "1000"}};
    ASSERT_TRUE(value_of(r, "calls_total", total));
    // The oldest exited went first: the newest are still there by pid.
    EXPECT_TRUE(value_of(r, "calls_total", {{"collective", "all_reduce"}, {"comm", "c199"}, {"pid", "199"}}));
    EXPECT_FALSE(value_of(r, "calls_total", {{"collective", "all_reduce"}, {"comm", "c2"}, {"pid", "2"}}));
    EXPECT_EQ(value_of(r, "commdbg_series_folded_total", {}), static_cast<double>(r.folded()));
}

// Another uid's storm takes nothing of root's: root's exited series stay
// by pid while it folds its own.
TEST(Metrics, StormOfOneUidFoldsOnlyItsOwnExitedSeries) {
    MetricsRegistry r(100, 600s);
    r.describe("calls_total", "Calls.", "counter");
    run_processes(r, 0, 1, 10, 5, true, t0);
    run_processes(r, 2000, 100, 500, 1, true, t0 + 1s);
    EXPECT_EQ(r.overflowed(), 0u);
    for (int pid = 1; pid <= 10; ++pid)
        EXPECT_EQ(value_of(r, "calls_total", {{"collective", "all_reduce"}, {"comm", "c" + std::to_string(pid)},
                                              {"pid", std::to_string(pid)}}),
                  5);
    EXPECT_EQ(sum_of(r, "calls_total"), 10 * 5 + 500);
    // A root job later still finds room at the cap: exited series fold then,
    // the oldest first (root's own here).
    run_processes(r, 0, 1000, 90, 1, false, t0 + 2s);
    EXPECT_EQ(r.overflowed(), 0u);
    EXPECT_EQ(r.live_series_of(0), 91u);  // its 90 and its exited total
    EXPECT_EQ(sum_of(r, "calls_total"), 10 * 5 + 500 + 90);
}

// A folded process is in its uid's total: a late sample of it is not stored
// again (counted twice), and the total goes ttl after its last fold.
TEST(Metrics, FoldedProcessIsCountedOnceAndItsTotalExpires) {
    MetricsRegistry r(16, 60s);  // a share of 4
    r.describe("calls_total", "Calls.", "counter");
    run_processes(r, 1000, 1, 4, 10, true, t0);
    run_processes(r, 1000, 5, 2, 10, false, t0 + 1s);  // pids 1, 2, 3 fold
    EXPECT_EQ(r.folded(), 3u);
    run_processes(r, 1000, 1, 1, 11, false, t0 + 2s);
    EXPECT_EQ(sum_of(r, "calls_total"), 60);
    r.expire(t0 + 60s);  // pid 4's ttl, not the total's
    const Labels total = {{"collective", ""}, {"comm", ""}, {"pid", "exited"}, {"uid", "1000"}};
    EXPECT_EQ(value_of(r, "calls_total", total), 30);
    r.expire(t0 + 61s);
    EXPECT_FALSE(value_of(r, "calls_total", total));
    EXPECT_EQ(r.series(), 2u);  // pids 5 and 6 run on
}
