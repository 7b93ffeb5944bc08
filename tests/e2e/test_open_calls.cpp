// SPDX-License-Identifier: Apache-2.0
// A return-probed call sends its one record when it returns.  A call that
// has not returned -- a rank waiting in a collective for a peer that never
// comes, the case a debugger is for -- must still be in the report: as an
// open call when the window closes, and when its process dies inside it.
#include <gtest/gtest.h>
#include <signal.h>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// ncclRecv from NCCL_STUB_PEER_SILENT (-1000) blocks `count` ms in the stub:
// 60 s, far past the window.  One ncclAllReduce before it returns at once.
const char* kWaitingRank = R"PY(
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
print("ready pid=%d" % os.getpid(), flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
rc = lib.ncclAllReduce(None, None, ctypes.c_size_t(8), 7, 0, ctypes.c_void_p(0x1000), ctypes.c_void_p(0x7777))
print("reduced rc=%d" % rc, flush=True)
print("receiving", flush=True)
lib.ncclRecv(ctypes.c_void_p(0x2000), ctypes.c_size_t(60000), 7, -1000, ctypes.c_void_p(0x1000),
             ctypes.c_void_p(0x5555))
)PY";

struct Traced {
    TempDir tmp;
    Background work;
    Background dbg;

    explicit Traced(bool stack_args = false)
        : work({"/usr/bin/python3", "-c", kWaitingRank, lib_path(false), tmp.path("go")}), dbg(attach_argv(stack_args)) {}

    std::vector<std::string> attach_argv(bool stack_args) {
        std::vector<std::string> argv = {commdbg_bin(), "attach", "--no-daemon", "--json", tmp.path("out.json")};
        if (stack_args) argv.push_back("--stack-args");
        argv.push_back(pid_arg());
        return argv;
    }

    std::string pid_arg() {
        std::string ready = work.wait_for_line("ready pid=");
        return std::to_string(work.pid());
    }

    // Starts the calls once commdbg traces, returns once the rank waits.
    ::testing::AssertionResult start() {
        if (dbg.wait_for_err_line("commdbg: tracing", 60).empty())
            return ::testing::AssertionFailure() << "commdbg never said it was tracing: " << dbg.wait(5).err;
        touch(tmp.path("go"));
        if (work.wait_for_line("reduced rc=").find("rc=0") == std::string::npos)
            return ::testing::AssertionFailure() << "the stub all-reduce failed";
        if (work.wait_for_line("receiving").empty()) return ::testing::AssertionFailure() << "never got to ncclRecv";
        usleep(300 * 1000);  // inside ncclRecv by now (it sleeps 60 s)
        return ::testing::AssertionSuccess();
    }

    // Ends the window with Ctrl-C while the rank still waits, then the rank;
    // the dump commdbg wrote.
    nlohmann::json close_window() {
        kill(dbg.pid(), SIGINT);
        auto d = dbg.wait(60);
        EXPECT_EQ(d.status, 0) << d.err;
        kill(work.pid(), SIGKILL);
        return read_json(tmp.path("out.json"));
    }
};

const nlohmann::json* find_record(const nlohmann::json& j, const std::string& name) {
    for (const auto& rec : j["records"])
        if (rec.value("name", "") == name) return &rec;
    return nullptr;
}

TEST(OpenCalls, ACallStillInFlightWhenTheWindowClosesIsReportedOpen) {
    REQUIRE_BPF();
    Traced t;
    ASSERT_TRUE(t.start());
    auto j = t.close_window();
    if (HasFailure()) return;
    EXPECT_EQ(j["comm_counts"].value("nccl.all_reduce", 0), 1) << j["comm_counts"].dump();
    EXPECT_EQ(j["comm_counts"].value("nccl.recv", 0), 1) << j["comm_counts"].dump();
    const nlohmann::json* done = find_record(j, "ncclAllReduce");
    ASSERT_NE(done, nullptr) << j["records"].dump();
    EXPECT_EQ(done->value("ret", -1), 0);
    EXPECT_FALSE(done->at("end_ns").is_null());
    const nlohmann::json* open = find_record(j, "ncclRecv");
    ASSERT_NE(open, nullptr) << "the call in flight is missing: " << j["records"].dump();
    EXPECT_TRUE(open->at("end_ns").is_null()) << open->dump();
    EXPECT_FALSE(open->contains("ret")) << open->dump();
    // Its arguments are the entry's (ncclRecv's stream is a register).
    EXPECT_EQ(open->value("peer", 0), -1000) << open->dump();
    EXPECT_EQ(open->value("output_elements", 0L), 60000L) << open->dump();
    EXPECT_EQ(open->value("stream", ""), "0x5555") << open->dump();
    EXPECT_GT(open->value("start_ns", 0UL), done->value("start_ns", 0UL));
    // ncclAllReduce's stream is its 7th argument, a stack word: not read
    // without --stack-args, and then not shown (never as a made-up 0).
    EXPECT_FALSE(done->contains("stream")) << done->dump();
}

TEST(OpenCalls, StackArgsShowTheStackWordsOfACompletedAndAnOpenCall) {
    REQUIRE_BPF();
    Traced t(/*stack_args=*/true);
    ASSERT_TRUE(t.start());
    auto j = t.close_window();
    if (HasFailure()) return;
    const nlohmann::json* done = find_record(j, "ncclAllReduce");
    ASSERT_NE(done, nullptr) << j["records"].dump();
    EXPECT_EQ(done->value("stream", ""), "0x7777") << done->dump();
    const nlohmann::json* open = find_record(j, "ncclRecv");
    ASSERT_NE(open, nullptr) << j["records"].dump();
    EXPECT_EQ(open->value("stream", ""), "0x5555") << open->dump();
}

TEST(OpenCalls, AProcessKilledInsideACallStillShowsTheCall) {
    REQUIRE_BPF();
    Traced t;
    ASSERT_TRUE(t.start());
    kill(t.work.pid(), SIGKILL);
    auto d = t.dbg.wait(60);  // attach ends when its process is gone
    ASSERT_EQ(d.status, 0) << d.err;

    auto j = read_json(t.tmp.path("out.json"));
    EXPECT_EQ(j["comm_counts"].value("nccl.recv", 0), 1) << j["comm_counts"].dump();
    const nlohmann::json* open = find_record(j, "ncclRecv");
    ASSERT_NE(open, nullptr) << "the call it died in is missing: " << j["records"].dump();
    EXPECT_TRUE(open->at("end_ns").is_null()) << open->dump();
    EXPECT_FALSE(open->contains("ret")) << open->dump();
    EXPECT_EQ(open->value("peer", 0), -1000) << open->dump();
    EXPECT_EQ(open->value("stream", ""), "0x5555") << open->dump();
}

}  // namespace
}  // namespace commdbg::e2e
