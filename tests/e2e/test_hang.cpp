// SPDX-License-Identifier: Apache-2.0
// commdbg hang on real jobs that are already stuck (tests/testprogs/hang_job.py):
// 3 gloo ranks, rank 2 never reaches step 2's all-reduce.  `commdbg hang`
// starts only after the hang, is given the launcher's pid, and must name the
// stuck rank's pid, the function it is in and the all-reduce the others
// wait in — leaving the job's processes as they were.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.hpp"
#include "hang.hpp"
#include "hang_job_util.hpp"

namespace commdbg::e2e {
namespace {

using nlohmann::json;

struct HangRun {
    ProcResult r;
    json report;
};

HangRun hang(const std::vector<std::string>& args, TempDir& tmp, const std::string& name = "hang.json") {
    HangRun h;
    std::vector<std::string> argv = {commdbg_bin(), "hang", "--json", tmp.path(name)};
    argv.insert(argv.end(), args.begin(), args.end());
    h.r = run(argv, {}, 60);
    if (std::filesystem::exists(tmp.path(name))) h.report = read_json(tmp.path(name));
    return h;
}

const json* rank_of(const json& report, int pid) {
    for (const auto& r : report["ranks"])
        if (r["pid"] == pid) return &r;
    return nullptr;
}

// The verdict of a hung job, checked against the job's own account.
void expect_names_the_stuck_rank(const HangRun& h, const HungJob& job) {
    ASSERT_EQ(h.r.status, 3) << h.r.out << h.r.err;
    const json& v = h.report["verdict"];
    EXPECT_EQ(v["kind"], "missing_ranks") << v.dump();
    EXPECT_EQ(v["culprits"], json::array({job.stuck_pid})) << v.dump();
    EXPECT_EQ(v["collective"], "all_reduce");
    ASSERT_EQ(h.report["ranks"].size(), 3u) << "the launcher is no rank: " << h.report.dump(1).substr(0, 2000);
    for (int pid : job.rank_pids) {
        const json* r = rank_of(h.report, pid);
        ASSERT_NE(r, nullptr) << "rank pid " << pid << " not found";
        if (pid == job.stuck_pid) {
            EXPECT_FALSE(r->contains("collective")) << r->dump();
            EXPECT_EQ((*r)["at"]["function"], job.stuck_function) << r->dump();
            EXPECT_TRUE((*r)["at"]["file"].get<std::string>().ends_with("hang_job.py"));
        } else {
            ASSERT_TRUE(r->contains("collective")) << r->dump();
            EXPECT_EQ((*r)["collective"]["kind"], "all_reduce");
            EXPECT_EQ((*r)["collective"]["called_from"]["function"], "step");
            EXPECT_FALSE((*r)["moved"].get<bool>());
        }
    }
    // The table says the same in words.
    EXPECT_NE(h.r.out.find("pid " + std::to_string(job.stuck_pid) + " never issued all_reduce"), std::string::npos)
        << h.r.out;
    EXPECT_NE(h.r.out.find(job.stuck_function + " at "), std::string::npos) << h.r.out;
}

std::map<int, char> states(const std::vector<int>& pids) {
    std::map<int, char> out;
    for (int p : pids) out[p] = proc_state(p);
    return out;
}

void run_loader_case(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    HungJob job;
    start_hung(job, argv, env);
    ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
    const auto before = states(job.rank_pids);
    TempDir tmp;
    HangRun h = hang({std::to_string(job.job->pid())}, tmp);
    expect_names_the_stuck_rank(h, job);
    // Never stopped or signalled: each rank as it was, still there.
    EXPECT_EQ(states(job.rank_pids), before);
    for (const auto& [pid, st] : before) EXPECT_TRUE(st == 'S' || st == 'R') << pid << " " << st;
}

TEST(Hang, Torch113RankStuckInItsLoaderIsNamedFromTheLaunchersPid) {
    REQUIRE_OR_SKIP(geteuid() == 0, "reading the ranks' memory from a sibling process needs root");
    REQUIRE_TORCH(py);
    run_loader_case({py, kJob, "loader"}, {});
}

TEST(Hang, Torch26RankStuckInItsLoaderIsNamedFromTheLaunchersPid) {
    REQUIRE_OR_SKIP(geteuid() == 0, "reading the ranks' memory from a sibling process needs root");
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    // The launcher here is trixie_run.sh: the ranks are found below it.
    run_loader_case({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/hang_job.py",
                     "loader"},
                    kRootJobEnv);
}

// A rank spinning in pure Python with the GIL held, and one blocked in an
// atexit handler at interpreter teardown, still show where they are.
TEST(Hang, SpinningAndAtexitRanksStillGetStacks) {
    REQUIRE_OR_SKIP(geteuid() == 0, "reading the ranks' memory from a sibling process needs root");
    REQUIRE_TORCH(py);
    for (const char* mode : {"spin", "atexit"}) {
        SCOPED_TRACE(mode);
        HungJob job;
        start_hung(job, {py, kJob, mode});
        ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
        TempDir tmp;
        HangRun h = hang({std::to_string(job.job->pid())}, tmp);
        expect_names_the_stuck_rank(h, job);
        if (std::string(mode) == "spin") {
            const json* r = rank_of(h.report, job.stuck_pid);
            ASSERT_NE(r, nullptr);
            EXPECT_TRUE((*r)["moved"].get<bool>()) << "a spinning rank's frame moves between the looks";
        }
    }
}

// Reports written per node (here: per rank) and merged give the verdict one
// look at all ranks gives.
TEST(Hang, FromMergesPerNodeReportsIntoTheSameVerdict) {
    REQUIRE_OR_SKIP(geteuid() == 0, "reading the ranks' memory from a sibling process needs root");
    REQUIRE_TORCH(py);
    HungJob job;
    start_hung(job, {py, kJob, "loader"});
    ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
    TempDir tmp;
    HangRun all = hang({std::to_string(job.job->pid())}, tmp, "all.json");
    HangRun a = hang({std::to_string(job.rank_pids[0])}, tmp, "a.json");
    HangRun b = hang({std::to_string(job.rank_pids[1]), std::to_string(job.rank_pids[2])}, tmp, "b.json");
    // Alone, one rank in an all-reduce with nobody missing looks like a host-level wait.
    EXPECT_EQ(a.report["verdict"]["kind"], "below_host") << a.report["verdict"].dump();
    HangRun merged = hang({"--from", tmp.path("a.json"), tmp.path("b.json")}, tmp, "merged.json");
    expect_names_the_stuck_rank(merged, job);
    EXPECT_EQ(merged.report["verdict"]["message"], all.report["verdict"]["message"]);
    EXPECT_EQ(merged.report["groups"], all.report["groups"]);
}

TEST(Hang, BadTargetsAndDumpsAreUsageErrorsThatSayWhatToGive) {
    TempDir tmp;
    auto none = run({commdbg_bin(), "hang", "999999999"});
    EXPECT_EQ(none.status, 2) << none.err;
    EXPECT_NE(none.err.find("999999999"), std::string::npos) << none.err;
    // A process with no torch or NCCL under it is no rank.
    Background sleeper({"sleep", "30"});
    auto plain = run({commdbg_bin(), "hang", std::to_string(sleeper.pid())});
    EXPECT_EQ(plain.status, 2);
    EXPECT_NE(plain.err.find("neither it nor a process it started loads libtorch_cpu or libnccl"), std::string::npos)
        << plain.err;
    auto nothing = run({commdbg_bin(), "hang"});
    EXPECT_EQ(nothing.status, 2);
    EXPECT_NE(nothing.err.find("give the PIDs"), std::string::npos) << nothing.err;
    std::ofstream(tmp.path("bad.json")) << "{\"verdict\": {}}";
    auto bad = run({commdbg_bin(), "hang", "--from", tmp.path("bad.json")});
    EXPECT_EQ(bad.status, 2);
    EXPECT_NE(bad.err.find("bad.json: not a report of commdbg hang --json"), std::string::npos) << bad.err;
    auto missing = run({commdbg_bin(), "hang", "--from", tmp.path("nope.json")});
    EXPECT_EQ(missing.status, 2);
    EXPECT_NE(missing.err.find("cannot read"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace commdbg::e2e

namespace commdbg::e2e {
namespace {

// Every thread's stack of a real CPython build, read from outside: the
// image's pyenv builds 3.10-3.13 and Debian's 3.11, each named and placed
// at the line the script marks.
class HangStacks : public ::testing::TestWithParam<std::string> {};

std::map<std::string, uint32_t> marked_lines(const std::string& path) {
    std::map<std::string, uint32_t> out;
    std::ifstream in(path);
    std::string line;
    for (uint32_t n = 1; std::getline(in, line); ++n)
        if (auto at = line.find("# here: "); at != std::string::npos) out[line.substr(at + 8)] = n;
    return out;
}

TEST_P(HangStacks, EveryThreadsStackIsReadFromOutside) {
    REQUIRE_OR_SKIP(geteuid() == 0, "reading another process's memory from a sibling needs root");
    const std::string exe = GetParam();
    if (!std::filesystem::exists(exe)) GTEST_SKIP() << exe << " is not installed on this machine";
    const std::string script = std::string(SOURCE_DIR) + "/tests/testprogs/py_threads_workload.py";
    const auto lines = marked_lines(script);
    Background py({exe, script});
    auto ready = json::parse(py.wait_for_line("worker_tid", 30), nullptr, false);
    ASSERT_TRUE(ready.is_object()) << "the workload did not start";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // from its print into sleep
    hang::RankSample s = hang::sample_rank(ready["pid"].get<int>());
    ASSERT_TRUE(s.python_note.empty()) << s.python_note;
    std::map<std::string, const hang::ThreadSample*> by_top;
    for (const auto& t : s.threads)
        if (t.python && !t.stack.empty()) by_top[t.stack.front().function] = &t;
    ASSERT_EQ(by_top.size(), 2u) << "two Python threads";
    ASSERT_TRUE(by_top.count("inner") && by_top.count("worker_loop"));
    const hang::ThreadSample& main = *by_top["inner"];
    std::vector<std::pair<std::string, uint32_t>> got;
    for (const auto& f : main.stack) got.emplace_back(f.function, f.line);
    EXPECT_EQ(got, (std::vector<std::pair<std::string, uint32_t>>{
                       {"inner", lines.at("inner")}, {"outer", lines.at("outer")}, {"<module>", lines.at("<module>")}}));
    EXPECT_EQ(main.stack.front().file, script);
    const hang::ThreadSample& worker = *by_top["worker_loop"];
    EXPECT_EQ(worker.stack.front().line, lines.at("worker_loop"));
    EXPECT_TRUE(worker.stack.back().function.ends_with("_bootstrap"))  // 3.10 has no qualname
        << worker.stack.back().function;
    // The thread ids the kernel knows, where the build's thread state has one.
    if (main.tid != 0) {
        EXPECT_EQ(main.tid, static_cast<uint32_t>(ready["pid"].get<int>()));
        EXPECT_EQ(worker.tid, ready["worker_tid"].get<uint32_t>());
        EXPECT_EQ(s.threads.front().tid, main.tid) << "the main thread first";
    }
    EXPECT_FALSE(main.fault || worker.fault || main.truncated || worker.truncated);
}

INSTANTIATE_TEST_SUITE_P(Interpreters, HangStacks,
                         ::testing::Values("/usr/bin/python3.11", "/root/.pyenv/versions/3.10.13/bin/python3",
                                           "/root/.pyenv/versions/3.11.7/bin/python3",
                                           "/root/.pyenv/versions/3.12.1/bin/python3",
                                           "/root/.pyenv/versions/3.13.0/bin/python3"));

}  // namespace
}  // namespace commdbg::e2e
