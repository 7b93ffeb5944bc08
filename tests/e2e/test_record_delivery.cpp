// SPDX-License-Identifier: Apache-2.0
// Call records do not wake commdbg one by one (the kernel side wakes it only
// once the ring buffer is 1/8 full): the last records of a process that has
// gone quiet must still arrive within a poll interval, not at the end of the
// window or never.
#include <gtest/gtest.h>
#include <signal.h>

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
    if (dbg.wait_for_err_line("commdbg: tracing", 60).empty()) {
        auto r = dbg.wait(5);
        FAIL() << "commdbg never said it was tracing; status " << r.status << " stderr: " << r.err;
    }
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

}  // namespace
}  // namespace commdbg::e2e
