// SPDX-License-Identifier: Apache-2.0
// commdbgd under pressure from its clients (issue 13): the same session
// defaults and limits with or without the daemon; per-uid limits for users
// other than root (sessions, ring buffer, record budget, window); control
// connections that one user cannot exhaust, with a deadline for a whole
// request; sessions whose client stops reading end; a window cut short by
// the daemon's shutdown says so; messages in the CLI's own words; /metrics
// keeps answering scrapes while idle or trickling connections are held open.
#include <grp.h>

#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace daemon_limit_tests {
namespace {

using namespace daemon_util;

// Connections to the control socket held by a child running as uid 65534.
// Each sends `request` (when not empty); with read_first the child reads the
// first reply line of each and hands those lines to the test, then never
// reads again.  The connections stay open until the object goes.
class NobodyConnections {
public:
    NobodyConnections(const std::string& socket, int n, const std::string& request, bool read_first) {
        int report[2], hold[2];
        if (pipe2(report, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
        pid_ = fork();
        if (pid_ == 0) {
            close(report[0]);
            close(hold[1]);
            if (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
                setresuid(kNobody, kNobody, kNobody) != 0)
                _exit(2);
            std::vector<int> fds;
            for (int i = 0; i < n; ++i) {
                int fd = connect_unix(socket);
                if (fd < 0) continue;
                if (!request.empty()) send_bytes(fd, request);
                fds.push_back(fd);
            }
            if (read_first)
                for (int fd : fds) {
                    std::string line;
                    char c;
                    while (line.size() < 65536) {
                        pollfd p{fd, POLLIN, 0};
                        if (poll(&p, 1, 60000) <= 0 || recv(fd, &c, 1, 0) != 1) break;
                        line += c;
                        if (c == '\n') break;
                    }
                    if (line.empty() || line.back() != '\n') line += "(no reply)\n";
                    (void)!write(report[1], line.data(), line.size());
                }
            std::string opened = "opened " + std::to_string(fds.size()) + "\n";
            (void)!write(report[1], opened.data(), opened.size());
            close(report[1]);
            char b;
            (void)!read(hold[0], &b, 1);  // until the test lets go
            _exit(0);
        }
        close(report[1]);
        close(hold[0]);
        hold_ = hold[1];
        auto deadline = Clock::now() + std::chrono::seconds(120);
        char buf[4096];
        while (Clock::now() < deadline) {
            pollfd p{report[0], POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            ssize_t got = read(report[0], buf, sizeof(buf));
            if (got <= 0) break;
            report_.append(buf, static_cast<size_t>(got));
            if (report_.find("opened ") != std::string::npos && report_.back() == '\n') break;
        }
        close(report[0]);
    }
    ~NobodyConnections() {
        if (hold_ >= 0) close(hold_);
        for (int i = 0; i < 100; ++i) {
            if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
            sleep_ms(50);
        }
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    NobodyConnections(const NobodyConnections&) = delete;
    NobodyConnections& operator=(const NobodyConnections&) = delete;

    // The first reply line of each connection (read_first), parsed.
    std::vector<json> first_lines() const {
        std::vector<json> out;
        for (const auto& j : reply_lines(report_))
            if (j.is_object()) out.push_back(j);
        return out;
    }
    const std::string& report() const { return report_; }

private:
    int pid_ = -1;
    int hold_ = -1;
    std::string report_;
};

std::string attach_request(int pid, double duration_s, const std::string& extra = "") {
    std::ostringstream s;
    s << R"({"op":"attach","pid":)" << pid << R"(,"duration_s":)" << duration_s << extra << "}\n";
    return s.str();
}

json sessions_of(const Daemon& d) { return cli_json({"sessions", "--socket", d.socket()}).value("sessions", json::array()); }

size_t count_of(const std::string& s, const std::string& needle) {
    size_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
}

// ======================================================================================
// Finding 3: `commdbg attach PID` without -d (and with a long -d) through the daemon.
// ======================================================================================

// A window that is tracing a workload held at its --wait-file: lets the
// workload make its calls, and checks that both end well and the dump counted
// exactly kPattern.
void release_and_check_window(Background& work, Background& dbg, const std::string& go, const std::string& json) {
    touch(go);
    ASSERT_EQ(work.wait(60).status, 0);
    auto r = dbg.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(comm_counts_of(read_json(json)), expected_map(kPattern, "nccl."));
}

// No -d means "until Ctrl-C or the process exits", with or without the daemon.
TEST(DaemonLimits, AttachWithoutDurationRunsUntilTheProcessExits) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file",
                     tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "--json", tmp.path("out.json"), "--socket",
                    d.socket()});
    std::string tracing = dbg.wait_for_err_line("commdbg: tracing", 60);
    if (tracing.empty()) {
        auto r = dbg.wait(5);
        FAIL() << "commdbg attach (no -d) never traced; status " << r.status << " stderr: " << r.err;
    }
    EXPECT_NE(tracing.find("in commdbgd"), std::string::npos) << tracing;
    ASSERT_NO_FATAL_FAILURE(release_and_check_window(work, dbg, tmp.path("go"), tmp.path("out.json")));
}

// A window longer than a day is as valid through the daemon as without it.
TEST(DaemonLimits, AttachWithADurationOverADayIsAcceptedAsWithoutTheDaemon) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file",
                     tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";
    Background dbg({commdbg_bin(), "attach", std::to_string(work.pid()), "-d", "100000", "--json",
                    tmp.path("out.json"), "--socket", d.socket()});
    std::string tracing = dbg.wait_for_err_line("commdbg: tracing", 60);
    if (tracing.empty()) {
        auto r = dbg.wait(5);
        FAIL() << "commdbg attach -d 100000 never traced; status " << r.status << " stderr: " << r.err;
    }
    ASSERT_NO_FATAL_FAILURE(release_and_check_window(work, dbg, tmp.path("go"), tmp.path("out.json")));
}

// ======================================================================================
// Finding 5: no user can lock everyone out of the 0666 control socket.
// ======================================================================================

// 64 idle connections of uid 65534: root still gets its answer, and uid
// 65534's own next connection is refused with the per-user limit named.
TEST(DaemonLimits, IdleConnectionsOfOneUserDoNotLockOutRootOrOtherRequests) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    NobodyConnections hog(d.socket(), 64, "", false);
    ASSERT_NE(hog.report().find("opened "), std::string::npos) << hog.report();

    auto root = cli({"status", "--socket", d.socket()});
    EXPECT_EQ(root.status, 0) << "root's status with 64 idle connections of uid 65534 held: " << root.err;
    auto theirs = cli_as_nobody(bins, {"status", "--socket", d.socket()});
    EXPECT_NE(theirs.status, 0) << theirs.out;
    EXPECT_NE(theirs.err.find("uid 65534"), std::string::npos) << theirs.err;
    EXPECT_NE(theirs.err.find("connections"), std::string::npos) << theirs.err;
}

// A request trickled in one byte at a time is cut off at the request
// deadline; resetting an idle timer with every byte would hold the
// connection (and its thread) for ever.
TEST(DaemonLimits, TrickledRequestIsCutOffAtTheRequestDeadline) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    int fd = connect_unix(d.socket());
    ASSERT_GE(fd, 0);
    send_bytes(fd, "{");
    Reply got;
    // 24 spaces, one every 500 ms (12 s): never a complete line.
    for (int i = 0; i < 24 && !got.closed; ++i) {
        Reply r = read_reply(fd, 1, 500);
        got.data += r.data;
        got.closed = r.closed;
        if (!got.closed) send_bytes(fd, " ");
    }
    close(fd);
    EXPECT_TRUE(got.closed) << "the daemon still held a trickled request after 12 s";
    EXPECT_NE(got.data.find("timed out"), std::string::npos) << got.data;
}

// Four clients of uid 65534 that send attach and never read on cannot take
// every session slot: a user runs at most its share, root can still attach,
// `commdbg sessions` lists what holds the slots, and the refusal says why.
TEST(DaemonLimits, ClientsThatNeverReadCannotHoldEverySessionSlot) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);  // --max-sessions 4
    auto bins = nobody_bins();
    Background sleeper(concat(kAsNobody, {bins.sleeper, "120000"}));
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty()) << "sleeper (uid 65534) never got ready";

    NobodyConnections hog(d.socket(), 4, attach_request(sleeper.pid(), 120), true);
    auto firsts = hog.first_lines();
    ASSERT_EQ(firsts.size(), 4u) << hog.report();
    size_t tracing = 0;
    std::string refusal;
    for (const auto& j : firsts) {
        if (j.value("state", "") == "tracing") ++tracing;
        else refusal = j.value("error", "");
    }
    EXPECT_LE(tracing, 2u) << "uid 65534 holds " << tracing << " of 4 session slots:\n" << hog.report();
    EXPECT_NE(refusal.find("uid 65534"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("commdbg detach"), std::string::npos) << refusal;

    // What holds the slots is listed, with its owner and state.
    auto list = sessions_of(d);
    EXPECT_EQ(list.size(), tracing) << list.dump();
    for (const auto& s : list) {
        EXPECT_EQ(s.value("uid", 0u), kNobody) << s.dump();
        EXPECT_EQ(s.value("state", ""), "tracing") << s.dump();
    }
    // Root still traces (here: uid 65534's sleeper).
    auto r = cli({"attach", std::to_string(sleeper.pid()), "-d", "1", "--json", tmp.path("root.json"), "--socket",
                  d.socket()});
    EXPECT_EQ(r.status, 0) << r.err;
}

// A client that stops reading while its outputs are sent does not hold the
// slot for ever: its session ends, and until it does `commdbg sessions`
// lists it.
TEST(DaemonLimits, ASessionWhoseClientStopsReadingEndsAndFreesItsSlot) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--max-sessions", "1"});
    // 4000 records: megabytes of outputs, far past what the socket buffers hold.
    Background work({testprog("nccl_workload"), "--calls", "all_reduce=4000", "--fake-comm", "--wait-file",
                     tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";
    int stuck = connect_unix(d.socket());
    send_bytes(stuck, attach_request(work.pid(), 60, R"(,"outputs":["json","trace"])"));
    auto first = reply_lines(read_reply(stuck, 1, 30000).data);
    ASSERT_EQ(first.size(), 1u);
    ASSERT_EQ(first[0].value("state", ""), "tracing") << first[0].dump();
    touch(tmp.path("go"));
    ASSERT_EQ(work.wait(60).status, 0);
    // From here on `stuck` is never read.

    Background sleeper({testprog("plain_sleeper"), "120000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    bool freed = false, unlisted_while_held = false;
    std::string last;
    for (int i = 0; i < 120 && !freed; ++i) {  // ~60 s at most
        int c = connect_unix(d.socket());
        send_bytes(c, attach_request(sleeper.pid(), 1));
        auto lines = reply_lines(read_reply(c, 1, 30000).data);
        close(c);
        last = lines.empty() ? "(no reply)" : lines[0].dump();
        if (!lines.empty() && lines[0].value("state", "") == "tracing") {
            freed = true;
            break;
        }
        if (sessions_of(d).empty()) unlisted_while_held = true;
        sleep_ms(500);
    }
    close(stuck);
    EXPECT_TRUE(freed) << "the slot stayed taken by a client that stopped reading; last reply: " << last;
    EXPECT_FALSE(unlisted_while_held) << "a session held the only slot while `commdbg sessions` listed none";
}

// ======================================================================================
// Finding 6: users other than root cannot size the root daemon's memory.
// ======================================================================================

TEST(DaemonLimits, UnprivilegedSessionsAreHeldToThePerUserLimits) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    Background work(
        nobody_workload(bins, {"--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file", tmp.path("go")}),
        nobody_env(bins));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload (uid 65534) never got ready";
    const std::string pid = std::to_string(work.pid());
    auto attach = [&](const std::vector<std::string>& opts) {
        return cli_as_nobody(bins, concat(concat({"attach", pid, "--socket", d.socket()}, opts),
                                          {"--json", tmp.path("out.json")}),
                             15);
    };
    auto ring = attach({"-d", "1", "--ringbuf-kb", "1048576"});
    EXPECT_NE(ring.status, 0);
    EXPECT_NE(ring.err.find("--ringbuf-kb 1048576 is over the 65536 KiB allowed to uid 65534"), std::string::npos)
        << ring.err;
    auto records = attach({"-d", "1", "--max-records", "20000000"});
    EXPECT_NE(records.status, 0);
    EXPECT_NE(records.err.find("--max-records 20000000 is over the 200000 allowed to uid 65534"), std::string::npos)
        << records.err;
    auto window = attach({"-d", "7200"});
    EXPECT_NE(window.status, 0);
    EXPECT_NE(window.err.find("--duration 7200 s is over the 3600 s allowed to uid 65534"), std::string::npos)
        << window.err;
    EXPECT_FALSE(std::filesystem::exists(tmp.path("out.json")));

    // The limits are stated by `commdbg status`.
    auto st = cli_json({"status", "--socket", d.socket()});
    const json lim = st.value("unprivileged_limits", json::object());
    EXPECT_EQ(lim.value("ringbuf_kb", 0), 65536) << st.dump();
    EXPECT_EQ(lim.value("max_records", 0), 200000) << st.dump();
    EXPECT_EQ(lim.value("duration_s", 0.0), 3600.0) << st.dump();
    EXPECT_EQ(lim.value("sessions_per_uid", 0), 2) << st.dump();

    // No -d: until the process exits, at most the allowed window, said up front.
    Background ok(concat(kAsNobody, {bins.commdbg, "attach", pid, "--socket", d.socket(), "--json",
                                     tmp.path("own.json")}));
    std::string tracing = ok.wait_for_err_line("commdbg: tracing", 60);
    EXPECT_NE(tracing.find("at most 3600 s"), std::string::npos) << tracing;
    ASSERT_NO_FATAL_FAILURE(release_and_check_window(work, ok, tmp.path("go"), tmp.path("own.json")));
}

// The daemon reads a spec file as root: through it, another user could learn
// whether a file exists and read pieces of it from the parse error.
TEST(DaemonLimits, UnprivilegedAttachCannotMakeTheDaemonReadAFile) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    Background sleeper(concat(kAsNobody, {bins.sleeper, "120000"}));
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty()) << "sleeper (uid 65534) never got ready";
    auto r = cli_as_nobody(bins, {"attach", std::to_string(sleeper.pid()), "-d", "1", "--probes", "/etc/shadow",
                                  "--socket", d.socket(), "--json", tmp.path("out.json")},
                           15);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(r.err.find("JSON"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("last read"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("built-in specs only"), std::string::npos) << r.err;
}

// ======================================================================================
// Finding 13: a window cut short by the daemon's shutdown says so.
// ======================================================================================

TEST(DaemonLimits, SigtermMidSessionSaysTheWindowWasCutShortAndExitsNonZero) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background sleeper({testprog("plain_sleeper"), "120000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    Background held({commdbg_bin(), "attach", std::to_string(sleeper.pid()), "-d", "50", "--json",
                     tmp.path("cut.json"), "--socket", d.socket()});
    ASSERT_FALSE(held.wait_for_err_line("commdbg: tracing", 60).empty()) << held.wait(5).err;

    auto stopped = d.stop(SIGTERM, 60);
    EXPECT_EQ(stopped.status, 0) << stopped.err;
    auto r = held.wait(60);
    EXPECT_NE(r.status, 0) << "a 50 s window cut short by the daemon's shutdown exited 0: " << r.err;
    EXPECT_NE(r.err.find("cut short"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("commdbgd is stopping"), std::string::npos) << r.err;
    // What it saw is still written.
    EXPECT_TRUE(read_json(tmp.path("cut.json")).is_object());
}

// ======================================================================================
// Finding 14: messages.
// ======================================================================================

// The window as the user typed it, not "80.000000 s".
TEST(DaemonLimits, AttachThroughTheDaemonShowsTheWindowAsTyped) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background sleeper({testprog("plain_sleeper"), "120000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    Background dbg({commdbg_bin(), "attach", std::to_string(sleeper.pid()), "-d", "80", "--json", tmp.path("o.json"),
                    "--socket", d.socket()});
    std::string tracing = dbg.wait_for_err_line("commdbg: tracing", 60);
    EXPECT_NE(tracing.find("for 80 s"), std::string::npos) << tracing;
    EXPECT_EQ(tracing.find("80.0"), std::string::npos) << tracing;
    kill(dbg.pid(), SIGINT);
    EXPECT_EQ(dbg.wait(60).status, 0);
}

// A refusal from the daemon names the attach once: "commdbg: attach N: ...".
TEST(DaemonLimits, DaemonRefusalNamesTheAttachOnce) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--max-sessions", "1"});
    Background sleeper({testprog("plain_sleeper"), "120000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    const std::string pid = std::to_string(sleeper.pid());
    int held = connect_unix(d.socket());
    send_bytes(held, attach_request(sleeper.pid(), 60));
    auto first = reply_lines(read_reply(held, 1, 30000).data);
    ASSERT_EQ(first.size(), 1u);
    ASSERT_EQ(first[0].value("state", ""), "tracing") << first[0].dump();
    auto r = cli({"attach", pid, "-d", "1", "--socket", d.socket()});
    close(held);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(count_of(r.err, "attach " + pid + ":"), 1u) << r.err;
    EXPECT_NE(r.err.find("tracing sessions"), std::string::npos) << r.err;
}

// --metrics-listen HOST:0 takes a free port and says which.
TEST(DaemonLimits, MetricsListenOnPortZeroPrintsThePortItGot) {
    REQUIRE_BPF();
    SharedDir tmp;
    Background d({commdbgd_bin(), "--socket", tmp.path("d.sock"), "--metrics-listen", "127.0.0.1:0"});
    std::string line = d.wait_for_err_line("metrics http://", 60);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)/metrics"))) << line;
    int port = std::stoi(m[1]);
    EXPECT_NE(port, 0) << line;
    if (port != 0) {
        int status = 0;
        std::string body = http_get(port, "/metrics", &status);
        EXPECT_EQ(status, 200);
        EXPECT_NE(body.find("commdbg_build_info"), std::string::npos) << body.substr(0, 300);
    }
    kill(d.pid(), SIGTERM);
    EXPECT_EQ(d.wait(30).status, 0);
}

// `commdbg detach 0` / `-1`: what a session id is, not a 309-digit range.
TEST(DaemonLimits, DetachOfZeroOrNegativeIdSaysWhatASessionIdIs) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    for (const std::string id : {"0", "-1", "abc"}) {
        auto r = cli({"detach", id, "--socket", d.socket()});
        EXPECT_NE(r.status, 0) << id;
        EXPECT_FALSE(std::regex_search(r.err, std::regex("[0-9]{20}"))) << id << ": " << r.err;
        EXPECT_NE(r.err.find("commdbg sessions"), std::string::npos) << id << ": " << r.err;
        EXPECT_LT(r.err.size(), 300u) << id << ": " << r.err;
    }
    // A well-formed id the daemon does not know: named once.
    auto unknown = cli({"detach", "987654", "--socket", d.socket()});
    EXPECT_NE(unknown.status, 0);
    EXPECT_EQ(count_of(unknown.err, "detach"), 1u) << unknown.err;
    EXPECT_NE(unknown.err.find("no such session"), std::string::npos) << unknown.err;
}

// counts --pid of a process commdbgd does not count: an error that says so.
TEST(DaemonLimits, CountsForAPidNotCountedSaysSoAndFails) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    int missing = 999999;
    while (std::filesystem::exists("/proc/" + std::to_string(missing))) --missing;
    auto none = cli({"counts", "--pid", std::to_string(missing), "--socket", d.socket()});
    EXPECT_NE(none.status, 0) << none.out;
    EXPECT_NE(none.err.find("no such process"), std::string::npos) << none.err;
    EXPECT_EQ(count_of(none.err, "counts"), 1u) << none.err;

    Background sleeper({testprog("plain_sleeper"), "120000"});
    ASSERT_FALSE(sleeper.wait_for_line("ready pid=").empty());
    auto uncounted = cli({"counts", "--pid", std::to_string(sleeper.pid()), "--socket", d.socket()});
    EXPECT_NE(uncounted.status, 0) << uncounted.out;
    EXPECT_NE(uncounted.err.find("not counted"), std::string::npos) << uncounted.err;
}

// counts --pid TID of a worker thread: the counts of its process, saying so.
TEST(DaemonLimits, CountsForAWorkerThreadAnswersForItsProcess) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background work({testprog("nccl_workload"), "--calls", "all_reduce=5", "--fake-comm", "--threads", "2",
                     "--duration-ms", "60000"},
                    nccl_env(false));
    // A worker thread: any task of the workload but its main thread.
    int tid = 0;
    for (int i = 0; i < 200 && !tid; ++i) {
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(work.pid()) + "/task", ec)) {
            int t = std::stoi(e.path().filename().string());
            if (t != work.pid()) tid = t;
        }
        if (!tid) sleep_ms(50);
    }
    ASSERT_NE(tid, 0) << "the workload started no thread";
    // Counted once its first call is seen.
    json j;
    for (int i = 0; i < 100; ++i) {
        auto r = cli({"counts", "--pid", std::to_string(tid), "--json", "--socket", d.socket()});
        j = json::parse(r.out, nullptr, false);
        if (r.status == 0 && j.is_object() && !j.value("processes", json::array()).empty()) break;
        sleep_ms(100);
    }
    ASSERT_TRUE(j.is_object()) << j;
    auto procs = j.value("processes", json::array());
    ASSERT_EQ(procs.size(), 1u) << j.dump();
    EXPECT_EQ(procs[0].value("pid", 0), work.pid()) << j.dump();
    EXPECT_NE(j.value("note", "").find("thread of pid " + std::to_string(work.pid())), std::string::npos) << j.dump();
    auto text = cli({"counts", "--pid", std::to_string(tid), "--socket", d.socket()});
    EXPECT_EQ(text.status, 0) << text.err;
    EXPECT_NE(text.err.find("thread of pid " + std::to_string(work.pid())), std::string::npos) << text.err;
    EXPECT_NE(text.out.find("pid " + std::to_string(work.pid())), std::string::npos) << text.out;
}

// ======================================================================================
// Finding 15: idle or trickling connections to /metrics do not stall scrapes.
// ======================================================================================

int connect_tcp(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

TEST(DaemonLimits, IdleAndTricklingMetricsConnectionsDoNotStallScrapes) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    std::vector<int> idle, trickling;
    for (int i = 0; i < 50; ++i) {
        idle.push_back(connect_tcp(d.port()));
        trickling.push_back(connect_tcp(d.port()));
    }
    std::atomic<bool> done{false};
    // One byte of a request line every 500 ms on each trickling connection.
    std::thread trickle([&] {
        const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        for (size_t at = 0; !done && at < 200; ++at) {
            for (int fd : trickling)
                if (fd >= 0) (void)!send(fd, &req[at % req.size()], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            for (int i = 0; i < 5 && !done; ++i) sleep_ms(100);
        }
    });
    sleep_ms(300);
    // Each scrape must be answered within http_get's 10 s (Prometheus's
    // default scrape timeout).
    int failed = 0;
    for (int i = 0; i < 5; ++i) {
        int status = 0;
        std::string body = http_get(d.port(), "/metrics", &status);
        if (status != 200 || body.find("commdbg_build_info") == std::string::npos) ++failed;
    }
    done = true;
    trickle.join();
    for (int fd : idle)
        if (fd >= 0) close(fd);
    for (int fd : trickling)
        if (fd >= 0) close(fd);
    EXPECT_EQ(failed, 0) << failed << " of 5 scrapes got no answer with 50 idle and 50 trickling connections open";
}

}  // namespace
}  // namespace daemon_limit_tests
}  // namespace commdbg::e2e
