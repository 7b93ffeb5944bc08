// SPDX-License-Identifier: Apache-2.0
// Call records do not wake commdbg one by one (the kernel side wakes it only
// once the ring buffer is 1/8 full): the last records of a process that has
// gone quiet must still arrive within a poll interval, not at the end of the
// window or never.  Records without context go out in per-thread batches
// (bpf/lib/batch.h): a thread that sleeps or exits sends its batch, and what
// a thread still holds when the window closes is read from it, each record
// once.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <thread>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// One ncclAllReduce on the stub (fake comm), then quiet.  The calling thread
// renames itself 1 s after the call: commdbg reads a thread's name when its
// first record arrives, so the name in the dump says whether the record came
// within the second or only when the window ended.
const char* kQuietCaller = R"PY(
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
libc = ctypes.CDLL(None)
def name(n):
    libc.prctl(15, ctypes.c_char_p(n), 0, 0, 0)  # PR_SET_NAME
name(b"one-call")
print("ready pid=%d" % os.getpid(), flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
rc = lib.ncclAllReduce(None, None, ctypes.c_size_t(1), 7, 0, ctypes.c_void_p(0x1000), None)
print("called rc=%d" % rc, flush=True)
time.sleep(1.0)
name(b"renamed-later")
print("renamed", flush=True)
time.sleep(60)
)PY";

TEST(RecordDelivery, LastRecordOfAQuietProcessArrivesWithinThePollInterval) {
    REQUIRE_BPF();
    TempDir tmp;
    Background work({"/usr/bin/python3", "-c", kQuietCaller, lib_path(false), tmp.path("go")});
    std::string ready = work.wait_for_line("ready pid=");
    ASSERT_FALSE(ready.empty()) << "python3 with ctypes never got ready";

    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "--json",
                    tmp.path("out.json")});
    ASSERT_TRUE(wait_tracing(dbg));
    touch(tmp.path("go"));
    ASSERT_NE(work.wait_for_line("called rc=").find("rc=0"), std::string::npos) << "the stub call failed";
    ASSERT_FALSE(work.wait_for_line("renamed").empty());
    kill(dbg.pid(), SIGINT);
    auto d = dbg.wait(60);
    ASSERT_EQ(d.status, 0) << d.err;
    kill(work.pid(), SIGKILL);

    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["comm_counts"].value("nccl.all_reduce", 0), 1) << j["comm_counts"].dump();
    long tid = -1;
    for (const auto& rec : j["records"])
        if (rec.value("name", "") == "ncclAllReduce") tid = rec["tid"].get<long>();
    ASSERT_NE(tid, -1) << "the call's record never arrived: " << j["records"].dump();
    ASSERT_TRUE(j.contains("thread_names")) << j.dump(2).substr(0, 2000);
    EXPECT_EQ(j["thread_names"].value(std::to_string(tid), ""), "one-call")
        << "the record arrived only after the thread renamed itself, 1 s after the call: "
        << j["thread_names"].dump();
}

// The dump's ncclAllReduce records.
int all_reduce_records(const nlohmann::json& j) {
    int n = 0;
    for (const auto& rec : j["records"]) n += rec.value("name", "") == "ncclAllReduce";
    return n;
}

// The `--cost` line's batch counts: records that came in a thread's batch,
// and of them those read from the thread at the window's end.
std::pair<long, long> batch_counts(const std::string& err) {
    static const std::regex re(R"(([0-9]+) came in their thread's batch, ([0-9]+) of them read from the thread)");
    std::smatch m;
    if (!std::regex_search(err, m, re)) return {-1, -1};
    return {std::stol(m[1]), std::stol(m[2])};
}

// A worker makes kCalls ncclAllReduce calls (the stub, a process without
// Python: records without context), commdbg sees such a record go out by
// itself and starts the batches; then kCalls more, fewer than a batch holds,
// and the worker sleeps in the window.  With the switch-out flush its batch
// arrives while it sleeps: nothing is left at the end.  Without it (the
// window-end read alone) the batch is read from the thread then.  Either way
// every call has exactly one record.
class BatchDelivery : public ::testing::TestWithParam<bool> {};

TEST_P(BatchDelivery, ASleepingThreadsBatchArrivesOnceAndWhole) {
    REQUIRE_BPF();
    const bool flush_at_switch = GetParam();
    constexpr int kCalls = 5;  // a round; fewer than a batch (CD_BATCH, 8) holds
    TempDir tmp;
    Background work({testprog("nccl_workload"), "--calls", "all_reduce=" + std::to_string(kCalls), "--wait-file",
                     tmp.path("go"), "--again-file", tmp.path("again"), "--linger-ms", "60000", "--fake-comm"},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";
    std::map<std::string, std::string> env;
    if (!flush_at_switch) env["COMMDBG_TEST_NO_SWITCH_FLUSH"] = "1";
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "--cost", "--json",
                    tmp.path("out.json")},
                   env);
    ASSERT_TRUE(wait_tracing(dbg));
    EXPECT_EQ(count_links_of_programs({"on_switch"}), 0) << "no batches yet: no program at every context switch";
    touch(tmp.path("go"));
    ASSERT_FALSE(work.wait_for_line("round done").empty());
    // The round's records went out one by one; the first of them without
    // context starts the batches (and links on_switch where asked).
    for (int i = 0; i < 100 && flush_at_switch && count_links_of_programs({"on_switch"}) < 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!flush_at_switch) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(count_links_of_programs({"on_switch"}), flush_at_switch ? 1 : 0);
    touch(tmp.path("again"));
    ASSERT_FALSE(work.wait_for_line("lingering tid=").empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it sleeps by now: switched out
    kill(dbg.pid(), SIGINT);
    auto d = dbg.wait(60);
    ASSERT_EQ(d.status, 0) << d.err;
    kill(work.pid(), SIGKILL);

    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["comm_counts"].value("nccl.all_reduce", 0), 2 * kCalls) << j["comm_counts"].dump();
    const int records = all_reduce_records(j);
    EXPECT_EQ(records, 2 * kCalls) << "each call one record, none twice: " << j["records"].dump().substr(0, 2000);
    auto [batched, at_end] = batch_counts(d.err);
    ASSERT_GE(batched, 0) << "no batch counts in: " << d.err;
    EXPECT_EQ(batched, kCalls) << "the second round's records, in the thread's batch";
    EXPECT_EQ(at_end, flush_at_switch ? 0 : kCalls) << d.err;
}

INSTANTIATE_TEST_SUITE_P(SwitchFlushOnAndOff, BatchDelivery, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "FlushAtSwitch" : "WindowEndReadOnly"; });

// Threads that exit send what they batched: with the switch-out flush off,
// still nothing is left for the window's end, and every call has its record.
TEST(BatchDelivery, ExitingThreadsSendTheirBatches) {
    REQUIRE_BPF();
    constexpr int kCalls = 150;  // a round, over 3 threads
    TempDir tmp;
    auto env = nccl_env(false);
    env["COMMDBG_TEST_NO_SWITCH_FLUSH"] = "1";
    Background dbg({commdbg_bin(), "run", "--cost", "--json", tmp.path("out.json"), "--", testprog("nccl_workload"),
                    "--threads", "3", "--calls", "all_reduce=" + std::to_string(kCalls), "--again-file",
                    tmp.path("again"), "--fake-comm"},
                   env);
    ASSERT_FALSE(dbg.wait_for_line("round done").empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the batches start
    touch(tmp.path("again"));
    auto r = dbg.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    const int records = all_reduce_records(j);
    EXPECT_EQ(records, 2 * kCalls);
    auto [batched, at_end] = batch_counts(r.err);
    // The whole second round at least (the batches may start during the
    // first, whose threads still run when commdbg sees its first record).
    EXPECT_GE(batched, kCalls) << "the second round's records, in their threads' batches: " << r.err;
    EXPECT_EQ(at_end, 0) << r.err;
}

// A session whose records all carry context (a Python process's, with its
// stack) never starts the batches: no program at every context switch.
TEST(BatchDelivery, RecordsWithContextStartNoBatches) {
    REQUIRE_BPF();
    TempDir tmp;
    Background dbg({commdbg_bin(), "run", "--cost", "--json", tmp.path("out.json"), "--", "/usr/bin/python3", "-c",
                    "import ctypes, os, sys, time\n"
                    "lib = ctypes.CDLL(sys.argv[1])\n"
                    "for i in range(50):\n"
                    "    lib.ncclAllReduce(None, None, ctypes.c_size_t(1), 7, 0, ctypes.c_void_p(0x1000), None)\n"
                    "print('called', flush=True)\n"
                    "while not os.path.exists(sys.argv[2]):\n"
                    "    time.sleep(0.01)\n",
                    lib_path(false), tmp.path("end")});
    ASSERT_FALSE(dbg.wait_for_line("called").empty()) << "python3 with ctypes never made its calls";
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // what a batch start would take
    EXPECT_EQ(count_links_of_programs({"on_switch"}), 0);
    touch(tmp.path("end"));
    auto r = dbg.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    const int records = all_reduce_records(j);
    EXPECT_EQ(records, 50);
    auto [batched, at_end] = batch_counts(r.err);
    EXPECT_EQ(batched, 0) << r.err;
}

}  // namespace
}  // namespace commdbg::e2e
