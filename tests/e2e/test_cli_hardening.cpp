// SPDX-License-Identifier: Apache-2.0
// What a careless user can do to `commdbg attach` / `commdbg run` (issue 13):
// outputs that are devices, FIFOs, symlinks or bad paths; SIGHUP from a
// dropped ssh session; a thread id for a pid; children forked while traced;
// durations that overflow; exit statuses; messages for bad numbers.  Every
// device these tests write to is a node they made in their own temp dir:
// never /dev/null or /dev/full themselves.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon_util.hpp"
#include "e2e_util.hpp"
#include "procfs.hpp"

namespace commdbg::e2e {
namespace {

using json = nlohmann::json;

const std::vector<std::pair<std::string, int>> kPattern = {{"all_reduce", 12}, {"broadcast", 5}};

std::vector<std::string> workload_argv(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
}

std::vector<std::string> run_argv(const std::vector<std::string>& opts, const std::vector<std::string>& command) {
    std::vector<std::string> argv = {commdbg_bin(), "run"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
}

// The workload's entry: the dump itself, or under "processes" when the
// command forked (a shell running dd first).
const json& workload_entry(const json& j) {
    if (!j.contains("processes")) return j;
    for (const auto& p : j["processes"])
        if (p["process"].value("command", "").find("nccl_workload") != std::string::npos) return p;
    return j;
}

void expect_pattern_counts(const json& j) {
    ASSERT_TRUE(j.contains("comm_counts")) << j.dump().substr(0, 500);
    for (const auto& [kind, n] : kPattern)
        EXPECT_EQ(j["comm_counts"].value("nccl." + kind, -1L), n) << kind << " in " << j["comm_counts"].dump();
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct stat stat_of(const std::string& path) {
    struct stat st {};
    lstat(path.c_str(), &st);
    return st;
}

bool alive(int pid) { return proc_state(pid) != 0 && proc_state(pid) != 'Z'; }

// A tmpfs of `kib` KiB at dir, unmounted (lazily) when the scope ends.
class SmallFs {
public:
    SmallFs(const std::string& dir, int kib) : dir_(dir) {
        mkdir(dir.c_str(), 0755);
        ok_ = mount("commdbg-test", dir.c_str(), "tmpfs", 0, ("size=" + std::to_string(kib) + "k").c_str()) == 0;
    }
    ~SmallFs() {
        if (ok_) umount2(dir_.c_str(), MNT_DETACH);
    }
    bool ok() const { return ok_; }

private:
    std::string dir_;
    bool ok_ = false;
};

// ---- 1. Outputs never replace what is not a regular file ---------------------

TEST(Outputs, DeviceNodeIsWrittenThroughAndStaysADevice) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string node = tmp.path("null");
    ASSERT_EQ(mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0) << strerror(errno);
    auto r = run(run_argv({"--json", node, "--table", tmp.path("table.txt")}, workload_argv()), nccl_env(false));
    EXPECT_EQ(r.status, 0) << r.err;
    struct stat st = stat_of(node);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << node << " is no longer a character device";
    EXPECT_EQ(st.st_rdev, makedev(1, 3));
}

TEST(Outputs, FullDeviceReportsNoSpaceAndTheDumpIsSavedElsewhere) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string node = tmp.path("full");
    ASSERT_EQ(mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 7)), 0) << strerror(errno);
    auto env = nccl_env(false);
    env["TMPDIR"] = tmp.path("");
    auto r = run(run_argv({"--json", node}, workload_argv()), env);
    EXPECT_NE(r.status, 0) << "a write that failed must not exit 0";
    EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
    struct stat st = stat_of(node);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << node << " is no longer a character device";
    // The dump is not lost: the message names where it went.
    auto at = r.err.find("saved it to ");
    ASSERT_NE(at, std::string::npos) << r.err;
    std::string saved = r.err.substr(at + 12);
    saved = saved.substr(0, saved.find(' '));
    ASSERT_EQ(saved.rfind(tmp.path(""), 0), 0u) << "not under $TMPDIR: " << saved;
    expect_pattern_counts(read_json(saved));
}

TEST(Outputs, FifoReaderGetsTheWholeDump) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string fifo = tmp.path("fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    // Opened before commdbg runs and non-blocking: the test never hangs on
    // a FIFO that commdbg did not open (or replaced).
    int rd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    ASSERT_GE(rd, 0);
    std::atomic<bool> ran{false};
    std::string got;
    std::thread reader([&] {
        char buf[65536];
        for (;;) {
            ssize_t n = read(rd, buf, sizeof(buf));
            if (n > 0) got.append(buf, static_cast<size_t>(n));
            else if (ran) break;  // no writer left and commdbg is done
            else std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    auto r = run(run_argv({"--json", fifo}, workload_argv()), nccl_env(false));
    ran = true;
    reader.join();
    close(rd);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(S_ISFIFO(stat_of(fifo).st_mode)) << "the FIFO was replaced";
    auto j = json::parse(got, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "the reader got no JSON: " << got.substr(0, 200);
    expect_pattern_counts(j);
}

TEST(Outputs, SymlinkStaysALinkAndItsTargetGetsTheDump) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string target = tmp.path("real.json"), link = tmp.path("link.json");
    { std::ofstream(target) << "old"; }
    ASSERT_EQ(symlink("real.json", link.c_str()), 0);
    auto r = run(run_argv({"--json", link}, workload_argv()), nccl_env(false));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(S_ISLNK(stat_of(link).st_mode)) << "the symlink was replaced by a file";
    expect_pattern_counts(read_json(target));
}

TEST(Outputs, SymlinkToOurStdoutWritesThroughIt) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string link = tmp.path("stdout-link");
    ASSERT_EQ(symlink("/proc/self/fd/1", link.c_str()), 0);
    auto r = run(run_argv({"--table", link}, workload_argv()), nccl_env(false));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(S_ISLNK(stat_of(link).st_mode)) << "the symlink was replaced by a file";
    // Once through the link, once as the table on stdout.
    size_t n = 0;
    for (size_t at = 0; (at = r.out.find("collectives (exact kernel counters)", at)) != std::string::npos; ++at) ++n;
    EXPECT_EQ(n, 2u) << r.out;
}

// ---- 10. Output problems are found before tracing starts ----------------------

// Each bad output: `run` refuses it before the command starts (the command
// would create MARKER) and names the option.
void expect_refused_up_front(const std::vector<std::string>& opts, const std::string& option, const std::string& what,
                             const TempDir& tmp) {
    const std::string marker = tmp.path("ran");
    auto r = run(run_argv(opts, {"/bin/sh", "-c", "touch " + marker}), nccl_env(false), 30);
    EXPECT_EQ(r.status, 2) << what << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(marker)) << what << ": the command ran although its output cannot be written";
    EXPECT_NE(r.err.find(option), std::string::npos) << what << ": the message does not name " << option << ": " << r.err;
    std::filesystem::remove(marker);
}

TEST(Outputs, BadOutputPathsAreRefusedBeforeTheCommandRuns) {
    REQUIRE_BPF();
    TempDir tmp;
    expect_refused_up_front({"--json", tmp.path("no-such-dir/out.json")}, "--json", "missing directory", tmp);
    expect_refused_up_front({"--json", tmp.path("")}, "--json", "a directory", tmp);
    expect_refused_up_front({"--trace", ""}, "--trace", "an empty name", tmp);
    expect_refused_up_front({"--json", tmp.path("same"), "--trace", tmp.path("same")}, "--trace", "the same path twice",
                            tmp);
    SmallFs small(tmp.path("small"), 64);
    ASSERT_TRUE(small.ok()) << "cannot mount a tmpfs: " << strerror(errno);
    // Fill it: the output could not be written after the window.
    auto fill = run({"/bin/sh", "-c", "dd if=/dev/zero of=" + tmp.path("small/fill") + " bs=4k 2>/dev/null; true"});
    expect_refused_up_front({"--json", tmp.path("small/out.json")}, "--json", "a full filesystem", tmp);
}

// Issue 21.3: with fs.protected_symlinks=0, uid 65534's link in a sticky
// directory must not make root's dump overwrite a root-owned file.
TEST(Outputs, AnotherUsersSymlinkInAStickyDirIsNotFollowedByRoot) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string pub = tmp.path("pub"), target = tmp.path("target"), link = pub + "/out.json";
    ASSERT_EQ(mkdir(pub.c_str(), 0777), 0);
    ASSERT_EQ(chmod(pub.c_str(), 01777), 0);  // as /tmp
    { std::ofstream(target) << "root's"; }
    ASSERT_EQ(chmod(target.c_str(), 0600), 0);
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
    ASSERT_EQ(lchown(link.c_str(), 65534, 65534), 0);
    expect_refused_up_front({"--json", link}, "--json", "another user's symlink in a sticky directory", tmp);
    auto r = run(run_argv({"--json", link}, {"/bin/true"}), nccl_env(false), 30);
    EXPECT_NE(r.err.find("refusing to follow a symlink owned by uid 65534 in the sticky directory " + pub),
              std::string::npos)
        << r.err;
    std::ifstream in(target);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "root's") << "the root-owned file was overwritten";
    EXPECT_EQ(stat_of(target).st_mode & 07777, 0600u);
}

TEST(Outputs, FilesystemFilledDuringTheWindowKeepsTheDumpElsewhere) {
    REQUIRE_BPF();
    TempDir tmp;
    SmallFs small(tmp.path("small"), 256);
    ASSERT_TRUE(small.ok()) << "cannot mount a tmpfs: " << strerror(errno);
    auto env = nccl_env(false);
    env["TMPDIR"] = tmp.path("");
    std::string cmd = "dd if=/dev/zero of=" + tmp.path("small/fill") + " bs=4k 2>/dev/null; exec";
    for (const auto& a : workload_argv()) cmd += " " + a;
    auto r = run(run_argv({"--json", tmp.path("small/out.json")}, {"/bin/sh", "-c", cmd}), env);
    EXPECT_EQ(r.status, 1) << r.err;
    auto at = r.err.find("saved it to ");
    ASSERT_NE(at, std::string::npos) << "the dump was lost: " << r.err;
    std::string saved = r.err.substr(at + 12);
    saved = saved.substr(0, saved.find(' '));
    expect_pattern_counts(workload_entry(read_json(saved)));
    EXPECT_FALSE(std::filesystem::exists(tmp.path("small/out.json")));
}

// ---- 4. SIGHUP (a dropped ssh session) ends the window like Ctrl-C -----------

TEST(Signals, SighupEndsAttachWithTheOutputsWritten) {
    REQUIRE_BPF();
    TempDir tmp;
    Background work(workload_argv({"--duration-ms", "30000", "--wait-file", tmp.path("go")}), nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty());
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "--json", tmp.path("out.json")});
    ASSERT_FALSE(dbg.wait_for_err_line("commdbg: tracing", 60).empty()) << dbg.wait(5).err;
    touch(tmp.path("go"));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_EQ(kill(dbg.pid(), SIGHUP), 0);
    auto d = dbg.wait(30);
    EXPECT_EQ(d.status, 0) << d.err;
    ASSERT_TRUE(std::filesystem::exists(tmp.path("out.json"))) << "no JSON after SIGHUP: " << d.err;
    auto j = read_json(tmp.path("out.json"));
    EXPECT_GT(j["comm_counts"].value("nccl.all_reduce", 0L), 0) << j["comm_counts"].dump();
    EXPECT_TRUE(alive(work.pid())) << "attach must leave the target running";
}

TEST(Signals, SighupEndsRunForwardedToTheCommandWithTheOutputsWritten) {
    REQUIRE_BPF();
    TempDir tmp;
    Background dbg(run_argv({"--json", tmp.path("out.json")},
                            workload_argv({"--duration-ms", "30000", "--wait-file", tmp.path("go")})),
                   nccl_env(false));
    int pid = pid_of_ready(dbg.wait_for_line("ready pid=", 60));
    ASSERT_GT(pid, 0);
    touch(tmp.path("go"));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_EQ(kill(dbg.pid(), SIGHUP), 0);
    auto d = dbg.wait(30);
    // run exits with the command's status: it got the SIGHUP too.
    EXPECT_EQ(d.status, 128 + SIGHUP) << d.err;
    EXPECT_TRUE(wait_gone_or_zombie(pid, 5000)) << "the command was left running untraced";
    ASSERT_TRUE(std::filesystem::exists(tmp.path("out.json"))) << "no JSON after SIGHUP: " << d.err;
    auto j = read_json(tmp.path("out.json"));
    EXPECT_GT(j["comm_counts"].value("nccl.all_reduce", 0L), 0) << j["comm_counts"].dump();
    EXPECT_EQ(j["process"].value("signal", 0), SIGHUP) << j["process"].dump();
}

// ---- 7. A thread id names its process -----------------------------------------

TEST(AttachThread, ThreadIdTracesItsProcessAndSaysSo) {
    REQUIRE_BPF();
    TempDir tmp;
    Background work(workload_argv({"--threads", "2", "--duration-ms", "30000"}), nccl_env(false));
    // A worker thread: any tid of the process but the process's own.
    int tid = -1;
    for (int i = 0; i < 200 && tid < 0; ++i) {
        if (DIR* d = opendir(("/proc/" + std::to_string(work.pid()) + "/task").c_str())) {
            while (dirent* e = readdir(d)) {
                int t = atoi(e->d_name);
                if (t > 0 && t != work.pid()) tid = t;
            }
            closedir(d);
        }
        if (tid < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GT(tid, 0) << "the workload started no thread";
    auto r = run({commdbg_bin(), "attach", std::to_string(tid), "--no-daemon", "-d", "1", "--json", tmp.path("out.json")},
                 {}, 60);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("is a thread"), std::string::npos) << r.err;
    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["process"].value("pid", 0), work.pid());
    EXPECT_GT(j["comm_counts"].value("nccl.all_reduce", 0L), 0) << "no calls seen: " << j["comm_counts"].dump();
}

// ---- 8. Children forked while traced ------------------------------------------

// nccl_workload --fork N waits in the parent; `commdbg attach PARENT ARGS`
// starts (its banner contains `banner`), then the parent forks N children
// that each make kPattern's calls.  The attach ends when the parent exits.
struct ForkedRun {
    int parent = 0;
    ProcResult attach;
    json dump;
};

ForkedRun attach_to_forking_parent(const TempDir& tmp, int children, const std::vector<std::string>& args,
                                   const std::string& banner = "commdbg: tracing") {
    ForkedRun out;
    Background work(workload_argv({"--fork", std::to_string(children), "--wait-file", tmp.path("go")}),
                    nccl_env(false));
    EXPECT_FALSE(work.wait_for_line("ready pid=").empty());
    out.parent = work.pid();
    std::vector<std::string> argv = {commdbg_bin(), "attach", std::to_string(work.pid()), "--json", tmp.path("out.json")};
    argv.insert(argv.end(), args.begin(), args.end());
    Background dbg(argv);
    if (dbg.wait_for_err_line(banner, 60).empty()) {
        out.attach = dbg.wait(5);
        ADD_FAILURE() << "attach never started: " << out.attach.err;
        return out;
    }
    touch(tmp.path("go"));
    out.attach = dbg.wait(60);
    if (std::filesystem::exists(tmp.path("out.json"))) out.dump = read_json(tmp.path("out.json"));
    return out;
}

// Every child in the dump, each with exactly the pattern's counts.
void expect_children_traced(const ForkedRun& r, int children) {
    ASSERT_EQ(r.attach.status, 0) << r.attach.err;
    ASSERT_TRUE(r.dump.contains("processes")) << "one process only: the children were not traced: "
                                              << r.dump.value("comm_counts", json()).dump();
    int seen = 0;
    for (const auto& p : r.dump["processes"]) {
        if (p["process"].value("pid", 0) == r.parent) continue;
        ++seen;
        expect_pattern_counts(p);
    }
    EXPECT_EQ(seen, children);
}

// No child in the dump, and a note for each.
void expect_children_noted(const ForkedRun& r, size_t children) {
    ASSERT_EQ(r.attach.status, 0) << r.attach.err;
    size_t notes = 0;
    for (size_t at = 0; (at = r.attach.err.find("which is not traced (--no-follow)", at)) != std::string::npos; ++at)
        ++notes;
    EXPECT_EQ(notes, children) << r.attach.err;
    EXPECT_FALSE(r.dump.contains("processes")) << r.dump.dump().substr(0, 300);
}

TEST(AttachChildren, ChildrenForkedDuringTheWindowAreTracedExactly) {
    REQUIRE_BPF();
    TempDir tmp;
    expect_children_traced(attach_to_forking_parent(tmp, 3, {"--no-daemon"}), 3);
}

TEST(AttachChildren, NoFollowNotesEveryChild) {
    REQUIRE_BPF();
    TempDir tmp;
    expect_children_noted(attach_to_forking_parent(tmp, 3, {"--no-daemon", "--no-follow"}), 3);
}

// commdbgd's session for --no-follow probes the parent alone (OwnCost.
// NoFollowProbesTheTracedProcessAlone): its children are noted as without it.
TEST(AttachChildren, ThroughTheDaemonNoFollowNotesEveryChild) {
    REQUIRE_BPF();
    using namespace daemon_util;
    SharedDir dir;
    START_DAEMON(d, dir);
    TempDir tmp;
    expect_children_noted(attach_to_forking_parent(tmp, 2, {"--socket", d.socket(), "--no-follow"}, "in commdbgd"),
                          2);
}

TEST(AttachChildren, ThroughTheDaemonChildrenAreTracedToo) {
    REQUIRE_BPF();
    using namespace daemon_util;
    SharedDir dir;
    START_DAEMON(d, dir);
    TempDir tmp;
    expect_children_traced(attach_to_forking_parent(tmp, 2, {"--socket", d.socket()}, "in commdbgd"), 2);
}

// ---- 9. Durations: finite, >= 0, capped -----------------------------------------

TEST(Durations, OverflowingNegativeOrNonFiniteDurationsAreRefusedUpFront) {
    REQUIRE_BPF();
    TempDir tmp;
    Background work(workload_argv({"--duration-ms", "30000"}), nccl_env(false));
    for (std::string d : {"9999999999", "1e10", "1e300", "nan", "inf", "-1", "3s"}) {
        auto r = run({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "-d", d}, {}, 30);
        EXPECT_EQ(r.status, 2) << "-d " << d << ": " << r.err;
        EXPECT_NE(r.err.find("--duration"), std::string::npos) << "-d " << d << ": " << r.err;
        EXPECT_EQ(r.err.find("commdbg: tracing"), std::string::npos) << "-d " << d << " started a window: " << r.err;
    }
    // A fraction of a second is a window, and the banner says it as given.
    auto r = run({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "-d", "0.5"}, {}, 30);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("for 0.5 s"), std::string::npos) << r.err;
}

// ---- 12. Exit statuses decoded ----------------------------------------------------

TEST(ExitCodes, ExitStatusAndKillingSignalAreReportedApart) {
    REQUIRE_BPF();
    TempDir tmp;
    auto r = run(run_argv({"--json", tmp.path("exit.json"), "--table", tmp.path("exit.txt")}, {"/bin/sh", "-c", "exit 3"}));
    EXPECT_EQ(r.status, 3) << r.err;
    auto j = read_json(tmp.path("exit.json"));
    EXPECT_EQ(j["process"]["exit_code"], 3) << j["process"].dump();
    EXPECT_FALSE(j["process"].contains("signal")) << j["process"].dump();
    EXPECT_NE(slurp(tmp.path("exit.txt")).find("exited with status 3"), std::string::npos) << slurp(tmp.path("exit.txt"));

    r = run(run_argv({"--json", tmp.path("kill.json"), "--table", tmp.path("kill.txt")},
                     {"/bin/sh", "-c", "kill -KILL $$"}));
    EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
    j = read_json(tmp.path("kill.json"));
    EXPECT_TRUE(j["process"]["exit_code"].is_null()) << j["process"].dump();
    EXPECT_EQ(j["process"].value("signal", 0), SIGKILL) << j["process"].dump();
    EXPECT_EQ(j["process"].value("signal_name", ""), "SIGKILL");
    EXPECT_NE(slurp(tmp.path("kill.txt")).find("killed by SIGKILL (signal 9)"), std::string::npos)
        << slurp(tmp.path("kill.txt"));
}

TEST(ExitCodes, AttachedProcessExitStatusComesFromTheKernelDecoded) {
    REQUIRE_BPF();
    TempDir tmp;
    ASSERT_EQ(mkfifo(tmp.path("fifo").c_str(), 0600), 0);
    Background work({"/bin/sh", "-c", "read x < " + tmp.path("fifo") + "; exit 9"});
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "--no-daemon", "--json", tmp.path("out.json")});
    ASSERT_FALSE(dbg.wait_for_err_line("commdbg: tracing", 60).empty()) << dbg.wait(5).err;
    {
        int fd = open(tmp.path("fifo").c_str(), O_WRONLY);
        ASSERT_GE(fd, 0);
        (void)!write(fd, "x\n", 2);
        close(fd);
    }
    auto d = dbg.wait(30);
    ASSERT_EQ(d.status, 0) << d.err;
    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["process"]["exit_code"], 9) << "exit(9) must read 9, not the wait status 2304: " << j["process"].dump();
    EXPECT_FALSE(j["process"].contains("signal"));
}

// ---- 14. Messages for bad numbers and spec paths -----------------------------------

TEST(Messages, BadNumbersNameTheRangeInWords) {
    REQUIRE_BPF();
    struct Case {
        std::vector<std::string> args;
        std::string option;
    };
    const std::vector<Case> cases = {
        {{"attach", "0"}, "pid"},
        {{"attach", "-1"}, "pid"},
        {{"attach", "1", "--max-records", "0"}, "--max-records"},
        {{"attach", "1", "--max-records", "-1"}, "--max-records"},
        {{"attach", "1", "--max-depth", "0"}, "--max-depth"},
        {{"attach", "1", "--max-depth", "-1"}, "--max-depth"},
        {{"attach", "1", "-d", "-1"}, "--duration"},
        {{"run", "--max-records", "0", "--", "true"}, "--max-records"},
        {{"counts", "--pid", "0"}, "--pid"},
        {{"counts", "--pid", "-1"}, "--pid"},
        {{"", "--max-series", "0"}, "--max-series"},  // commdbgd
    };
    for (const auto& c : cases) {
        std::vector<std::string> argv = {c.args[0].empty() ? commdbgd_bin() : commdbg_bin()};
        argv.insert(argv.end(), c.args.begin() + (c.args[0].empty() ? 1 : 0), c.args.end());
        auto r = run(argv, {}, 30);
        std::string line = r.err.substr(0, r.err.find('\n'));
        EXPECT_EQ(r.status, 2) << c.args[1] << ": " << r.err;
        EXPECT_NE(line.find(c.option), std::string::npos) << line;
        EXPECT_EQ(line.find("e+308"), std::string::npos) << "a double's range: " << line;
        EXPECT_LT(line.size(), 120u) << line;
    }
}

// Root refused by the kernel (here: pid 1 of a sandboxed VM) is not told to run as root.
TEST(Messages, AttachRefusedToRootSaysWhyNotRunAsRoot) {
    REQUIRE_BPF();
    if (geteuid() != 0 || !host::own_creds().cap_sys_ptrace) GTEST_SKIP() << "needs root with CAP_SYS_PTRACE";
    if (std::ifstream("/proc/1/maps").good()) GTEST_SKIP() << "pid 1's maps are readable here: nothing refuses root";
    auto r = run({commdbg_bin(), "attach", "1", "--no-daemon", "-d", "1"}, {}, 30);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("permission denied reading /proc/1/maps"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a security policy protects this process"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("run as root"), std::string::npos) << r.err;
}

TEST(Messages, ProbesDirectoryUsesTheSpecsInIt) {
    REQUIRE_BPF();
    TempDir tmp;
    std::filesystem::create_directory(tmp.path("specs"));
    std::filesystem::copy_file(SOURCE_DIR "/specs/nccl.json", tmp.path("specs/nccl.json"));
    auto r = run(run_argv({"--probes", tmp.path("specs"), "--json", tmp.path("out.json")}, workload_argv()),
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    expect_pattern_counts(read_json(tmp.path("out.json")));
    EXPECT_EQ(r.err.find("not valid JSON"), std::string::npos) << r.err;

    std::filesystem::create_directory(tmp.path("empty"));
    r = run(run_argv({"--probes", tmp.path("empty")}, {"true"}), {}, 30);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("no *.json spec file"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("not valid JSON"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace commdbg::e2e
