// SPDX-License-Identifier: Apache-2.0
// deploy/prometheus/commdbg.rules.yml against promtool, on series shaped
// exactly as a running commdbgd exports them: 3 stub-NCCL ranks of one
// communicator, rank 2 one all-reduce short and its last one another count,
// scraped from /metrics; their series become promtool's input, held still
// (a hang) or moving (healthy).
#include "daemon_util.hpp"

#include <fstream>
#include <regex>

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

const std::string kRules = std::string(SOURCE_DIR) + "/deploy/prometheus/commdbg.rules.yml";

std::string series_text(const Sample& s, const std::map<std::string, std::string>& extra = {}) {
    std::map<std::string, std::string> labels = s.labels;
    labels.insert(extra.begin(), extra.end());
    std::string out = s.name + "{";
    bool first = true;
    for (const auto& [k, v] : labels) {
        std::string esc;
        for (char c : v) esc += c == '"' ? std::string("\\\"") : c == '\'' ? std::string("''") : std::string(1, c);
        out += (first ? "" : ",") + k + "=\"" + esc + "\"";
        first = false;
    }
    return out + "}";
}

// One series per rank of `name` among `samples`, by rank.
std::map<std::string, Sample> per_rank(const std::vector<Sample>& samples, const std::string& name,
                                       const std::string& comm) {
    std::map<std::string, Sample> out;
    for (const Sample& s : samples)
        if (s.name == name && s.labels.count("comm") && s.labels.at("comm") == comm) out[s.labels.at("rank")] = s;
    return out;
}

TEST(PrometheusRules, CheckAndUnitTestsOnADaemonsSeriesFindTheRankBehind) {
    REQUIRE_BPF();
    auto check = run({"promtool", "check", "rules", kRules});
    ASSERT_EQ(check.status, 0) << check.out << check.err;

    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    // Rank 2 one all-reduce short, and its last one with another count: a
    // mismatch at #5 as well.
    const int kCalls = 6;
    const std::vector<int> per_rank_calls = {kCalls, kCalls, kCalls - 1};
    CommRanks ranks = start_comm_ranks(per_rank_calls, {{}, {}, {"--last-count", "512"}});
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, per_rank_calls));
    // The daemon's own series of these ranks, as Prometheus would store them.
    const std::map<std::string, std::string> scraped = {{"job", "commdbg"}, {"instance", "node01:9464"}};
    std::vector<Sample> samples;
    Sample dropped, mismatch;
    for (int tries = 0; tries < 50 && mismatch.value == 0; ++tries, sleep_ms(100)) {
        samples = scrape(d.port());
        for (const Sample& s : samples) {
            if (s.name == "commdbg_events_dropped_total" && dropped.name.empty()) dropped = s;
            if (s.name == "commdbg_collective_mismatch_total") mismatch = s;
        }
    }
    ASSERT_FALSE(dropped.name.empty()) << "no commdbg_events_dropped_total series";
    ASSERT_EQ(mismatch.value, 1) << "no commdbg_collective_mismatch_total series at 1";
    const std::string comm = mismatch.labels.at("comm");
    const auto seq = per_rank(samples, "commdbg_comm_rank_seq", comm);
    const auto idle = per_rank(samples, "commdbg_comm_rank_idle_seconds", comm);
    ASSERT_EQ(seq.size(), 3u) << "one commdbg_comm_rank_seq series per rank";
    ASSERT_EQ(idle.size(), 3u) << "one commdbg_comm_rank_idle_seconds series per rank";
    const Sample& behind = seq.at("2");
    ASSERT_EQ(behind.value, kCalls - 1);

    // promtool's unit tests: the ranks' series held still (every rank
    // stopped, rank 2 one behind), then moving together (healthy), then all
    // still at the same number (a hang below the host: nothing to name).
    std::ostringstream y;
    y << "rule_files:\n  - " << kRules << "\nevaluation_interval: 15s\ntests:\n";
    auto input = [&](const std::function<std::string(const Sample&)>& seq_values, const std::string& idle_values) {
        y << "  - interval: 15s\n    input_series:\n";
        for (const auto& [rank, s] : seq)
            y << "      - series: '" << series_text(s, scraped) << "'\n        values: '" << seq_values(s) << "'\n";
        for (const auto& [rank, s] : idle)
            y << "      - series: '" << series_text(s, scraped) << "'\n        values: '" << idle_values << "'\n";
    };
    auto value = [](const Sample& s) { return std::to_string(static_cast<long>(s.value)); };
    input([&](const Sample& s) { return value(s) + "+0x20"; }, "1+15x20");
    y << "    alert_rule_test:\n      - eval_time: 1m\n        alertname: CommdbgRankBehind\n        exp_alerts:\n"
      << "          - exp_labels:\n              severity: critical\n              comm: '" << comm
      << "'\n              rank: '2'\n              nranks: '" << behind.labels.at("nranks") << "'\n              host: '"
      << behind.labels.at("host") << "'\n              pid: '" << behind.labels.at("pid") << "'\n"
      << "            exp_annotations:\n              summary: 'rank 2 of communicator " << comm
      << " stopped 1 collectives behind the others'\n              description: 'pid " << behind.labels.at("pid")
      << " on " << behind.labels.at("host") << " never issued the collective the other ranks of " << comm
      << " wait in; run `commdbg hang " << behind.labels.at("pid") << "` there (docs/hang.md)'\n"
      << "      - eval_time: 30s\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    input([&](const Sample& s) { return value(s) + "+1x20"; }, "0+0x20");
    y << "    alert_rule_test:\n      - eval_time: 4m\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    input([](const Sample&) { return "6+0x20"; }, "1+15x20");
    y << "    alert_rule_test:\n      - eval_time: 4m\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    // A loss and a mismatch the daemon counts fire their alerts; the
    // recording rules give each rank's lag.
    y << "  - interval: 15s\n    input_series:\n      - series: '" << series_text(dropped, scraped)
      << "'\n        values: '0+0x4 3+0x15'\n      - series: '" << series_text(mismatch, scraped)
      << "'\n        values: '0+0x4 1+0x15'\n";
    for (const auto& [rank, s] : seq)
        y << "      - series: '" << series_text(s, scraped) << "'\n        values: '" << value(s) << "+0x20'\n";
    y << "    alert_rule_test:\n      - eval_time: 2m\n        alertname: CommdbgEventsDropped\n        exp_alerts:\n"
      << "          - exp_labels:\n              severity: warning\n              instance: node01:9464\n"
      << "              cause: '" << dropped.labels.at("cause") << "'\n            exp_annotations:\n"
      << "              summary: 'commdbgd on node01:9464 lost events (" << dropped.labels.at("cause") << ")'\n"
      << "              description: 'counts may be short; see docs/safety.md for the bound that was hit'\n"
      << "      - eval_time: 2m\n        alertname: CommdbgCollectiveMismatch\n        exp_alerts:\n"
      << "          - exp_labels:\n              severity: critical\n              comm: '" << comm
      << "'\n              host: '" << mismatch.labels.at("host") << "'\n            exp_annotations:\n"
      << "              summary: 'ranks of communicator " << comm << " on " << mismatch.labels.at("host")
      << " issued different collectives at one sequence number'\n              description: '`commdbg status` on "
      << mismatch.labels.at("host") << " names the first differing number and both signatures; run `commdbg hang` "
      << "on the ranks (docs/hang.md)'\n      - eval_time: 45s\n        alertname: CommdbgCollectiveMismatch\n"
      << "        exp_alerts: []\n"
      << "    promql_expr_test:\n      - expr: commdbg:comm_rank_lag\n        eval_time: 1m\n        exp_samples:\n";
    for (const auto& [rank, s] : seq)
        y << "          - labels: 'commdbg:comm_rank_lag{comm=\"" << comm << "\",host=\"" << s.labels.at("host")
          << "\",nranks=\"" << s.labels.at("nranks") << "\",pid=\"" << s.labels.at("pid") << "\",rank=\"" << rank
          << "\"}'\n            value: " << (rank == "2" ? 1 : 0) << "\n";
    const std::string test_file = tmp.path("rules_test.yml");
    std::ofstream(test_file) << y.str();
    auto t = run({"promtool", "test", "rules", test_file});
    EXPECT_EQ(t.status, 0) << t.out << t.err << "\n" << y.str();
}

}  // namespace
}  // namespace commdbg::e2e
