// SPDX-License-Identifier: Apache-2.0
// Acceptance: the --trace file of a real traced run opens in Perfetto (its own
// trace processor, the engine of the Perfetto UI) and Perfetto shows what
// commdbg recorded: one slice per retained record on the thread that made the
// call, with the collective's args, under the process's name.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "e2e_util.hpp"
#include "perfetto_check.hpp"

namespace commdbg::e2e {
namespace {

size_t count_records(const nlohmann::json& records) {
    size_t n = 0;
    for (const auto& r : records) n += 1 + (r.contains("children") ? count_records(r["children"]) : 0);
    return n;
}

class TraceInPerfetto : public ::testing::TestWithParam<bool> {};

TEST_P(TraceInPerfetto, RunTraceShowsEveryRecordOnItsThreadWithItsArgs) {
    REQUIRE_BPF();
    REQUIRE_PERFETTO();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    TempDir tmp;
    const std::vector<std::pair<std::string, int>> pattern = {
        {"all_reduce", 40}, {"all_gather", 20}, {"reduce_scatter", 10}, {"broadcast", 6}};
    std::vector<std::string> argv = {commdbg_bin(), "run", "--trace", tmp.path("out.trace.json"), "--json",
                                     tmp.path("out.json"), "--table", tmp.path("out.txt"), "--",
                                     testprog("nccl_workload"), "--calls", pattern_arg(pattern), "--threads", "3"};
    // Real NCCL gets a NULL comm and rejects each call at once: still a call.
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv, nccl_env(real));
    ASSERT_EQ(r.status, 0) << r.err;
    auto dump = read_json(tmp.path("out.json"));
    auto trace = read_json(tmp.path("out.trace.json"));

    auto loaded = perfetto_check::load_in_perfetto(tmp.path("out.trace.json"));
    auto diffs = perfetto_check::compare_with_file(loaded, trace);
    EXPECT_TRUE(diffs.empty()) << "Perfetto " << loaded.perfetto_version << ":\n" << perfetto_check::lines(diffs);

    // One slice per record the dump retained, per collective kind as counted.
    EXPECT_EQ(loaded.slices.size(), count_records(dump["records"]));
    std::map<std::string, int> per_kind;
    std::set<uint64_t> tids;
    const int pid = dump["process"]["pid"].get<int>();
    for (const auto& s : loaded.slices) {
        EXPECT_EQ(s.pid, static_cast<uint64_t>(pid)) << s.name;
        if (!s.collective.empty()) ++per_kind["nccl." + s.collective];
        tids.insert(s.tid);
    }
    for (const auto& [kind, n] : pattern) {
        EXPECT_EQ(per_kind["nccl." + kind], n) << kind;
        EXPECT_EQ(dump["comm_counts"]["nccl." + kind].get<int>(), n) << kind;
    }
    // The three calling threads have tracks of their own.
    std::set<uint64_t> dump_tids;
    for (const auto& t : dump["threads"]) dump_tids.insert(t.get<uint64_t>());
    for (uint64_t t : tids) EXPECT_TRUE(dump_tids.count(t)) << "tid " << t;
    EXPECT_GE(tids.size(), 3u);
    // Each worker thread's track carries the name it gave itself.
    std::set<std::string> worker_names;
    for (const auto& [tid, name] : loaded.thread_names)
        if (tids.count(tid)) worker_names.insert(name);
    EXPECT_EQ(worker_names, (std::set<std::string>{"nccl-worker-0", "nccl-worker-1", "nccl-worker-2"}));
    ASSERT_TRUE(dump.contains("thread_names")) << "the dump names the threads too";
    for (const auto& [tid, name] : loaded.thread_names) {
        if (tids.count(tid)) {
            EXPECT_EQ(dump["thread_names"].value(std::to_string(tid), ""), name);
        }
    }
    // The process track is named after the command and pid.
    ASSERT_TRUE(loaded.process_names.count(pid));
    EXPECT_NE(loaded.process_names[pid].find("nccl_workload"), std::string::npos) << loaded.process_names[pid];
    EXPECT_NE(loaded.process_names[pid].find("(" + std::to_string(pid) + ")"), std::string::npos);
}

// The whole Perfetto UI (the same packaged v20.1 build: its frontend, its
// engine) in headless Chromium opens the trace of a real run: no error dialog,
// no import errors, one slice per record, a track per thread, the process's
// track group named, slices drawn.  The screenshot is kept in the build
// folder for a person to look at.
TEST(TraceInPerfettoUi, HeadlessChromiumOpensARunTraceAndDrawsItsSlices) {
    REQUIRE_BPF();
    REQUIRE_PERFETTO();
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--trace", tmp.path("out.trace.json"), "--json", tmp.path("out.json"),
                  "--table", tmp.path("out.txt"), "--", testprog("nccl_workload"), "--calls",
                  "all_reduce=30,all_gather=10,broadcast=4", "--threads", "3", "--fake-comm"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    auto dump = read_json(tmp.path("out.json"));
    const std::string shot = std::string(BUILD_DIR) + "/perfetto-ui-check.png";
    auto ui = run({NODE_BIN, std::string(SOURCE_DIR) + "/tests/perfetto/ui_check/perfetto_ui_check.js", "--ui",
                   PERFETTO_UI_DIR, "--trace", tmp.path("out.trace.json"), "--screenshot", shot, "--expect-name",
                   "(" + dump["process"]["pid"].dump() + ")"},
                  {}, 120);
    if (ui.status == 77) {  // no Chromium
        if (in_ci()) FAIL() << "CI=true but " << ui.err;
        GTEST_SKIP() << ui.err;
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(ui.out.substr(0, ui.out.find('\n')));
    } catch (const std::exception&) {
        FAIL() << "perfetto_ui_check.js exited " << ui.status << " without a result:\n" << ui.out << ui.err;
    }
    EXPECT_EQ(ui.status, 0) << j.dump(1) << ui.err;
    EXPECT_TRUE(j["ok"].get<bool>()) << j["failures"].dump(1);
    EXPECT_EQ(j["slice_count"].get<size_t>(), count_records(dump["records"]));
    EXPECT_EQ(j["slice_tracks"].get<size_t>(), dump["threads"].size()) << "a track per calling thread";
    EXPECT_TRUE(j["error_dialog"].is_null()) << j["error_dialog"];
    EXPECT_TRUE(j["import_errors"].empty()) << j["import_errors"];
    EXPECT_GT(j["canvas_colored_px"].get<long>(), 0) << "nothing drawn";
    EXPECT_TRUE(std::filesystem::exists(shot));
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, TraceInPerfetto, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

}  // namespace
}  // namespace commdbg::e2e
