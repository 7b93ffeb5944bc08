// SPDX-License-Identifier: Apache-2.0
// Robustness: SIGKILL of commdbg mid-trace leaves the target running to a
// normal end and no BPF links behind; a target stopped at a loader event is
// resumed by the watchdog when commdbg dies; bad input gives one clear
// "commdbg: ..." line saying what to do, a non-zero status and no crash.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

const std::vector<std::string> kOurPrograms = {"call_enter", "call_exit", "dl_debug_state",
                                               "on_fork",    "on_exit",   "on_exec"};
constexpr int kAr = 3, kBc = 2;

std::string calls_arg() { return "all_reduce=" + std::to_string(kAr) + ",broadcast=" + std::to_string(kBc); }




// Polls bpftool until none of our programs has a link (teardown is async on fd close).
int links_after_teardown(int timeout_ms = 5000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int n = count_links_of_programs(kOurPrograms);
    while (n != 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        n = count_links_of_programs(kOurPrograms);
    }
    return n;
}

// Makes this test process the reaper of orphans for its lifetime, so the
// workload left behind by a killed `commdbg run` can be waited for.  Declare
// it first in a test: on the way out it reaps the adopted zombies left (the
// resume guard), once every Background of the test is done.
class SubreaperScope {
public:
    SubreaperScope() { ok_ = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }
    ~SubreaperScope() {
        prctl(PR_SET_CHILD_SUBREAPER, 0);
        for (int i = 0; i < 20; ++i) {
            bool any = false;
            for (auto [pid, state] : children_of(getpid())) {
                any = true;
                if (state == 'Z') waitpid(pid, nullptr, WNOHANG);
            }
            if (!any) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    bool ok() const { return ok_; }

private:
    bool ok_ = false;
};

// Waits for `pid` to be adopted by us (its parent died) and to exit; returns
// its exit status (128+sig), -1 on timeout, -2 if it ended elsewhere.
int wait_adopted(int pid, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        int ws = 0;
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid) return WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : -1;
        // ECHILD while the old parent still lives (or before reparenting).
        if (w < 0 && proc_state(pid) == 0) return -2;
        if (std::chrono::steady_clock::now() >= deadline) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

std::string exe_of(int pid) {
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
    return ec ? std::string() : p.string();
}

// --- (a) SIGKILL of commdbg mid-trace ------------------------------------------

TEST(KillCommdbg, AttachKilledMidTraceTargetFinishesAndNoLinksRemain) {
    REQUIRE_BPF();
    TempDir tmp;
    Background work({testprog("nccl_workload"), "--calls", calls_arg(), "--duration-ms", "4000", "--fake-comm",
                     "--wait-file", tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty());
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid())});
    ASSERT_FALSE(dbg.wait_for_err_line("commdbg: tracing", 60).empty()) << dbg.wait(5).err;
    touch(tmp.path("go"));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    // The probes are really in place while the workload calls through them.
    ASSERT_GT(count_links_of_programs(kOurPrograms), 0) << "no links of ours while tracing";
    ASSERT_EQ(kill(dbg.pid(), SIGKILL), 0);
    auto d = dbg.wait(30);
    EXPECT_EQ(d.status, 128 + SIGKILL);

    auto w = work.wait(30);
    EXPECT_EQ(w.status, 0) << w.err;
    auto rep = workload_report(w.out);
    ASSERT_TRUE(rep.is_object()) << "workload printed no final report:\n" << w.out << w.err;
    long rounds = rep["rounds"].get<long>();
    EXPECT_GT(rounds, 0);
    EXPECT_EQ(rep["calls"]["all_reduce"].get<long>(), kAr * rounds);
    EXPECT_EQ(rep["calls"]["broadcast"].get<long>(), kBc * rounds);
    EXPECT_EQ(rep["errors"].get<long>(), 0);
    EXPECT_EQ(links_after_teardown(), 0) << "BPF links left behind after SIGKILL of commdbg";
}

TEST(KillCommdbg, RunKilledMidTraceChildFinishesAndNoLinksRemain) {
    REQUIRE_BPF();
    SubreaperScope reaper;  // the workload is commdbg's child: adopt it when commdbg dies
    ASSERT_TRUE(reaper.ok());
    TempDir tmp;
    Background dbg({commdbg_bin(), "run", "--", testprog("nccl_workload"), "--calls", calls_arg(), "--duration-ms",
                    "4000", "--fake-comm", "--wait-file", tmp.path("go")},
                   nccl_env(false));
    // The workload's stdout is commdbg's: its ready line arrives through our pipe.
    std::string ready = dbg.wait_for_line("ready pid=", 60);
    ASSERT_FALSE(ready.empty()) << dbg.wait(5).err;
    int wpid = pid_of_ready(ready);
    ASSERT_GT(wpid, 0);
    ASSERT_NE(wpid, dbg.pid());
    touch(tmp.path("go"));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ASSERT_GT(count_links_of_programs(kOurPrograms), 0) << "no links of ours while tracing";
    ASSERT_EQ(kill(dbg.pid(), SIGKILL), 0);  // commdbg only, not its process group

    int wstatus = wait_adopted(wpid, 15000);
    EXPECT_EQ(wstatus, 0) << "workload did not finish normally after commdbg was killed (-1: still there, state "
                          << proc_state(wpid) << ")";
    if (wstatus == -1) kill(wpid, SIGKILL);
    auto d = dbg.wait(30);
    EXPECT_EQ(d.status, 128 + SIGKILL);
    auto rep = workload_report(d.out);
    ASSERT_TRUE(rep.is_object()) << "workload printed no final report:\n" << d.out << d.err;
    EXPECT_EQ(rep["pid"].get<int>(), wpid);
    long rounds = rep["rounds"].get<long>();
    EXPECT_GT(rounds, 0);
    EXPECT_EQ(rep["calls"]["all_reduce"].get<long>(), kAr * rounds);
    EXPECT_EQ(rep["calls"]["broadcast"].get<long>(), kBc * rounds);
    EXPECT_EQ(links_after_teardown(), 0) << "BPF links left behind after SIGKILL of commdbg";
}

// A process traced by `run` is stopped at each loader event until commdbg has
// attached to the new libraries.  Freeze commdbg so it cannot resume, let the
// workload dlopen libnccl (it stops), then SIGKILL commdbg: the watchdog must
// SIGCONT it, and it must run to a normal end.
TEST(KillCommdbg, TargetStoppedAtLoaderEventIsResumedWhenCommdbgDies) {
    REQUIRE_BPF();
    SubreaperScope reaper;
    ASSERT_TRUE(reaper.ok());
    std::string lib = std::string(STUB_NCCL_DIR) + "/libnccl.so.2";
    Background dbg({commdbg_bin(), "run", "--", testprog("nccl_workload_dl"), "--dlopen", lib, "--start-delay-ms",
                    "1500", "--calls", calls_arg(), "--fake-comm"});
    // Find the workload among commdbg's children once it has exec'd.
    int wpid = -1;
    std::string want = std::filesystem::canonical(testprog("nccl_workload_dl")).string();
    for (int i = 0; i < 200 && wpid < 0; ++i) {
        for (auto [c, state] : children_of(dbg.pid()))
            if (exe_of(c) == want) wpid = c;
        if (wpid < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(wpid, 0) << "workload not found among commdbg's children";
    // Let commdbg finish resuming the stops of the initial exec, then freeze it.
    ASSERT_TRUE(wait_proc_state(wpid, 'S', 1000)) << "workload not sleeping in its start delay: " << proc_state(wpid);
    ASSERT_EQ(kill(dbg.pid(), SIGSTOP), 0);
    bool stopped = wait_proc_state(wpid, 'T', 5000);
    char state = proc_state(wpid);
    ASSERT_EQ(kill(dbg.pid(), SIGKILL), 0);
    if (!stopped) {
        kill(wpid, SIGKILL);
        FAIL() << "workload never stopped at its dlopen (state " << state << "): the loader stop did not happen";
    }
    int wstatus = wait_adopted(wpid, 10000);
    if (wstatus == -1) {
        char st = proc_state(wpid);
        kill(wpid, SIGKILL);
        FAIL() << "workload left stuck after commdbg died (state " << st << ")";
    }
    EXPECT_EQ(wstatus, 0);
    auto d = dbg.wait(30);
    EXPECT_EQ(d.status, 128 + SIGKILL);
    auto rep = workload_report(d.out);
    ASSERT_TRUE(rep.is_object()) << "workload printed no final report:\n" << d.out << d.err;
    EXPECT_EQ(rep["calls"]["all_reduce"].get<int>(), kAr);
    EXPECT_EQ(rep["calls"]["broadcast"].get<int>(), kBc);
    EXPECT_EQ(links_after_teardown(), 0);
}

// --- (b) bad input --------------------------------------------------------------

// Exactly one non-empty stderr line, starting "commdbg:", containing each key.
void expect_one_clear_error(const ProcResult& r, const std::vector<std::string>& keys) {
    EXPECT_NE(r.status, 0);
    EXPECT_GT(r.status, 0);
    EXPECT_LT(r.status, 128) << "crashed or killed";
    std::vector<std::string> lines;
    std::istringstream in(r.err);
    for (std::string l; std::getline(in, l);)
        if (!l.empty()) lines.push_back(l);
    ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
    EXPECT_EQ(lines[0].rfind("commdbg:", 0), 0u) << lines[0];
    for (const auto& k : keys) EXPECT_NE(lines[0].find(k), std::string::npos) << "'" << k << "' not in: " << lines[0];
}

TEST(BadInput, AttachNonexistentPid) {
    REQUIRE_BPF();
    const int pid = 999999;
    if (std::filesystem::exists("/proc/" + std::to_string(pid))) GTEST_SKIP() << "pid 999999 exists here";
    auto r = run({commdbg_bin(), "attach", std::to_string(pid)}, {}, 30);
    expect_one_clear_error(r, {"999999", "no such process", "check the pid"});
}

TEST(BadInput, AttachKernelThread) {
    REQUIRE_BPF();
    std::ifstream comm("/proc/2/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "kthreadd") GTEST_SKIP() << "pid 2 is not kthreadd here (pid namespace?): " << name;
    auto r = run({commdbg_bin(), "attach", "2"}, {}, 30);
    expect_one_clear_error(r, {"kernel thread", "kthreadd", "attach to the user process"});
}

TEST(BadInput, AttachAsUnprivilegedUserToRootProcess) {
    REQUIRE_BPF();
    if (!std::filesystem::exists("/usr/bin/setpriv") && !std::filesystem::exists("/bin/setpriv"))
        GTEST_SKIP() << "setpriv (util-linux) not installed";
    Background sleeper({testprog("plain_sleeper"), "10000"});  // ours: root-owned
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    auto r = run({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", commdbg_bin(), "attach",
                  std::to_string(sleeper.pid())},
                 {}, 30);
    ASSERT_NE(r.status, 126) << "nobody cannot execute " << commdbg_bin() << ": " << r.err;
    expect_one_clear_error(r, {"permission denied", "run as root"});
    // The target was left alone.
    EXPECT_EQ(proc_state(sleeper.pid()) == 'S' || proc_state(sleeper.pid()) == 'R', true);
}

TEST(BadInput, AttachZombie) {
    REQUIRE_BPF();
    Background z({testprog("plain_sleeper"), "0"});  // exits at once; not reaped until z.wait()
    ASSERT_TRUE(wait_proc_state(z.pid(), 'Z', 10000)) << "no zombie: state " << proc_state(z.pid());
    auto r = run({commdbg_bin(), "attach", std::to_string(z.pid()), "--duration", "2"}, {}, 30);
    expect_one_clear_error(r, {std::to_string(z.pid()), "exited"});
    EXPECT_EQ(z.wait(10).status, 0);
}

// The target exits during the attach window: a note that it exited, a report,
// status 0, and commdbg ends when the target does, not at the window's end.
TEST(BadInput, TargetExitsDuringWindow) {
    REQUIRE_BPF();
    TempDir tmp;
    Background t({testprog("plain_sleeper"), "700"});
    ASSERT_FALSE(t.wait_for_line("ready pid=").empty());
    auto start = std::chrono::steady_clock::now();
    auto r = run({commdbg_bin(), "attach", std::to_string(t.pid()), "--duration", "20", "--json", tmp.path("o.json")},
                 {}, 60);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("pid " + std::to_string(t.pid()) + " exited"), std::string::npos) << r.err;
    EXPECT_LT(secs, 10.0) << "commdbg did not notice the target's exit";
    auto j = read_json(tmp.path("o.json"));
    EXPECT_EQ(j["process"]["pid"].get<int>(), t.pid());
    EXPECT_EQ(j["total_counts"].get<int>(), 0);
}

TEST(BadInput, RunNonexistentCommand) {
    REQUIRE_BPF();
    auto r = run({commdbg_bin(), "run", "--", "/nonexistent/commdbg-e2e-no-such-cmd"}, {}, 30);
    EXPECT_EQ(r.status, 127);
    expect_one_clear_error(r, {"/nonexistent/commdbg-e2e-no-such-cmd", "cannot execute", "No such file",
                               "check the command name"});
}

}  // namespace
}  // namespace commdbg::e2e
