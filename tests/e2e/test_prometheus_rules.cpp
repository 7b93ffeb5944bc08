// SPDX-License-Identifier: Apache-2.0
// deploy/prometheus/commdbg.rules.yml against promtool, on series shaped
// exactly as a running commdbgd exports them: 3 stub-NCCL ranks of one
// communicator, rank 2 one all-reduce short, scraped from /metrics; their
// series become promtool's input, held still (a hang) or moving (healthy).
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

TEST(PrometheusRules, CheckAndUnitTestsOnADaemonsSeriesFindTheRankBehind) {
    REQUIRE_BPF();
    auto check = run({"promtool", "check", "rules", kRules});
    ASSERT_EQ(check.status, 0) << check.out << check.err;

    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    const int kCalls = 6;
    const std::vector<int> per_rank = {kCalls, kCalls, kCalls - 1};
    CommRanks ranks = start_comm_ranks(per_rank);
    const std::vector<int>& pids = ranks.pids;
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, per_rank));
    // The daemon's own series of these ranks, as Prometheus would store them.
    const std::map<std::string, std::string> scraped = {{"job", "commdbg"}, {"instance", "node01:9464"}};
    std::vector<Sample> calls;
    Sample dropped;
    for (const Sample& s : scrape(d.port())) {
        if (s.name == "commdbg_collective_calls_total" &&
            std::find(pids.begin(), pids.end(), std::stoi(s.labels.at("pid"))) != pids.end())
            calls.push_back(s);
        if (s.name == "commdbg_events_dropped_total" && dropped.name.empty()) dropped = s;
    }
    ASSERT_EQ(calls.size(), 3u) << "one all_reduce series per rank";
    ASSERT_FALSE(dropped.name.empty()) << "no commdbg_events_dropped_total series";
    const Sample* behind = nullptr;
    for (const Sample& s : calls)
        if (s.labels.at("rank") == "2") behind = &s;
    ASSERT_NE(behind, nullptr);
    ASSERT_EQ(behind->value, kCalls - 1);

    // promtool's unit tests: the same series held still (every rank stopped,
    // rank 2 one behind), then moving together (healthy), then all still at
    // the same number (a hang below the host: nothing to name).
    std::ostringstream y;
    y << "rule_files:\n  - " << kRules << "\nevaluation_interval: 15s\ntests:\n";
    auto input = [&](const std::function<std::string(const Sample&)>& values) {
        y << "  - interval: 15s\n    input_series:\n";
        for (const Sample& s : calls)
            y << "      - series: '" << series_text(s, scraped) << "'\n        values: '" << values(s) << "'\n";
    };
    const std::string comm = behind->labels.at("comm");
    input([](const Sample& s) { return std::to_string(static_cast<long>(s.value)) + "+0x20"; });
    y << "    alert_rule_test:\n      - eval_time: 3m\n        alertname: CommdbgRankBehind\n        exp_alerts:\n"
      << "          - exp_labels:\n              severity: critical\n              comm: '" << comm
      << "'\n              rank: '2'\n              nranks: '" << behind->labels.at("nranks") << "'\n              host: '"
      << behind->labels.at("host") << "'\n              pid: '" << behind->labels.at("pid") << "'\n"
      << "            exp_annotations:\n              summary: 'rank 2 of communicator " << comm
      << " stopped 1 collectives behind the others'\n              description: 'pid " << behind->labels.at("pid")
      << " on " << behind->labels.at("host") << " never issued the collective the other ranks of " << comm
      << " wait in; run `commdbg hang " << behind->labels.at("pid") << "` there (docs/hang.md)'\n"
      << "      - eval_time: 40s\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    input([](const Sample& s) { return std::to_string(static_cast<long>(s.value)) + "+1x20"; });
    y << "    alert_rule_test:\n      - eval_time: 4m\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    input([](const Sample&) { return "6+0x20"; });
    y << "    alert_rule_test:\n      - eval_time: 4m\n        alertname: CommdbgRankBehind\n        exp_alerts: []\n";
    // A loss the daemon counts fires its alert; the recording rules sum per communicator and rank.
    y << "  - interval: 15s\n    input_series:\n      - series: '" << series_text(dropped, scraped)
      << "'\n        values: '0+0x4 3+0x15'\n";
    for (const Sample& s : calls)
        y << "      - series: '" << series_text(s, scraped) << "'\n        values: '"
          << static_cast<long>(s.value) << "+0x20'\n";
    y << "    alert_rule_test:\n      - eval_time: 2m\n        alertname: CommdbgEventsDropped\n        exp_alerts:\n"
      << "          - exp_labels:\n              severity: warning\n              instance: node01:9464\n"
      << "              cause: '" << dropped.labels.at("cause") << "'\n            exp_annotations:\n"
      << "              summary: 'commdbgd on node01:9464 lost events (" << dropped.labels.at("cause") << ")'\n"
      << "              description: 'counts may be short; see docs/safety.md for the bound that was hit'\n"
      << "    promql_expr_test:\n      - expr: commdbg:comm_rank_lag\n        eval_time: 1m\n        exp_samples:\n";
    for (const Sample& s : calls)
        y << "          - labels: 'commdbg:comm_rank_lag{comm=\"" << comm << "\",host=\"" << s.labels.at("host")
          << "\",nranks=\"" << s.labels.at("nranks") << "\",pid=\"" << s.labels.at("pid") << "\",rank=\""
          << s.labels.at("rank") << "\"}'\n            value: " << (s.labels.at("rank") == "2" ? 1 : 0) << "\n";
    const std::string test_file = tmp.path("rules_test.yml");
    std::ofstream(test_file) << y.str();
    auto t = run({"promtool", "test", "rules", test_file});
    EXPECT_EQ(t.status, 0) << t.out << t.err << "\n" << y.str();
}

}  // namespace
}  // namespace commdbg::e2e
