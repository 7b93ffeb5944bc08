// SPDX-License-Identifier: Apache-2.0
// Issue 21.5: through the root daemon, uid 65534 gets only the processes the
// kernel would let it read itself (ptrace_may_access: its uid as the real,
// effective and saved uid, its gid likewise, and dumpable).  A python3 root
// started that dropped to 65534, one of 65534's that called
// prctl(PR_SET_DUMPABLE, 0), and a set-uid-root program 65534 started are
// all "its" by their real uid; `commdbg attach` and `commdbg counts --pid`
// refuse them with "permission denied", while an ordinary process of its own
// is still traced.  A traced process that execs a set-uid program during the
// window stops being traced for it, and its report says so.
#include <sys/stat.h>

#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

// A python3 that runs `prelude`, says "ready", then sleeps (or, given a
// file, waits for it and runs `then`).
std::vector<std::string> python(const std::string& prelude, const std::string& then = "time.sleep(60)") {
    return {"/usr/bin/python3", "-c", "import ctypes, os, sys, time\n" + prelude + "\nprint('ready', flush=True)\n" + then};
}

// "Uid:" of /proc/PID/status: real, effective, saved, filesystem.
std::string uid_line(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("Uid:", 0) == 0) return line;
    return "";
}

uid_t stat_owner(int pid) {
    struct stat st {};
    return ::stat(("/proc/" + std::to_string(pid) + "/stat").c_str(), &st) == 0 ? st.st_uid : ~0u;
}

// Polls until the Uid: line of pid equals `want` (setpriv then the exec of a set-uid file).
bool wait_uids(int pid, const std::string& want) {
    auto deadline = Clock::now() + std::chrono::seconds(15);
    while (Clock::now() < deadline) {
        if (uid_line(pid) == want) return true;
        sleep_ms(50);
    }
    return false;
}

// A copy of /bin/sleep that is set-uid root, in a dir uid 65534 may enter.
std::string setuid_sleep(const SharedDir& dir) {
    const std::string to = dir.path("setuid_sleep");
    std::filesystem::copy_file("/bin/sleep", to, std::filesystem::copy_options::overwrite_existing);
    EXPECT_EQ(chown(to.c_str(), 0, 0), 0);
    EXPECT_EQ(chmod(to.c_str(), 04755), 0);
    return to;
}

// uid 65534's attach and counts --pid on `pid`: both refused, nothing written.
void expect_refused(const NobodyBins& bins, const Daemon& d, const SharedDir& tmp, int pid, const std::string& what) {
    const std::string p = std::to_string(pid), out = tmp.path("out-" + p + ".json");
    auto r = cli_as_nobody(bins, {"attach", p, "-d", "1", "--noise-level", "2", "--json", out, "--socket", d.socket()});
    EXPECT_NE(r.status, 0) << what << " was traced for uid 65534: " << r.err;
    EXPECT_NE(r.err.find("permission denied"), std::string::npos) << what << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << what << ": its dump was written for uid 65534";
    auto c = cli_as_nobody(bins, {"counts", "--pid", p, "--json", "--socket", d.socket()});
    EXPECT_NE(c.status, 0) << what << ": " << c.out;
    EXPECT_NE(c.err.find("permission denied"), std::string::npos) << what << ": " << c.err;
}

// The process entry of `pid` in an attach dump.
json dumped_process(const std::string& file, int pid) {
    std::ifstream in(file);
    auto j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return json();
    // One process: the dump is its object; several: a "processes" list.
    if (!j.contains("processes")) return j.value("process", json::object()).value("pid", 0) == pid ? j : json();
    for (const auto& p : j.value("processes", json::array()))
        if (p.value("process", json::object()).value("pid", 0) == pid) return p;
    return json();
}

TEST(DaemonPrivilege, ProcessesTheKernelWouldNotLetUid65534ReadAreRefusedItsOwnAreNot) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    const std::string all_nobody = "Uid:\t65534\t65534\t65534\t65534";

    // Root's, dropped to 65534 with setresuid: the kernel marks it non-dumpable.
    Background dropped(python("os.setresgid(65534, 65534, 65534); os.setgroups([]); os.setresuid(65534, 65534, 65534)"));
    ASSERT_FALSE(dropped.wait_for_line("ready").empty());
    ASSERT_EQ(uid_line(dropped.pid()), all_nobody);
    ASSERT_EQ(stat_owner(dropped.pid()), 0u) << "the kernel left it dumpable";
    // 65534's own, made non-dumpable.
    Background undumpable(concat(kAsNobody, python("ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)")));
    ASSERT_FALSE(undumpable.wait_for_line("ready").empty());
    ASSERT_EQ(stat_owner(undumpable.pid()), 0u);
    // A set-uid-root program 65534 started.
    Background setuid(concat(kAsNobody, {setuid_sleep(tmp), "60"}));
    ASSERT_TRUE(wait_uids(setuid.pid(), "Uid:\t65534\t0\t0\t0")) << uid_line(setuid.pid());
    // And an ordinary one of its own.
    Background own(concat(kAsNobody, python("")));
    ASSERT_FALSE(own.wait_for_line("ready").empty());
    ASSERT_EQ(uid_line(own.pid()), all_nobody);

    expect_refused(bins, d, tmp, dropped.pid(), "a process root started and dropped to 65534");
    expect_refused(bins, d, tmp, undumpable.pid(), "65534's process after prctl(PR_SET_DUMPABLE, 0)");
    expect_refused(bins, d, tmp, setuid.pid(), "a set-uid-root program 65534 started");

    const std::string out = tmp.path("own.json"), p = std::to_string(own.pid());
    auto r = cli_as_nobody(bins, {"attach", p, "-d", "1", "--noise-level", "2", "--json", out, "--socket", d.socket()});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(dumped_process(out, own.pid()).is_object()) << "no report of its own process";
    auto c = cli_as_nobody(bins, {"counts", "--pid", p, "--json", "--socket", d.socket()});
    EXPECT_EQ(c.err.find("permission denied"), std::string::npos) << c.err;  // "not counted": it calls no NCCL
    // Root may trace them all.
    auto root = cli({"attach", std::to_string(setuid.pid()), "-d", "1", "--json", tmp.path("root.json"), "--socket",
                     d.socket()});
    EXPECT_EQ(root.status, 0) << root.err;
}

// 65534 traces its own process, which then execs a set-uid-root program:
// from the exec on nothing of it is traced or read for 65534, and its report
// says why.
TEST(DaemonPrivilege, TracedProcessThatExecsASetUidProgramIsNoLongerTraced) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    const std::string go = tmp.path("go"), suid = setuid_sleep(tmp);
    Background target(concat(kAsNobody, python("", "while not os.path.exists('" + go + "'): time.sleep(0.05)\n"
                                                   "os.execv('" + suid + "', ['" + suid + "', '60'])")));
    ASSERT_FALSE(target.wait_for_line("ready").empty());
    const std::string out = tmp.path("out.json");
    Background attach(concat(concat(kAsNobody, {bins.commdbg}), {"attach", std::to_string(target.pid()), "-d", "6",
                                                                  "--json", out, "--socket", d.socket()}));
    auto deadline = Clock::now() + std::chrono::seconds(30);
    bool tracing = false;
    while (!tracing && Clock::now() < deadline) {
        for (const auto& s : cli_json({"sessions", "--socket", d.socket()}).value("sessions", json::array()))
            tracing = tracing || s.value("state", "") == "tracing";
        if (!tracing) sleep_ms(100);
    }
    ASSERT_TRUE(tracing) << "the session never started";
    touch(go);
    ASSERT_TRUE(wait_uids(target.pid(), "Uid:\t65534\t0\t0\t0")) << uid_line(target.pid());
    auto r = attach.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    json proc = dumped_process(out, target.pid());
    ASSERT_TRUE(proc.is_object()) << "no report of the target";
    std::string notes = proc.value("notes", json::array()).dump();
    EXPECT_NE(notes.find("is no longer traced: uid 65534 may not read it"), std::string::npos) << notes;
}

}  // namespace
}  // namespace commdbg::e2e
