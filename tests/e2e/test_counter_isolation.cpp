// SPDX-License-Identifier: Apache-2.0
// The kernel's counter map is one per node: no process, of any user, may take
// another process's exact counts by filling it (issue 13, finding 2).  A
// process past its share of fine keys, or one that finds the map full, keeps
// exact per-kind counts in storage of its own and says how many calls lost
// their (communicator, datatype) breakdown.
#include <gtest/gtest.h>

#include "daemon_util.hpp"
#include "e2e_util.hpp"
#include "limits.hpp"

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

constexpr long kNodeCounterKeys = 65536;  // max_entries of the kernel's `counters` map

// A counter_flood run as uid 65534, its children still alive (waiting for
// `go`); from copies it can read where the build tree is closed to it.
struct Flood {
    NobodyBins bins;
    std::unique_ptr<Background> proc;
    std::vector<int> children;
};

Flood start_flood(const SharedDir& dir, int procs, long keys) {
    Flood f;
    f.bins = nobody_bins();
    f.proc = std::make_unique<Background>(concat(kAsNobody, {f.bins.flood, "--procs", std::to_string(procs), "--keys",
                                                             std::to_string(keys), "--wait-file", dir.path("go")}),
                                          nobody_env(f.bins));
    std::string line = f.proc->wait_for_line("ready children=", 120);
    EXPECT_FALSE(line.empty()) << "counter_flood never finished its calls";
    for (const auto& [pid, state] : children_of(f.proc->pid())) f.children.push_back(pid);
    EXPECT_EQ(f.children.size(), static_cast<size_t>(procs));
    return f;
}

long number(const json& proc, const std::string& key) {
    return proc.is_object() && proc.contains(key) ? proc[key].get<long>() : -1;
}

// commdbg_counter_breakdown_lost_total of one pid, or -1 when it has no series.
long lost_metric(const std::vector<Sample>& samples, int pid) {
    for (const auto& s : samples)
        if (s.name == "commdbg_counter_breakdown_lost_total" && s.labels.count("pid") &&
            s.labels.at("pid") == std::to_string(pid))
            return static_cast<long>(s.value);
    return -1;
}

// Polls `commdbg counts --json` until every pid of `pids` shows `calls`
// all_reduce calls; the last reply.
json counts_settled(const Daemon& d, const std::vector<int>& pids, long calls, bool as_nobody) {
    json j;
    for (int i = 0; i < 100; ++i) {
        j = cli_json({"counts", "--socket", d.socket()}, as_nobody);
        bool all = true;
        for (int pid : pids) all = all && comm_counts_of(process_entry(j, pid))["nccl.all_reduce"] == calls;
        if (all) break;
        sleep_ms(100);
    }
    return j;
}

}  // namespace

// Many processes of uid 65534 fill the node's counter map; a root workload
// that starts afterwards still gets exact counts per kind in `commdbg counts`
// and /metrics, and every flooder keeps its own exact count and reports the
// breakdown it lost, per process, to root and to itself.
TEST(CounterIsolation, FloodByAnotherUserLeavesEveryProcessCountsExact) {
    REQUIRE_BPF();
    SharedDir dir;
    START_DAEMON(d, dir);
    constexpr int kProcs = 12;
    constexpr long kKeys = 7000;  // each under its share, together past the map
    static_assert(kKeys <= static_cast<long>(limits::kDefaultCounterKeysPerProcess));
    static_assert(kProcs * kKeys > kNodeCounterKeys);
    Flood flood = start_flood(dir, kProcs, kKeys);
    ASSERT_EQ(flood.children.size(), static_cast<size_t>(kProcs));

    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    const auto want = expected_map(kPattern, "nccl.");
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), want), want) << "commdbg counts --pid " << w.pid();
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kPattern)), expected_map(kPattern));
    // The map is full: every root call lost its breakdown, and says so.
    auto root = process_entry(cli_json({"counts", "--socket", d.socket(), "--pid", std::to_string(w.pid())}), w.pid());
    EXPECT_EQ(number(root, "counter_breakdown_lost"), total_of(kPattern)) << root.dump();
    auto samples = scrape(d.port());
    EXPECT_EQ(lost_metric(samples, w.pid()), total_of(kPattern));

    for (bool as_nobody : {false, true}) {
        SCOPED_TRACE(as_nobody ? "commdbg counts as uid 65534" : "commdbg counts as root");
        json all = counts_settled(d, flood.children, kKeys, as_nobody);
        long lost = 0;
        for (int pid : flood.children) {
            auto p = process_entry(all, pid);
            EXPECT_EQ(comm_counts_of(p)["nccl.all_reduce"], kKeys) << "flooder " << pid << ": " << p.dump();
            long l = number(p, "counter_breakdown_lost");
            EXPECT_GE(l, 0) << "flooder " << pid << " reports no counter_breakdown_lost: " << p.dump();
            lost += l;
        }
        EXPECT_GE(lost, kProcs * kKeys - kNodeCounterKeys);
    }
    samples = scrape(d.port());
    long lost_series = 0;
    for (int pid : flood.children) lost_series += std::max(0L, lost_metric(samples, pid));
    EXPECT_GE(lost_series, kProcs * kKeys - kNodeCounterKeys);

    EXPECT_EQ(w.finish().status, 0);
    touch(dir.path("go"));
    EXPECT_EQ(flood.proc->wait(60).status, 0);
}

// One process of uid 65534 asks for more keys than the node's map holds; it
// gets its share of fine keys and no more, so a root workload's counts keep
// their breakdown, and the flooder's own count stays exact.
TEST(CounterIsolation, OneProcessCannotTakeMoreThanItsShareOfCounterKeys) {
    REQUIRE_BPF();
    SharedDir dir;
    START_DAEMON(d, dir);
    constexpr long kKeys = 70000;
    static_assert(kKeys > kNodeCounterKeys);
    Flood flood = start_flood(dir, 1, kKeys);
    ASSERT_EQ(flood.children.size(), 1u);
    const int flooder = flood.children[0];

    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    const auto want = expected_map(kPattern, "nccl.");
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), want), want) << "commdbg counts --pid " << w.pid();
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kPattern)), expected_map(kPattern));
    auto root = process_entry(cli_json({"counts", "--socket", d.socket(), "--pid", std::to_string(w.pid())}), w.pid());
    EXPECT_EQ(number(root, "counter_breakdown_lost"), 0) << root.dump();
    // Its series keep their datatype.
    for (const auto& s : scrape(d.port())) {
        if (s.name == "commdbg_collective_calls_total" && s.labels.count("pid") &&
            s.labels.at("pid") == std::to_string(w.pid())) {
            EXPECT_EQ(s.labels.at("dtype"), "float32") << s.labels.at("collective");
        }
    }

    json all = counts_settled(d, {flooder}, kKeys, true);
    auto p = process_entry(all, flooder);
    EXPECT_EQ(comm_counts_of(p)["nccl.all_reduce"], kKeys) << p.dump();
    EXPECT_EQ(number(p, "counter_breakdown_lost"), kKeys - static_cast<long>(limits::kDefaultCounterKeysPerProcess))
        << p.dump();
    EXPECT_EQ(lost_metric(scrape(d.port()), flooder),
              kKeys - static_cast<long>(limits::kDefaultCounterKeysPerProcess));

    EXPECT_EQ(w.finish().status, 0);
    touch(dir.path("go"));
    EXPECT_EQ(flood.proc->wait(60).status, 0);
}

// Processes of uid 65534, each within its share of kernel keys and of label
// sets, together would fill --max-series; a root workload that starts
// afterwards still has its series, exact per kind.
TEST(CounterIsolation, ManyProcessesOfAnotherUserCannotFillMaxSeries) {
    REQUIRE_BPF();
    SharedDir dir;
    constexpr int kMaxSeries = 3000;
    START_DAEMON(d, dir, {"--max-series", std::to_string(kMaxSeries)});
    constexpr int kProcs = 6;
    constexpr long kKeys = 1000;  // 1000 label sets each: 3 series per set
    static_assert(kProcs * kKeys * 3 > kMaxSeries);
    Flood flood = start_flood(dir, kProcs, kKeys);
    ASSERT_EQ(flood.children.size(), static_cast<size_t>(kProcs));
    // Until the daemon has exported what the flooders asked for.
    counts_settled(d, flood.children, kKeys, false);
    sleep_ms(1200);

    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kPattern)), expected_map(kPattern));
    auto samples = scrape(d.port());
    for (int pid : flood.children)
        EXPECT_EQ(sum_by_collective(samples, "commdbg_collective_calls_total", pid)["all_reduce"], kKeys)
            << "flooder " << pid;
    EXPECT_EQ(w.finish().status, 0);
    touch(dir.path("go"));
    EXPECT_EQ(flood.proc->wait(60).status, 0);
}

// A storm of short processes of uid 65534 (issue 21, point 6): each calls
// NCCL and exits, together far past --max-series.  uid 65534 holds at most a
// quarter of the series, its exited processes' series are folded into its
// totals (pid="exited") as that share fills, and exits are handled in
// batches: a root job started after the storm is counted and exported
// within seconds, exactly, and `commdbg counts --pid` answers for it.
TEST(CounterIsolation, StormOfShortProcessesOfAnotherUserLeavesRootJobCountedAndExported) {
    REQUIRE_BPF();
    SharedDir dir;
    // Room for root's jobs of other tests on this node too (the daemon counts them all).
    constexpr int kMaxSeries = 400;
    constexpr int kBatches = 3, kChildren = 150;  // 3 series each (calls, bytes, errors)
    static_assert(kChildren * 3 > kMaxSeries / 4);
    static_assert(kBatches * kChildren * 3 > kMaxSeries);
    START_DAEMON(d, dir, {"--max-series", std::to_string(kMaxSeries)});
    NobodyBins bins = nobody_bins();
    // In batches a refresh apart, so a batch meets the one before it exited.
    for (int i = 0; i < kBatches; ++i) {
        auto storm = run(nobody_workload(bins, {"--calls", "all_reduce=3", "--fork", std::to_string(kChildren)}),
                         nobody_env(bins), 120);
        ASSERT_EQ(storm.status, 0) << storm.err;
        sleep_ms(700);
    }
    // The storm pressed on the cap: series refused, or folded to make room.
    auto metric = [&](const std::vector<Sample>& samples, const std::string& name) {
        for (const auto& s : samples)
            if (s.name == name) return static_cast<long>(s.value);
        return 0L;
    };
    auto samples = scrape(d.port());
    for (int i = 0; i < 50 && metric(samples, "commdbg_series_overflow_total") +
                                      metric(samples, "commdbg_series_folded_total") == 0; ++i) {
        sleep_ms(100);
        samples = scrape(d.port());
    }
    ASSERT_GT(metric(samples, "commdbg_series_overflow_total") + metric(samples, "commdbg_series_folded_total"), 0);

    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    const auto want = expected_map(kPattern, "nccl.");
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), want, false, 10000), want) << "commdbg counts --pid " << w.pid();
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kPattern), 10000), expected_map(kPattern));
    // What uid 65534's exited children counted is kept in its totals: whole
    // children (3 calls each), never more than they made.
    long exited = 0;
    for (const auto& s : scrape(d.port()))
        if (s.name == "commdbg_collective_calls_total" && s.labels.count("uid") && s.labels.at("uid") == "65534" &&
            s.labels.at("pid") == "exited" && s.labels.at("collective") == "all_reduce")
            exited += static_cast<long>(s.value);
    EXPECT_GT(exited, 0);
    EXPECT_LE(exited, 3L * kChildren);
    EXPECT_EQ(exited % 3, 0);
    EXPECT_EQ(w.finish().status, 0);
}

// The same in a session (`commdbg run`, no daemon): a process that asks for
// more keys than the node's map holds keeps exact comm_counts and counters,
// errors included, and the JSON dump says how many calls lost their breakdown.
TEST(CounterIsolation, SessionCountsStayExactPastTheCounterKeys) {
    REQUIRE_BPF();
    TempDir tmp;
    constexpr long kKeys = 70000, kFailing = 1000;  // the last ones, far past its share
    auto r = run({commdbg_bin(), "run", "--counts-only", "--json", tmp.path("out.json"), "--",
                  testprog("counter_flood"), "--procs", "1", "--keys", std::to_string(kKeys), "--null-comm-from",
                  std::to_string(kKeys - kFailing)},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    json flooder;
    for (const auto& p : j.contains("processes") ? j["processes"] : json::array({j}))
        if (p.value("comm_counts", json::object()).contains("nccl.all_reduce")) flooder = p;
    ASSERT_TRUE(flooder.is_object()) << j.dump().substr(0, 2000);
    EXPECT_EQ(flooder["comm_counts"]["nccl.all_reduce"].get<long>(), kKeys);
    EXPECT_EQ(flooder.value("counter_breakdown_lost", -1L),
              kKeys - static_cast<long>(limits::kDefaultCounterKeysPerProcess));
    long rows = 0, errors = 0;
    for (const auto& c : flooder["counters"])
        if (c.value("collective", "") == "all_reduce") rows += c["calls"].get<long>(), errors += c["errors"].get<long>();
    EXPECT_EQ(rows, kKeys);
    EXPECT_EQ(errors, kFailing);
}

}  // namespace commdbg::e2e
