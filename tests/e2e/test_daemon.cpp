// SPDX-License-Identifier: Apache-2.0
// Acceptance for commdbgd, the node service: a workload started after the
// daemon is counted exactly (control socket and /metrics, stub and real
// NCCL, from its first call on); `commdbg attach` runs its session inside the
// daemon; unprivileged clients see and trace only their own processes;
// malformed requests get errors and the daemon keeps serving; a thousand
// short processes leave memory, fds, series and kernel maps at baseline;
// SIGTERM detaches cleanly, SIGKILL leaves workloads running and a restart
// resumes counting.
//
// Each test starts its own commdbgd on a socket in a temp dir and a free
// loopback port, waits until `commdbg status --socket S` answers, and stops
// it at the end.
//
// Expected counts come from the workload's pattern.  To read `commdbg
// counts` for a live process whose calls are all done, a workload's stdout
// is a pipe the test fills beforehand: the workload makes all its calls,
// then blocks in write(1, report) until the test drains the pipe.
#include "daemon_util.hpp"
#include "events.h"

namespace commdbg::e2e {
namespace daemon_tests {
namespace {

using namespace daemon_util;

// ======================================================================================
// 1. A workload started after the daemon: counted exactly from its first call.
// ======================================================================================

// nccl_workload_dl dlopens LIB (a file new to this daemon) and calls at once:
// the daemon must stop it at the mmap until the probes are attached, or the
// first calls (ncclCommInitRank, then the collectives) are lost.
void counted_exactly_after_dlopen(bool real) {
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--series-ttl", "60"});

    std::vector<std::string> argv = {testprog("nccl_workload_dl"), "--dlopen", lib_path(real), "--calls",
                                     pattern_arg(kPattern)};
    std::string id_hash;
    if (!real) {
        // The stub makes a communicator of the id: the daemon must name it by
        // the id's hash, with its rank and size.  (Real NCCL would wait for
        // the other 3 ranks; with no comm its calls fail at once, still counted.)
        auto h = run({testprog("nccl_workload_dl"), "--no-nccl", "--init-seed", "7", "--print-id-hash"});
        ASSERT_EQ(h.status, 0) << h.err;
        std::smatch m;
        ASSERT_TRUE(std::regex_search(h.out, m, std::regex("id_hash=(0x[0-9a-f]{16})"))) << h.out;
        id_hash = m[1];
        argv = concat(argv, {"--init-seed", "7", "--nranks", "4", "--rank", "2"});
    }
    // New to the daemon unless a process on the node (another job, another
    // test) already maps it: then it was attached at the start, nothing needs
    // stopping and only the counts are checked.
    bool file_new = true;
    const std::string canonical = std::filesystem::canonical(lib_path(real)).string();
    for (const auto& f : cli_json({"status", "--socket", d.socket()}).value("library_files", json::array()))
        if (f.value("path", "") == canonical) file_new = false;
    if (!file_new) std::cout << "[ note ] " << canonical << " already attached (mapped by another process)\n";

    StalledWorkload w(argv);
    ASSERT_STALLED(w);

    // Live: `commdbg counts` per pid.
    const auto want = expected_map(kPattern, "nccl.");
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), want), want) << "commdbg counts --pid " << w.pid();
    // And /metrics: the calls series of the pid, summed per collective.
    const auto want_metrics = expected_map(kPattern);
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), want_metrics), want_metrics);

    if (!real) {
        auto j = cli_json({"counts", "--socket", d.socket(), "--pid", std::to_string(w.pid()), "--by-comm"});
        ASSERT_TRUE(j.contains("communicators")) << j.dump(2);
        json mine;
        for (const auto& c : j["communicators"])
            if (c.value("comm_id", "") == id_hash) mine = c;
        ASSERT_TRUE(mine.is_object()) << "no communicator " << id_hash << " (ncclCommInitRank, the first call "
                                      << "right after the dlopen, was missed?) in " << j.dump(2);
        EXPECT_EQ(mine.value("nranks", -1), 4) << mine.dump();
        ASSERT_EQ(mine["ranks"].size(), 1u) << mine.dump();
        EXPECT_EQ(mine["ranks"][0].value("rank", -1), 2) << mine.dump();
        EXPECT_EQ(mine["ranks"][0].value("pid", 0), w.pid()) << mine.dump();
        EXPECT_EQ(mine["ranks"][0].value("calls", 0), total_of(kPattern)) << mine.dump();
        // The series carry the same communicator labels.
        for (const auto& s : scrape(d.port()))
            if (s.name == "commdbg_collective_calls_total" && s.labels.at("pid") == std::to_string(w.pid())) {
                EXPECT_EQ(s.labels.at("comm"), id_hash) << s.labels.at("collective");
                EXPECT_EQ(s.labels.at("rank"), "2");
                EXPECT_EQ(s.labels.at("nranks"), "4");
            }
    }
    auto st = cli_json({"status", "--socket", d.socket()});
    if (file_new) {
        EXPECT_GE(st.value("resumed_after_new_library", 0), 1)
            << "the workload mapped a library file new to the daemon, which should have stopped and resumed it: "
            << st.dump();
    }

    auto r = w.finish();
    ASSERT_EQ(r.status, 0) << r.err;
    auto rep = workload_report(r.out);
    ASSERT_TRUE(rep.is_object()) << r.out;
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<int>(), n) << kind;
    if (!real) {
        EXPECT_NE(r.err.find("init rc=0"), std::string::npos) << r.err;
    }

    // Exited: gone from `counts`, still in /metrics (within --series-ttl),
    // unchanged; errors as the workload saw them.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    json proc;
    do {
        proc = process_entry(cli_json({"counts", "--socket", d.socket()}), w.pid());
        if (proc.is_null()) break;
        sleep_ms(100);
    } while (Clock::now() < deadline);
    EXPECT_TRUE(proc.is_null()) << "exited pid " << w.pid() << " still listed: " << proc.dump();
    auto samples = scrape(d.port());
    EXPECT_EQ(sum_by_collective(samples, "commdbg_collective_calls_total", w.pid()), want_metrics)
        << "series of the exited process changed or expired early";
    long errors = 0;
    for (const auto& [k, v] : sum_by_collective(samples, "commdbg_collective_errors_total", w.pid())) errors += v;
    EXPECT_EQ(errors, rep["errors"].get<long>());
    if (real) {
        EXPECT_GT(errors, 0) << "real NCCL with a NULL comm should reject the calls";
    }
}

TEST(Daemon, WorkloadStartedAfterDaemonIsCountedExactly) {
    REQUIRE_BPF();
    counted_exactly_after_dlopen(false);
}

TEST(Daemon, WorkloadStartedAfterDaemonIsCountedExactlyRealNccl) {
    REQUIRE_BPF();
    REQUIRE_REAL_NCCL();
    counted_exactly_after_dlopen(true);
}

// The library linked at build time (mapped by ld.so at exec), calls split over
// threads, and a second process on the same, now known, file.
TEST(Daemon, LinkedWorkloadsOnAKnownFileAreCountedExactly) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    const std::vector<std::pair<std::string, int>> second = {{"reduce_scatter", 11}, {"all_to_all", 4}};
    StalledWorkload a({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--threads", "3", "--fake-comm"},
                      nccl_env(false));
    ASSERT_STALLED(a);
    // b carries the environment that labels a job's series.
    auto env_b = nccl_env(false);
    env_b["RANK"] = "3";
    env_b["WORLD_SIZE"] = "8";
    env_b["SLURM_JOB_ID"] = "4242";
    StalledWorkload b({testprog("nccl_workload"), "--calls", pattern_arg(second), "--fake-comm"}, env_b);
    ASSERT_STALLED(b);
    EXPECT_EQ(daemon_counts_settled(d, a.pid(), expected_map(kPattern, "nccl.")), expected_map(kPattern, "nccl."));
    EXPECT_EQ(daemon_counts_settled(d, b.pid(), expected_map(second, "nccl.")), expected_map(second, "nccl."));
    EXPECT_EQ(metrics_calls_settled(d.port(), a.pid(), expected_map(kPattern)), expected_map(kPattern));
    EXPECT_EQ(metrics_calls_settled(d.port(), b.pid(), expected_map(second)), expected_map(second));
    // Both listed by a plain `counts` too.
    auto all = cli_json({"counts", "--socket", d.socket()});
    EXPECT_TRUE(process_entry(all, a.pid()).is_object()) << all.dump();
    EXPECT_TRUE(process_entry(all, b.pid()).is_object()) << all.dump();
    const json env = process_entry(all, b.pid()).value("env", json::object());
    EXPECT_EQ(env.value("RANK", ""), "3") << env.dump();
    EXPECT_EQ(env.value("WORLD_SIZE", ""), "8") << env.dump();
    EXPECT_EQ(env.value("SLURM_JOB_ID", ""), "4242") << env.dump();
    size_t labelled = 0;
    for (const auto& smp : scrape(d.port())) {
        if (smp.name != "commdbg_collective_calls_total") continue;
        if (smp.labels.at("pid") == std::to_string(b.pid())) {
            ++labelled;
            EXPECT_EQ(smp.labels.at("env_rank"), "3");
            EXPECT_EQ(smp.labels.at("env_world_size"), "8");
            EXPECT_EQ(smp.labels.at("env_slurm_job_id"), "4242");
            EXPECT_EQ(smp.labels.at("env_local_rank"), "");
        } else if (smp.labels.at("pid") == std::to_string(a.pid())) {
            EXPECT_EQ(smp.labels.at("env_rank"), "");
        }
    }
    EXPECT_EQ(labelled, second.size());
    EXPECT_EQ(a.finish().status, 0);
    EXPECT_EQ(b.finish().status, 0);
}

// ======================================================================================
// 2. `commdbg attach` through the daemon.
// ======================================================================================

// `cli` (argv up to the binary) attaches through the daemon to a workload
// waiting on `go`, which is released once tracing; the dump in `out` must
// count kPattern exactly.  `more`: further attach arguments.
void attach_counts_pattern(const std::vector<std::string>& cli, Background& work, const std::string& go,
                           const std::string& out, const std::string& socket,
                           const std::vector<std::string>& more = {}) {
    Background dbg(concat(cli, concat({"attach", std::to_string(work.pid()), "-d", "1", "--json", out, "--socket",
                                       socket},
                                      more)));
    std::string tracing;
    ASSERT_TRUE(wait_tracing(dbg, &tracing));
    EXPECT_TRUE(std::regex_search(tracing, std::regex("session [0-9]+ in commdbgd"))) << tracing;
    touch(go);
    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err;
    auto r = dbg.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(out);
    EXPECT_EQ(comm_counts_of(j), expected_map(kPattern, "nccl.")) << j.dump(2);
    EXPECT_EQ(j.value("total_counts", -1), total_of(kPattern));
}

// A fresh daemon's session, with `more` attach arguments, counts kPattern
// exactly and is gone from the daemon's list afterwards.
void attach_through_daemon(const std::vector<std::string>& more) {
    SharedDir tmp;
    START_DAEMON(d, tmp);
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file",
                     tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";

    attach_counts_pattern({commdbg_bin()}, work, tmp.path("go"), tmp.path("out.json"), d.socket(), more);
    if (::testing::Test::HasFatalFailure()) return;
    // The session is over: the daemon lists none once its thread has let go
    // of the slot, a moment after the last byte.
    json s;
    for (int i = 0; i < 50; ++i) {
        s = cli_json({"sessions", "--socket", d.socket()});
        if (s.value("sessions", json::array()).empty()) break;
        sleep_ms(100);
    }
    EXPECT_TRUE(s.value("sessions", json::array()).empty()) << s.dump();
}

TEST(Daemon, AttachThroughDaemon) {
    REQUIRE_BPF();
    attach_through_daemon({});
}

// --no-follow: the daemon's session probes the process alone (the kernel's
// per-process filter, OwnCost.NoFollowProbesTheTracedProcessAlone) and
// counts it as exactly.
TEST(Daemon, AttachThroughDaemonNoFollowCountsExactly) {
    REQUIRE_BPF();
    attach_through_daemon({"--no-follow"});
}

// A session's reply carries the table and only the outputs the request names
// (a 200k-record window is tens of MB per output); none named: all of them.
TEST(Daemon, AttachReplyCarriesOnlyTheOutputsAsked) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    // Each session releases a workload that makes 5 calls and exits.
    int round = 0;
    auto ask = [&](const std::string& outputs) {
        const std::string go = tmp.path("go" + std::to_string(round++));
        Background work({testprog("nccl_workload"), "--calls", "all_reduce=5", "--fake-comm", "--wait-file", go},
                        nccl_env(false));
        if (work.wait_for_line("ready pid=").empty()) return json();
        int fd = connect_unix(d.socket());
        std::string req = R"({"op":"attach","pid":)" + std::to_string(work.pid()) +
                          (outputs.empty() ? "" : R"(,"outputs":)" + outputs) + "}\n";
        send_bytes(fd, req);
        Reply first = read_reply(fd, 1, 30000);  // tracing
        touch(go);
        work.wait(30);
        // The last line lists the outputs that follow it as raw bytes.
        Reply rest = read_reply(fd, 1, 30000);
        size_t nl = rest.data.find('\n');
        json done = nl == std::string::npos ? json() : json::parse(rest.data.substr(0, nl), nullptr, false);
        if (!done.is_object()) return json();
        std::string bytes = rest.data.substr(nl + 1);
        size_t want = 0;
        for (const auto& p : done.value("payload", json::array())) want += p.value("bytes", size_t{0});
        char buf[65536];
        while (bytes.size() < want) {
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 10000) <= 0) break;
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            bytes.append(buf, static_cast<size_t>(n));
        }
        close(fd);
        EXPECT_EQ(bytes.size(), want) << "payload bytes after the last line";
        size_t at = 0;
        for (const auto& p : done.value("payload", json::array())) {
            size_t n = p.value("bytes", size_t{0});
            done[p.value("name", std::string())] = bytes.substr(std::min(at, bytes.size()), n);
            at += n;
        }
        return done;
    };
    auto only_trace = ask(R"(["trace"])");
    ASSERT_TRUE(only_trace.is_object()) << "no final reply";
    EXPECT_EQ(only_trace.value("state", ""), "done") << only_trace.dump().substr(0, 500);
    EXPECT_NE(only_trace.value("table", "").find("all_reduce"), std::string::npos);
    EXPECT_EQ(only_trace.value("json", "?"), "");
    EXPECT_EQ(only_trace.value("table_color", "?"), "");
    EXPECT_TRUE(json::parse(only_trace.value("trace", "")).contains("traceEvents"));
    auto all = ask("");
    ASSERT_TRUE(all.is_object()) << "no final reply";
    EXPECT_EQ(json::parse(all.value("json", "{}"))["comm_counts"].value("nccl.all_reduce", 0), 5);
    EXPECT_NE(all.value("table_color", "").find("\x1b["), std::string::npos);
    EXPECT_TRUE(json::parse(all.value("trace", "")).contains("traceEvents"));
}

// Sessions hold memory (maps, ring buffer, a model of up to 200000 records,
// outputs): past --max-sessions an attach is refused with what to do, and a
// slot is free again once a session ends.
TEST(Daemon, AttachesPastMaxSessionsAreRefusedUntilOneEnds) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--max-sessions", "1"});
    Background sleeper({testprog("plain_sleeper"), "60000"});
    const std::string req = R"({"op":"attach","pid":)" + std::to_string(sleeper.pid()) + R"(,"duration_s":60})" "\n";
    int a = connect_unix(d.socket());
    send_bytes(a, req);
    auto first = reply_lines(read_reply(a, 1, 30000).data);
    ASSERT_EQ(first.size(), 1u);
    ASSERT_EQ(first[0].value("state", ""), "tracing") << first[0].dump();

    int b = connect_unix(d.socket());
    send_bytes(b, req);
    auto refused = reply_lines(read_reply(b, 1, 30000).data);
    close(b);
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_FALSE(refused[0].value("ok", true));
    const std::string err = refused[0].value("error", "");
    EXPECT_NE(err.find("already runs 1 tracing sessions"), std::string::npos) << err;
    EXPECT_NE(err.find("--no-daemon"), std::string::npos) << err;

    // The client of the first hangs up: its session ends, the slot is free.
    close(a);
    auto deadline = Clock::now() + std::chrono::seconds(20);
    json again;
    do {
        int c = connect_unix(d.socket());
        send_bytes(c, req);
        auto lines = reply_lines(read_reply(c, 1, 30000).data);
        close(c);
        again = lines.empty() ? json() : lines[0];
        if (again.value("state", "") == "tracing") break;
        sleep_ms(200);
    } while (Clock::now() < deadline);
    EXPECT_EQ(again.value("state", ""), "tracing") << again.dump();
}

// ======================================================================================
// 3. Unprivileged clients.
// ======================================================================================

TEST(Daemon, UnprivilegedAttachToRootProcessIsDenied) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file",
                     tmp.path("go")},
                    nccl_env(false));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload never got ready";
    const std::string pid = std::to_string(work.pid());

    auto r = cli_as_nobody(bins, {"attach", pid, "-d", "1", "--json", tmp.path("out.json"), "--socket", d.socket()});
    EXPECT_NE(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp.path("out.json")));
    // Its counts are not for uid 65534 either.
    auto c = cli_as_nobody(bins, {"counts", "--pid", pid, "--json", "--socket", d.socket()});
    EXPECT_NE(c.status, 0) << c.out;
    EXPECT_NE(c.err.find("permission denied"), std::string::npos) << c.err;
    // And the daemon holds no session for it.
    auto s = cli_json({"sessions", "--socket", d.socket()});
    EXPECT_TRUE(s.value("sessions", json::array()).empty()) << s.dump();

    // Undisturbed: it runs its pattern once let go.
    touch(tmp.path("go"));
    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err;
    auto rep = workload_report(w.out);
    ASSERT_TRUE(rep.is_object()) << w.out;
    EXPECT_EQ(rep["calls"]["all_reduce"].get<int>(), 13);
}

TEST(Daemon, UnprivilegedAttachToOwnProcessWorks) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    Background work(
        nobody_workload(bins, {"--calls", pattern_arg(kPattern), "--fake-comm", "--wait-file", tmp.path("go")}),
        nobody_env(bins));
    ASSERT_FALSE(work.wait_for_line("ready pid=").empty()) << "workload (uid 65534) never got ready";
    auto owner = run({"stat", "-c", "%u", "/proc/" + std::to_string(work.pid())});
    ASSERT_EQ(owner.out, std::to_string(kNobody) + "\n");

    attach_counts_pattern(concat(kAsNobody, {bins.commdbg}), work, tmp.path("go"), tmp.path("out.json"), d.socket());
}

// `commdbg counts` as uid 65534 lists only uid 65534's processes; root sees all.
TEST(Daemon, UnprivilegedCountsListOnlyOwnProcesses) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    const std::vector<std::pair<std::string, int>> theirs = {{"all_reduce", 4}, {"reduce", 9}};
    StalledWorkload root_w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    StalledWorkload nobody_w(nobody_workload(bins, {"--calls", pattern_arg(theirs), "--fake-comm"}), nobody_env(bins));
    ASSERT_STALLED(root_w);
    ASSERT_STALLED(nobody_w);
    EXPECT_EQ(daemon_counts_settled(d, root_w.pid(), expected_map(kPattern, "nccl.")),
              expected_map(kPattern, "nccl."));
    EXPECT_EQ(daemon_counts_settled(d, nobody_w.pid(), expected_map(theirs, "nccl."), true),
              expected_map(theirs, "nccl."));

    auto r = cli_as_nobody(bins, {"counts", "--json", "--socket", d.socket()});
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    const auto& procs = j["processes"];
    ASSERT_EQ(procs.size(), 1u) << "uid 65534 must see exactly its one process: " << j.dump(2);
    EXPECT_EQ(procs[0].value("pid", 0), nobody_w.pid());
    EXPECT_EQ(comm_counts_of(procs[0]), expected_map(theirs, "nccl."));

    auto all = cli_json({"counts", "--socket", d.socket()});
    EXPECT_TRUE(process_entry(all, root_w.pid()).is_object()) << all.dump(2);
    EXPECT_TRUE(process_entry(all, nobody_w.pid()).is_object()) << all.dump(2);

    EXPECT_EQ(root_w.finish().status, 0);
    EXPECT_EQ(nobody_w.finish().status, 0);
}

// ======================================================================================
// 4. Malformed requests.
// ======================================================================================

TEST(Daemon, MalformedRequestsGetErrorsAndDaemonKeepsServing) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    auto expect_error_line = [](const Reply& r, const std::string& what, const std::string& mention = "") {
        auto lines = reply_lines(r.data);
        ASSERT_GE(lines.size(), 1u) << what << ": no reply (closed=" << r.closed << ")";
        ASSERT_TRUE(lines[0].is_object()) << what << ": reply is not JSON: " << r.data;
        EXPECT_EQ(lines[0].value("ok", true), false) << what << ": " << r.data;
        EXPECT_FALSE(lines[0].value("error", "").empty()) << what << ": " << r.data;
        if (!mention.empty()) {
            EXPECT_NE(lines[0].value("error", "").find(mention), std::string::npos) << what << ": " << r.data;
        }
    };

    {  // Not JSON: an error, and the same connection still serves.
        int fd = connect_unix(d.socket());
        ASSERT_GE(fd, 0);
        send_bytes(fd, "this is not json\n");
        auto r = read_reply(fd, 1);
        expect_error_line(r, "not-JSON line", "JSON");
        send_bytes(fd, "{\"op\":\"status\"}\n");
        auto r2 = read_reply(fd, 1);
        auto lines = reply_lines(r2.data);
        ASSERT_EQ(lines.size(), 1u) << r2.data;
        EXPECT_EQ(lines[0].value("ok", false), true) << r2.data;
        close(fd);
    }
    {  // 70000 bytes, no newline: an error or a close, never a success, and no hang.
        int fd = connect_unix(d.socket());
        ASSERT_GE(fd, 0);
        send_bytes(fd, std::string(70000, 'a'));
        auto r = read_reply(fd, 0, 10000);
        EXPECT_TRUE(r.closed) << "daemon kept a connection open after 70000 bytes without a newline";
        EXPECT_EQ(r.data.find("\"ok\":true"), std::string::npos) << r.data;
        if (!r.data.empty()) {
            expect_error_line(r, "70000-byte line", "too large");
        }
        close(fd);
    }
    {  // Half a request, then the client goes away.
        int fd = connect_unix(d.socket());
        ASSERT_GE(fd, 0);
        send_bytes(fd, "{\"op\":\"sta");
        close(fd);
    }
    {  // Half a request, then a half-close: the daemon closes too, answering nothing or an error.
        int fd = connect_unix(d.socket());
        ASSERT_GE(fd, 0);
        send_bytes(fd, "{\"op\":\"counts\",\"pid\":");
        shutdown(fd, SHUT_WR);
        auto r = read_reply(fd, 0, 10000);
        EXPECT_TRUE(r.closed) << "daemon kept a half-closed connection open";
        EXPECT_EQ(r.data.find("\"ok\":true"), std::string::npos) << r.data;
        close(fd);
    }
    // One line each; each gets {"ok":false,...}.
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"{\"op\":\"frobnicate\"}\n", "unknown op"},
        {"[1,2]\n", ""},
        {"{\"op\":\"attach\",\"pid\":\"x\"}\n", "pid"},
        {"{\"op\":\"attach\",\"pid\":-5}\n", "pid"},
        {"{\"op\":\"attach\"}\n", ""},
        {"{\"op\":\"detach\",\"id\":987654}\n", "no such session"},
        {"{\"op\":42}\n", ""},
        {std::string(60000, '[') + "\n", ""},
        {"{\"op\":\"\xff\xfe\"}\n", ""},
        {std::string("{\"op\":\"st\0atus\"}\n", 18), ""},
    };
    for (const auto& [line, mention] : bad) {
        int fd = connect_unix(d.socket());
        ASSERT_GE(fd, 0);
        send_bytes(fd, line);
        auto r = read_reply(fd, 1);
        expect_error_line(r, "request " + json(line.substr(0, 40)).dump(-1, ' ', false, json::error_handler_t::replace),
                          mention);
        close(fd);
    }
    {  // More idle connections than the daemon serves at once; then they go.
        std::vector<int> fds;
        for (int i = 0; i < 80; ++i) {
            int fd = connect_unix(d.socket());
            if (fd >= 0) fds.push_back(fd);
        }
        for (int fd : fds) close(fd);
    }

    // Still serving: status, and a counted workload.
    auto deadline = Clock::now() + std::chrono::seconds(10);
    ProcResult st;
    do {
        st = cli({"status", "--socket", d.socket()});
        if (st.status == 0) break;
        sleep_ms(100);
    } while (Clock::now() < deadline);
    ASSERT_EQ(st.status, 0) << st.err;
    ASSERT_TRUE(alive(d.pid()));
    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), expected_map(kPattern, "nccl.")), expected_map(kPattern, "nccl."));
    EXPECT_EQ(w.finish().status, 0);
}

// ======================================================================================
// 5. A thousand short processes.
// ======================================================================================

TEST(Daemon, ThousandShortProcessesLeaveRssAndFdsAtBaseline) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--series-ttl", "1"});
    const std::vector<std::string> argv = {testprog("nccl_workload"), "--calls", "all_reduce=3", "--fake-comm"};

    // Until nothing of the short processes is left: no process counted, no
    // calls series, the series count flat.
    auto settle = [&](const char* when) {
        auto deadline = Clock::now() + std::chrono::seconds(15);
        json st;
        size_t calls_series = 0;
        do {
            sleep_ms(250);
            st = cli_json({"status", "--socket", d.socket()});
            calls_series = count_series(scrape(d.port()), "commdbg_collective_calls_total");
        } while ((st.value("processes", -1) != 0 || calls_series != 0) && Clock::now() < deadline);
        EXPECT_EQ(st.value("processes", -1), 0) << when << ": " << st.dump();
        EXPECT_EQ(calls_series, 0u) << when;
        return st;
    };

    // Every short process is counted: right after a batch, the series of
    // the latest ones are still there (TTL 1 s), each with exactly its 3
    // calls once the daemon has read its final counts.  A process's exit is
    // read at the next refresh (every 0.5 s), so until then its series may
    // still hold the count of a refresh that fell while it ran: the scrape
    // is repeated until every series seen holds its final 3 (3 s at most).
    auto check_batch_counted = [&](const std::set<int>& pids, const char* which) {
        auto deadline = Clock::now() + std::chrono::seconds(3);
        size_t seen = 0;
        std::map<int, long> wrong;
        do {
            seen = 0;
            wrong.clear();
            for (const auto& s : scrape(d.port())) {
                if (s.name != "commdbg_collective_calls_total") continue;
                int pid = std::stoi(s.labels.at("pid"));
                if (!pids.count(pid)) continue;
                ++seen;
                if (s.labels.at("collective") != "all_reduce" || s.value != 3) wrong[pid] = static_cast<long>(s.value);
            }
            if (seen && wrong.empty()) break;
            sleep_ms(50);
        } while (Clock::now() < deadline);
        std::string values;
        for (const auto& [pid, v] : wrong) values += " pid " + std::to_string(pid) + ": " + std::to_string(v) + ";";
        EXPECT_GT(seen, 0u) << which << ": no series of the short processes seen right after them";
        EXPECT_TRUE(wrong.empty()) << which << ": " << wrong.size()
                                   << " short process(es) not counted as 3 all_reduce 3 s after the batch:" << values;
    };

    // Both the warm-up and the 1000 start kRate processes a second (4 at a
    // time), so the series live at once within the 1 s TTL are as many in
    // both; the warm-up lasts longer than TTL + refresh period to reach it.
    //
    // NOTE (measured, not a leak): unpaced, 1000 processes take ~0.5-0.9 s
    // here and up to ~1000 processes' series are live at once; VmRSS then
    // ends ~+25..45% over the warm-up baseline (e.g. 13040 -> 18740 kB), all
    // of it [heap] that glibc keeps after the expired series are freed:
    // malloc_trim(0) in commdbgd (called through gdb) brought it back to the
    // baseline exactly (16588 -> 12888 kB), and further unpaced batches of
    // 1000 plateau (16292 -> 16584 -> 16588 kB).  The pacing measures leaks,
    // not that high-water mark.
    constexpr double kRate = 40;
    ASSERT_EQ(run_short_workloads(60, 4, argv, kRate), 0);  // warm-up: 1.5 s
    sleep_ms(3000);  // TTL 1 s + refresh
    auto st0 = settle("after the warm-up");
    long rss0 = vm_rss_kb(d.pid()), fds0 = fd_count(d.pid());
    size_t series0 = st0.value("series", 0u);
    auto maps0 = hash_map_entries(d.pid());
    size_t files0 = st0.value("library_files", json::array()).size();

    constexpr int kProcesses = 1000;
    std::set<int> pids;
    auto t0 = Clock::now();
    ASSERT_EQ(run_short_workloads(kProcesses, 4, argv, kRate, &pids), 0);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    check_batch_counted(pids, "1000 short processes");
    // After them, a new process is still counted exactly.
    StalledWorkload w({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w);
    EXPECT_EQ(daemon_counts_settled(d, w.pid(), expected_map(kPattern, "nccl.")), expected_map(kPattern, "nccl."));
    EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), expected_map(kPattern)), expected_map(kPattern));
    EXPECT_EQ(w.finish().status, 0);

    sleep_ms(3000);  // TTL expiry + refresh
    auto st1 = settle("after 1000 processes");
    long rss1 = vm_rss_kb(d.pid()), fds1 = fd_count(d.pid());
    size_t series1 = st1.value("series", 0u);
    auto maps1 = hash_map_entries(d.pid());
    size_t files1 = st1.value("library_files", json::array()).size();

    std::ostringstream m;
    m << kProcesses << " processes (4 at a time, " << kRate << "/s) in " << secs << " s; commdbgd VmRSS " << rss0
      << " kB -> " << rss1 << " kB; fds " << fds0 << " -> " << fds1 << "; series " << series0 << " -> " << series1
      << "; library files " << files0 << " -> " << files1 << "; hash map entries:";
    for (const auto& [name, n] : maps1) m << " " << name << " " << maps0[name] << "->" << n;
    std::cout << "[ daemon ] " << m.str() << "\n";
    RecordProperty("rss_kb_baseline", static_cast<int>(rss0));
    RecordProperty("rss_kb_after", static_cast<int>(rss1));
    RecordProperty("fds_baseline", static_cast<int>(fds0));
    RecordProperty("fds_after", static_cast<int>(fds1));

    // The daemon counts the whole node: a library file new to it (another
    // user's job loading another libnccl meanwhile) legitimately adds its
    // two links (entry and return probes) and a known_files entry.
    const long new_file_fds = 2 * static_cast<long>(files1 - std::min(files0, files1));
    ASSERT_GT(rss0, 0);
    EXPECT_LE(rss1, rss0 + rss0 / 10) << m.str();
    EXPECT_LE(fds1, fds0 + fds0 / 10 + new_file_fds) << m.str();
    EXPECT_LE(series1, series0) << m.str();
    for (const auto& [name, n] : maps1) {
        if (name == "known_files") continue;
        EXPECT_LE(n, maps0[name]) << "kernel map " << name << " grew: " << m.str();
    }
}

// ======================================================================================
// 6. Stopping the daemon.
// ======================================================================================

TEST(Daemon, SigtermDetachesCleanly) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    // A counted workload (so the library's probes are attached too), still
    // running when the daemon stops.
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--duration-ms", "3000"},
                    nccl_env(false));
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (comm_counts_of(process_entry(cli_json({"counts", "--socket", d.socket()}), work.pid())).empty() &&
           Clock::now() < deadline)
        sleep_ms(100);
    ASSERT_FALSE(comm_counts_of(process_entry(cli_json({"counts", "--socket", d.socket()}), work.pid())).empty())
        << "workload never counted";
    std::set<int> ours = link_ids_held_by(d.pid());
    ASSERT_GT(count_links_of_programs(kProgramNames), 0);
    ASSERT_GE(ours.size(), 6u) << "expected the daemon's tracepoint, loader and library links";

    double secs = 0;
    auto r = d.stop(SIGTERM, 10, &secs);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_LT(secs, 5.0) << "commdbgd took " << secs << " s to stop";
    EXPECT_NE(r.err.find("stopped"), std::string::npos) << r.err;
    auto left = wait_links_gone(ours);
    EXPECT_TRUE(left.empty()) << left.size() << " link(s) of the stopped daemon remain";
    expect_no_links_of_our_programs();
    EXPECT_FALSE(std::filesystem::exists(d.socket())) << "socket file left behind";

    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err;
    auto rep = workload_report(w.out);
    ASSERT_TRUE(rep.is_object()) << w.out;
    long rounds = rep["rounds"].get<long>();
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<long>(), n * rounds) << kind;
}

TEST(Daemon, SigkillLeavesWorkloadsRunningAndRestartResumes) {
    REQUIRE_BPF();
    SharedDir tmp;
    const std::string sock = tmp.path("commdbgd.sock");
    const int port = free_loopback_port();
    auto d = std::make_unique<Daemon>(sock, port);
    {
        std::string why = d->wait_ready();
        ASSERT_TRUE(why.empty()) << why;
    }
    Background work({testprog("nccl_workload"), "--calls", pattern_arg(kPattern), "--fake-comm", "--duration-ms", "3000"},
                    nccl_env(false));
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (comm_counts_of(process_entry(cli_json({"counts", "--socket", sock}), work.pid())).empty() &&
           Clock::now() < deadline)
        sleep_ms(100);
    ASSERT_FALSE(comm_counts_of(process_entry(cli_json({"counts", "--socket", sock}), work.pid())).empty())
        << "workload never counted";
    std::set<int> ours = link_ids_held_by(d->pid());
    ASSERT_GE(ours.size(), 6u);
    std::vector<int> guards;
    for (auto [c, state] : children_of(d->pid())) guards.push_back(c);

    auto r = d->stop(SIGKILL, 10);
    EXPECT_EQ(r.status, 128 + SIGKILL);
    EXPECT_TRUE(alive(work.pid())) << "the workload died with the daemon";
    auto left = wait_links_gone(ours);
    EXPECT_TRUE(left.empty()) << left.size() << " link(s) of the killed daemon remain";
    expect_no_links_of_our_programs();
    for (int g : guards) EXPECT_TRUE(wait_gone_or_zombie(g, 5000)) << "daemon child " << g << " outlived it";

    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err;
    auto rep = workload_report(w.out);
    ASSERT_TRUE(rep.is_object()) << w.out;
    long rounds = rep["rounds"].get<long>();
    EXPECT_GT(rounds, 0);
    for (const auto& [kind, n] : kPattern) EXPECT_EQ(rep["calls"][kind].get<long>(), n * rounds) << kind;
    EXPECT_EQ(rep["errors"].get<long>(), 0);

    // A restart on the same socket (a stale file now) and port.
    d = std::make_unique<Daemon>(sock, port);
    {
        std::string why = d->wait_ready();
        ASSERT_TRUE(why.empty()) << "restart: " << why;
    }
    const std::vector<std::pair<std::string, int>> next = {{"all_gather", 6}, {"broadcast", 17}, {"gather", 2}};
    StalledWorkload w2({testprog("nccl_workload"), "--calls", pattern_arg(next), "--fake-comm"}, nccl_env(false));
    ASSERT_STALLED(w2);
    EXPECT_EQ(daemon_counts_settled(*d, w2.pid(), expected_map(next, "nccl.")), expected_map(next, "nccl."));
    EXPECT_EQ(metrics_calls_settled(port, w2.pid(), expected_map(next)), expected_map(next));
    EXPECT_EQ(w2.finish().status, 0);
}

// ======================================================================================
// Known problem (DISABLED until the daemon changes; see the report).
// ======================================================================================

// A node where every job brings its own NCCL (conda envs, container layers,
// per-job scratch) must not accumulate probes: a libnccl file that is deleted
// and mapped by no process is detached (links, fds, known_files entry and its
// line in `commdbg status`) at the next refresh.
TEST(Daemon, DeletedUnusedLibraryFilesAreDetached) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp);
    long fds0 = fd_count(d.pid());
    std::vector<std::string> dirs;
    for (int i = 0; i < 5; ++i) {
        std::string dir = tmp.path("lib" + std::to_string(i));
        std::filesystem::create_directories(dir);
        std::filesystem::copy_file(std::filesystem::canonical(lib_path(false)), dir + "/libnccl.so.2");
        auto r = run({testprog("nccl_workload"), "--calls", "all_reduce=2", "--fake-comm"}, {{"LD_LIBRARY_PATH", dir}});
        ASSERT_EQ(r.status, 0) << r.err;
        std::filesystem::remove_all(dir);
        dirs.push_back(dir);
    }
    sleep_ms(3000);
    auto st = cli_json({"status", "--socket", d.socket()});
    for (const auto& f : st.value("library_files", json::array()))
        for (const auto& dir : dirs)
            EXPECT_EQ(f.value("path", "").rfind(dir, 0), std::string::npos) << "still attached: " << f.dump();
    EXPECT_LE(fd_count(d.pid()), fds0 + 1) << "fds " << fds0 << " -> " << fd_count(d.pid());
}

// Ranks of a job starting together, each on its own fresh copy of libnccl
// (a per-job container image, a node-local cache): every copy is a file new to
// the daemon, found while another is being attached.  One rank links it (ld.so
// maps it at exec), the other dlopens it.  Each rank's calls are counted
// exactly, every round; a lost process shows as a short count.
TEST(Daemon, RanksStartingTogetherOnFreshLibraryCopiesAreAllCountedExactly) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--series-ttl", "120"});
    const std::vector<std::pair<std::string, int>> pattern = {{"all_reduce", 9}, {"all_gather", 4}};
    const auto want = expected_map(pattern);
    const int rounds = 8;
    std::vector<std::string> lost;
    for (int round = 0; round < rounds; ++round) {
        std::vector<std::string> dirs;
        for (int rank = 0; rank < 2; ++rank) {
            dirs.push_back(tmp.path("r" + std::to_string(round) + "_" + std::to_string(rank)));
            std::filesystem::create_directories(dirs.back());
            std::filesystem::copy_file(std::filesystem::canonical(lib_path(false)), dirs.back() + "/libnccl.so.2");
        }
        Background linked({testprog("nccl_workload"), "--calls", pattern_arg(pattern), "--fake-comm"},
                          {{"LD_LIBRARY_PATH", dirs[0]}});
        Background loaded({testprog("nccl_workload_dl"), "--dlopen", dirs[1] + "/libnccl.so.2", "--calls",
                           pattern_arg(pattern), "--fake-comm"});
        for (Background* w : {&linked, &loaded}) {
            auto r = w->wait(60);
            ASSERT_EQ(r.status, 0) << r.err;
            auto got = metrics_calls_settled(d.port(), w->pid(), want);
            if (got != want)
                lost.push_back("round " + std::to_string(round) + " pid " + std::to_string(w->pid()) + " (" +
                               (w == &linked ? "linked" : "dlopen") + "): " + ::testing::PrintToString(got));
        }
    }
    EXPECT_TRUE(lost.empty()) << lost.size() << " of " << 2 * rounds << " ranks miscounted:\n"
                              << ::testing::PrintToString(lost);
    // What it logged (a rank it could not stop, a scan that failed), where a rank was lost.
    if (!lost.empty()) std::cout << "--- commdbgd's log:\n" << d.stop(SIGTERM, 10).err;
}

// bpf_send_signal refuses a stop (-EBUSY) while another is still pending on
// the CPU: the ranks of a job starting together, stopped by two daemons or
// one.  COMMDBG_TEST_FAILED_STOPS=N takes the first N stops as refused.  A
// rank refused fewer than CD_STOP_TRIES times is stopped at its next system
// call, before its first NCCL call: counted exactly, resumed once.  Past
// them it runs on, is not left stopped, and stop_refused says so.
void refused_stops(int refusals, bool counted_exactly) {
    SharedDir tmp;
    Daemon d(tmp.path("commdbgd.sock"), free_loopback_port(), {"--series-ttl", "120"},
             {{"COMMDBG_TEST_FAILED_STOPS", std::to_string(refusals)}});
    std::string why = d.wait_ready();
    ASSERT_TRUE(why.empty()) << why;
    const std::vector<std::pair<std::string, int>> pattern = {{"all_reduce", 9}, {"all_gather", 4}};
    const auto want = expected_map(pattern);
    const std::string dir = tmp.path("fresh");
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(std::filesystem::canonical(lib_path(false)), dir + "/libnccl.so.2");
    Background w({testprog("nccl_workload_dl"), "--dlopen", dir + "/libnccl.so.2", "--calls", pattern_arg(pattern),
                  "--fake-comm"});
    ProcResult r = w.wait(60);
    ASSERT_EQ(r.status, 0) << "the workload was left stopped or failed: " << r.err;
    json st = cli_json({"status", "--socket", d.socket()});
    const long refused = st["drops"].value("stop_refused", -1L);
    if (counted_exactly) {
        EXPECT_EQ(metrics_calls_settled(d.port(), w.pid(), want), want)
            << "the calls made before the file was probed are missing: the retried stop came too late";
        EXPECT_EQ(st.value("resumed_after_new_library", -1L), 1) << "no stop after the refused one: " << st.dump();
        EXPECT_EQ(refused, 0) << st.dump();
    } else {
        EXPECT_EQ(st.value("resumed_after_new_library", -1L), 0) << st.dump();
        EXPECT_EQ(refused, 1) << "a stop refused every time is not said: " << st.dump();
        const ProcResult log = d.stop(SIGTERM, 10);
        EXPECT_NE(log.err.find("pid " + std::to_string(w.pid()) + " maps a library file not probed yet"),
                  std::string::npos)
            << "commdbgd's log does not name the rank that ran on:\n" << log.err;
    }
}

TEST(Daemon, ARankWhoseStopTheKernelRefusesIsStoppedAtItsNextSystemCall) {
    REQUIRE_BPF();
    refused_stops(CD_STOP_TRIES - 1, true);
}

TEST(Daemon, ARankWhoseStopsAreAllRefusedRunsOnAndTheLossIsSaid) {
    REQUIRE_BPF();
    refused_stops(1000, false);
}

}  // namespace
}  // namespace daemon_tests
}  // namespace commdbg::e2e
