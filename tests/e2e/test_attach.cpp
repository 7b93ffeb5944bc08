// SPDX-License-Identifier: Apache-2.0
// Acceptance: attach to a process that already mapped libnccl counts exactly
// the calls made after the attach, and none from before; `run` counts calls
// made at once at program start and at once after a dlopen; attach to a
// process that never maps libnccl says so plainly.  A `run` of a command
// chrooted into a root with its own loader counts its dlopened calls too.
#include <gtest/gtest.h>

#include <regex>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// Distinct counts per kind so a swapped or merged kind shows.
const std::vector<std::pair<std::string, int>> kPattern = {
    {"all_reduce", 13}, {"broadcast", 7}, {"all_gather", 5}, {"send", 3}, {"recv", 2},
};



int count_of(const nlohmann::json& j, const std::string& kind) {
    const auto& c = j["comm_counts"];
    std::string key = "nccl." + kind;
    return c.contains(key) ? c[key].get<int>() : 0;
}

void expect_counts_exactly(const nlohmann::json& j, const std::vector<std::pair<std::string, int>>& pattern) {
    ASSERT_TRUE(j.contains("comm_counts")) << j.dump(2);
    int total = 0;
    for (const auto& [kind, n] : pattern) {
        EXPECT_EQ(count_of(j, kind), n) << kind << " in " << j["comm_counts"].dump();
        total += n;
    }
    EXPECT_EQ(j["comm_counts"].size(), pattern.size()) << "unexpected kinds: " << j["comm_counts"].dump();
    EXPECT_EQ(j["total_counts"].get<int>(), total);
}




// --- (a) attach to a process that already mapped libnccl --------------------

class AttachCounts : public ::testing::TestWithParam<bool> {};

// The workload (nccl_workload with `wmore`) maps libnccl, says ready, and
// waits; `commdbg attach` (with `more`) then lets it run: every call it makes
// comes after the attach, so the counts are exactly its pattern.  `ready`
// looks at the waiting workload first; `dbg_err` gets commdbg's stderr.
// Returns the workload's own report.
nlohmann::json attach_then_go(const std::vector<std::string>& wmore, bool real, const std::vector<std::string>& more,
                              const std::function<void(int pid)>& ready = {}, std::string* dbg_err = nullptr) {
    TempDir tmp;
    std::vector<std::string> wargv = {testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--wait-file",
                                      tmp.path("go")};
    wargv.insert(wargv.end(), wmore.begin(), wmore.end());
    Background work(wargv, nccl_env(real));
    std::string line = work.wait_for_line("ready pid=");
    EXPECT_FALSE(line.empty()) << "workload never got ready";
    EXPECT_EQ(pid_of_ready(line), work.pid());
    if (line.empty()) return {};
    if (ready) ready(work.pid());
    if (::testing::Test::HasFatalFailure()) return {};

    std::vector<std::string> argv = {commdbg_bin(), "attach", std::to_string(work.pid()), "--json",
                                     tmp.path("out.json")};
    argv.insert(argv.end(), more.begin(), more.end());
    Background dbg(argv);
    std::string tracing;
    if (auto traced = wait_tracing(dbg, &tracing); !traced) {
        ADD_FAILURE() << traced.message();
        return {};
    }
    EXPECT_NE(tracing.find("1 library file(s) probed"), std::string::npos) << tracing;
    touch(tmp.path("go"));

    auto w = work.wait(60);
    EXPECT_EQ(w.status, 0) << w.err;
    auto d = dbg.wait(60);  // ends by itself once the target exits
    EXPECT_EQ(d.status, 0) << d.err;
    EXPECT_NE(d.err.find("exited"), std::string::npos) << d.err;
    if (dbg_err) *dbg_err = d.err;

    expect_counts_exactly(read_json(tmp.path("out.json")), kPattern);
    auto rep = workload_report(w.out);
    EXPECT_TRUE(rep.is_object()) << w.out;
    if (rep.is_object())
        for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<int>(), n) << kind;
    return rep;
}

TEST_P(AttachCounts, CallsAfterAttachCountedExactly) {
    REQUIRE_BPF();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    // real: NULL comm, every call errs at once (still counted)
    auto rep = attach_then_go(real ? std::vector<std::string>{} : std::vector<std::string>{"--fake-comm"}, real, {});
    if (real && rep.is_object()) {
        EXPECT_GT(rep["errors"].get<int>(), 0) << "real NCCL with a NULL comm should reject the calls";
    }
}

// Calls of one round in the workload's order: "ar bc ar bc ar" (round-robin
// over the kinds given to --calls, skipping those used up).
std::vector<int> round_order(int ar, int bc) {
    std::vector<int> order;  // 0: all_reduce, 1: broadcast
    for (int a = 0, b = 0; a < ar || b < bc;) {
        if (a < ar) order.push_back(0), ++a;
        if (b < bc) order.push_back(1), ++b;
    }
    return order;
}

// Whether (ar, bc) is what a contiguous run of calls counts: the tail of one
// round, whole rounds, the head of another; at most one partial round at
// each edge, for both kinds at once.
bool contiguous_window(long ar, long bc, int kar, int kbc) {
    const auto order = round_order(kar, kbc);
    const int len = static_cast<int>(order.size());
    for (int tail = 0; tail < len; ++tail) {
        for (int head = 0; head < len; ++head) {
            long a = ar, b = bc;
            for (int i = len - tail; i < len; ++i) (order[i] ? b : a) -= 1;
            for (int i = 0; i < head; ++i) (order[i] ? b : a) -= 1;
            if (a >= 0 && b >= 0 && a % kar == 0 && b % kbc == 0 && a / kar == b / kbc) return true;
        }
    }
    return false;
}

// The workload calls continuously for 3 s; we attach for 0.5 s in the middle.
// Counted calls must be > 0 but well under what it made in all, and they must
// be one contiguous slice of its calls for every symbol at once: the window
// opens and closes at one instant, not per function as the kernel arms the
// uprobes of a uprobe_multi link one after another.
TEST(AttachWindow, CallsBeforeAttachAreNotCounted) {
    REQUIRE_BPF();
    TempDir tmp;
    constexpr int kAr = 3, kBc = 2;
    Background work({testprog("nccl_workload"), "--calls",
                     "all_reduce=" + std::to_string(kAr) + ",broadcast=" + std::to_string(kBc), "--duration-ms", "3000",
                     "--fake-comm", "--wait-file", tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty());
    touch(tmp.path("go"));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // calls before the attach

    auto d = run({commdbg_bin(), "attach", std::to_string(work.pid()), "--duration", "0.5", "--counts-only",
                  "--no-daemon", "--json", tmp.path("out.json")});
    ASSERT_EQ(d.status, 0) << d.err;
    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err;
    auto rep = workload_report(w.out);
    ASSERT_TRUE(rep.is_object()) << w.out;
    long rounds = rep["rounds"].get<long>();
    ASSERT_GT(rounds, 0);
    ASSERT_EQ(rep["calls"]["all_reduce"].get<long>(), kAr * rounds);

    auto j = read_json(tmp.path("out.json"));
    long ar = count_of(j, "all_reduce"), bc = count_of(j, "broadcast");
    EXPECT_GT(ar, 0);
    EXPECT_GT(bc, 0);
    EXPECT_EQ(j["total_counts"].get<long>(), ar + bc);
    // Calls ran ~0.4 s before and ~2 s after a 0.5 s window, faster without
    // probes than with them: the window saw well under half of them.
    EXPECT_LT(ar, kAr * rounds / 2) << "counted " << ar << " of " << kAr * rounds << " all_reduce calls";
    EXPECT_LT(bc, kBc * rounds / 2) << "counted " << bc << " of " << kBc * rounds << " broadcast calls";
    EXPECT_TRUE(contiguous_window(ar, bc, kAr, kBc))
        << "all_reduce=" << ar << " broadcast=" << bc << ": not a contiguous window of rounds";
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, AttachCounts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

// --- (b) run: calls at once at start, and at once after a dlopen ------------

class RunImmediateCalls : public ::testing::TestWithParam<bool> {};

TEST_P(RunImmediateCalls, LinkedLibraryCallsFromFirstInstructionCountedExactly) {
    REQUIRE_BPF();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--json", tmp.path("out.json"), "--",
                                     testprog("nccl_workload"), "--calls", pattern_arg(kPattern)};
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv, nccl_env(real));
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    expect_counts_exactly(j, kPattern);
    ASSERT_EQ(j["process"]["libraries"].size(), 1u) << j["process"].dump();
    EXPECT_NE(j["process"]["libraries"][0].get<std::string>().find("libnccl.so"), std::string::npos);
}

TEST_P(RunImmediateCalls, CallsRightAfterDlopenCountedExactly) {
    REQUIRE_BPF();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    TempDir tmp;
    // nccl_workload_dl has no link-time NCCL: libnccl appears only at the
    // dlopen, and the first call follows it immediately.  The loader stops
    // the process twice for it: before the mapping (RT_ADD, nothing to scan:
    // --cost counts it) and after (scanned and attached).
    std::vector<std::string> argv = {commdbg_bin(), "run", "--cost", "--json", tmp.path("out.json"), "--",
                                     testprog("nccl_workload_dl"), "--dlopen", lib_path(real), "--calls",
                                     pattern_arg(kPattern)};
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv);  // no LD_LIBRARY_PATH: the dlopen names the file
    ASSERT_EQ(r.status, 0) << r.err;
    auto rep = workload_report(r.out);
    ASSERT_TRUE(rep.is_object()) << r.out;
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<int>(), n) << kind;
    auto j = read_json(tmp.path("out.json"));
    expect_counts_exactly(j, kPattern);
    ASSERT_EQ(j["process"]["libraries"].size(), 1u) << j["process"].dump();
    EXPECT_NE(j["process"]["libraries"][0].get<std::string>().find("libnccl.so"), std::string::npos);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, std::regex("; ([0-9]+) loader stops before a mapping needed none")))
        << r.err;
    EXPECT_GE(std::stoi(m[1]), 1) << r.err;
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, RunImmediateCalls, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

// --- (b') run of a containerised command: another root, another loader -------

// Puts host file `from` at `root`/`to` and, at their own paths, the
// libraries and loader ldd says it needs.  Copies, so that the root's
// loader is a file of its own as a container's is; `link`: a hard link
// where it can be (the real libnccl is 200 MB), its inode does not matter.
::testing::AssertionResult put_in_root(const std::string& root, const std::string& from, const std::string& to,
                                       bool link = false) {
    namespace fs = std::filesystem;
    auto place = [&](const std::string& src, const std::string& dst, bool hard) {
        fs::path d = root + dst;
        fs::create_directories(d.parent_path());
        if (fs::exists(d)) return;
        std::error_code ec;
        if (hard) fs::create_hard_link(fs::canonical(src), d, ec);
        if (!hard || ec) fs::copy_file(src, d);  // follows a symlinked source
    };
    place(from, to, link);
    auto ldd = run({"ldd", from});
    if (ldd.status != 0) return ::testing::AssertionFailure() << "ldd " << from << ": " << ldd.err;
    std::istringstream lines(ldd.out);
    for (std::string tok; lines >> tok;)
        if (tok[0] == '/') place(tok, tok, false);
    return ::testing::AssertionSuccess();
}

class RunContainerised : public ::testing::TestWithParam<bool> {};

// `chroot ROOT prog` execs prog under ROOT's own ld.so, a file no probe was
// on: its dlopen of libnccl went unseen and the run counted nothing (issue
// 21, point 9).  The exec must bring the new loader's probe, before the
// image runs, so that every call after the dlopen counts.
TEST_P(RunContainerised, CallsAfterDlopenUnderTheRootsOwnLoaderCountedExactly) {
    REQUIRE_BPF();
    bool real = GetParam();
    if (real) REQUIRE_REAL_NCCL();
    const std::string chroot_bin = "/usr/sbin/chroot";
    REQUIRE_OR_SKIP(std::filesystem::exists(chroot_bin), "no " + chroot_bin);
    TempDir tmp;
    const std::string root = tmp.path("root");
    ASSERT_TRUE(put_in_root(root, testprog("nccl_workload_dl"), "/opt/bin/nccl_workload_dl"));
    ASSERT_TRUE(put_in_root(root, lib_path(real), "/opt/nccl/libnccl.so.2", /*link=*/true));
    struct stat host_ld {}, root_ld {};
    ASSERT_EQ(stat("/lib64/ld-linux-x86-64.so.2", &host_ld), 0);
    ASSERT_EQ(stat((root + "/lib64/ld-linux-x86-64.so.2").c_str(), &root_ld), 0) << "the root has no loader";
    ASSERT_NE(host_ld.st_ino, root_ld.st_ino) << "the root's loader must be a file of its own";

    std::vector<std::string> argv = {commdbg_bin(), "run", "--json", tmp.path("out.json"), "--", chroot_bin, root,
                                     "/opt/bin/nccl_workload_dl", "--dlopen", "/opt/nccl/libnccl.so.2", "--calls",
                                     pattern_arg(kPattern)};
    if (!real) argv.push_back("--fake-comm");
    auto r = run(argv);
    ASSERT_EQ(r.status, 0) << r.err;
    auto rep = workload_report(r.out);
    ASSERT_TRUE(rep.is_object()) << r.out;
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<int>(), n) << kind;
    auto j = read_json(tmp.path("out.json"));
    expect_counts_exactly(j, kPattern);
    EXPECT_EQ(r.err.find("never mapped"), std::string::npos) << r.err;
    ASSERT_EQ(j["process"]["libraries"].size(), 1u) << j["process"].dump();
    EXPECT_NE(j["process"]["libraries"][0].get<std::string>().find("/opt/nccl/libnccl.so.2"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(StubAndReal, RunContainerised, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "RealNccl" : "StubNccl"; });

// --- (c) a process that never maps libnccl -----------------------------------

TEST(AttachNoNccl, SaysThePidNeverMappedLibnccl) {
    REQUIRE_BPF();
    TempDir tmp;
    Background sleeper({testprog("plain_sleeper"), "3000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    auto r = run({commdbg_bin(), "attach", std::to_string(sleeper.pid()), "--duration", "1", "--json",
                  tmp.path("out.json")});
    ASSERT_EQ(r.status, 0) << r.err;
    std::string all = r.out + r.err;
    size_t at = all.find("never mapped");
    ASSERT_NE(at, std::string::npos) << "no plain 'never mapped' statement in:\n" << all;
    // The statement names the pid and the library.
    size_t bol = all.rfind('\n', at);
    std::string line = all.substr(bol == std::string::npos ? 0 : bol + 1);
    line = line.substr(0, line.find('\n'));
    EXPECT_NE(line.find(std::to_string(sleeper.pid())), std::string::npos) << line;
    EXPECT_NE(line.find("libnccl"), std::string::npos) << line;
    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["total_counts"].get<int>(), 0);
    EXPECT_TRUE(j["process"]["libraries"].empty()) << j["process"].dump();
    // It is still alive: the attach did not disturb it.
    EXPECT_NE(proc_state(sleeper.pid()), 0);
    EXPECT_NE(proc_state(sleeper.pid()), 'Z');
}

// Attaching to a thread that calls NCCL in a tight loop: every call of the
// window is paired with its return.  Each call fails (the stub's NULL comm),
// and the error is counted at the return: the kernel counters must say
// errors == calls, with no in-flight losses.  (Entry probes attached before
// return probes left each call made in between without its return and the
// thread's in-flight stack one deeper; full within a millisecond, it lost
// returns: 50-100 errors short per half-second attach.)
TEST(AttachHotLoop, EveryCallIsPairedWithItsReturn) {
    REQUIRE_BPF();
    TempDir tmp;
    for (int attempt = 0; attempt < 3; ++attempt) {
        SCOPED_TRACE("attach " + std::to_string(attempt));
        Background work({testprog("nccl_workload"), "--calls", "all_reduce=1000", "--duration-ms", "20000"},
                        nccl_env(false));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto r = run({commdbg_bin(), "attach", std::to_string(work.pid()), "-d", "0.5", "--no-daemon",
                      "--counts-only", "--json", tmp.path("out.json")});
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.err.find("inflight_too_deep"), std::string::npos) << r.err;
        auto j = read_json(tmp.path("out.json"));
        long calls = 0, errors = 0;
        for (const auto& c : j["counters"]) {
            if (c.value("name", "") != "ncclAllReduce") continue;
            calls += c["calls"].get<long>();
            errors += c["errors"].get<long>();
        }
        EXPECT_GT(calls, 1000) << "the loop should be hot";
        // A call in flight at either end of the window may miss its return.
        EXPECT_GE(errors, calls - 2) << "returns lost: " << calls << " calls, " << errors << " errors";
        EXPECT_LE(errors, calls);
        kill(work.pid(), SIGKILL);
    }
}

// --- (d) a process whose main thread has exited while others run on --------

// The kernel keeps such a main thread a zombie without memory: /proc/PID/stat
// says Z, /proc/PID/maps reads empty, process_vm_readv(PID) fails; the
// process still runs and calls NCCL from its other threads.  Refused as "a
// zombie" and unseen through its maps before; traced through a live thread
// now.  With --no-follow the kernel's per-process filter, which keys on the
// main thread's memory, would match nothing: the session says so and probes
// as without it.
class MainThreadExited : public ::testing::TestWithParam<bool> {};

TEST_P(MainThreadExited, AttachCountsItsOtherThreadsCallsExactly) {
    REQUIRE_BPF();
    const bool no_follow = GetParam();
    std::vector<std::string> more = {"--no-daemon"};
    if (no_follow) more.push_back("--no-follow");
    std::string err;
    attach_then_go({"--main-exits", "--threads", "2", "--fake-comm"}, false, more, [](int pid) {
        ASSERT_EQ(proc_state(pid), 'Z') << "the main thread has not exited: the test would test nothing";
    }, &err);
    if (no_follow) {
        EXPECT_NE(err.find("its main thread has exited"), std::string::npos) << err;
    }
}

INSTANTIATE_TEST_SUITE_P(FollowAndNoFollow, MainThreadExited, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "NoFollow" : "Follow"; });

// The library comes after the main thread exited: `run` stops the process at
// the dlopen and must find the new mapping through a live thread's maps (the
// main thread's read empty: "never mapped a library", nothing counted).
TEST(MainThreadExitedRun, ALibraryDlopenedAfterwardsIsProbedBeforeItsFirstCall) {
    REQUIRE_BPF();
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--json", tmp.path("out.json"), "--", testprog("nccl_workload_dl"),
                  "--main-exits", "--dlopen", lib_path(false), "--calls", pattern_arg(kPattern), "--fake-comm"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err.find("never mapped"), std::string::npos) << r.err;
    auto j = read_json(tmp.path("out.json"));
    expect_counts_exactly(j, kPattern);
    ASSERT_EQ(j["process"]["libraries"].size(), 1u) << j["process"].dump();
}

}  // namespace
}  // namespace commdbg::e2e
