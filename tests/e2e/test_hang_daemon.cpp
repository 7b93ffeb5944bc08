// SPDX-License-Identifier: Apache-2.0
// commdbg hang with commdbgd running from before the job: the daemon's exact
// counts per communicator say which rank is behind, and at which collective.
// 3 ranks of one NCCL communicator (the in-tree stub, one unique id): rank 2
// issues one all-reduce fewer, then every rank waits (blocked writing its
// report, as StalledWorkload holds it).
#include "daemon_util.hpp"
#include "hang_job_util.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <numeric>
#include <regex>

#include "process_group.hpp"

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

uint64_t monotonic_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// commdbgd's counts per communicator with the flight recorder's entries
// (one reply line); empty when it did not answer so.
json flight_counts(const Daemon& d) {
    int fd = connect_unix(d.socket());
    EXPECT_GE(fd, 0);
    if (fd < 0) return json::object();
    send_bytes(fd, "{\"op\": \"counts\", \"by_comm\": true, \"flight\": true}\n");
    const std::vector<json> reply = reply_lines(read_reply(fd, 1).data);
    close(fd);
    EXPECT_EQ(reply.size(), 1u);
    return reply.size() == 1 ? reply[0] : json::object();
}

// When commdbg_collective_mismatch_total first showed in /metrics (polled
// every 50 ms for 30 s); 0: never.
uint64_t first_mismatch_seen(const Daemon& d) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
        for (const Sample& s : scrape(d.port()))
            if (s.name == "commdbg_collective_mismatch_total" && s.value > 0) return monotonic_ns();
        sleep_ms(50);
    }
    return 0;
}

// The daemon counted collective #seq of the ranks' communicator once, as
// differing, within 2 s of the call that made it differ (the last of the
// ranks' calls #seq, its time from the flight recorder), and says so in its
// status.
void expect_mismatch_counted(const Daemon& d, const std::vector<int>& pids, int seq, uint64_t seen_ns) {
    const json counts = flight_counts(d);
    const json comms = counts.value("communicators", json::array());
    ASSERT_EQ(comms.size(), 1u) << counts.dump();
    const std::string comm = comms[0]["comm_id"];
    uint64_t call_ns = 0;
    for (const json& r : comms[0]["ranks"])
        call_ns = std::max(call_ns, r["flight"]["last"].back()["enter_ns"].get<uint64_t>());
    ASSERT_EQ(comms[0]["ranks"].size(), pids.size()) << counts.dump();
    ASSERT_NE(call_ns, 0u) << counts.dump();
    EXPECT_LT(seen_ns - call_ns, 2000000000ull) << "the counter moved " << (seen_ns - call_ns) / 1e6
                                                << " ms after the mismatching call";
    std::map<std::string, double> mismatches;
    for (const Sample& s : scrape(d.port()))
        if (s.name == "commdbg_collective_mismatch_total") mismatches[s.labels.at("comm")] = s.value;
    EXPECT_EQ(mismatches, (std::map<std::string, double>{{comm, 1}}));
    const json status = cli_json({"status", "--socket", d.socket()});
    const json& m = status["collective_mismatches"];
    ASSERT_EQ(m.size(), 1u) << status.dump();
    EXPECT_EQ(m[0]["comm_id"], comm);
    EXPECT_EQ(m[0]["first_seq"], seq);
    EXPECT_EQ(m[0]["mismatches"], 1);
    EXPECT_EQ(m[0]["signatures"].size(), 2u) << m.dump();
    // Every rank's number and idle time are exported, labelled with its rank.
    std::map<std::string, double> seqs, idle;
    for (const Sample& s : scrape(d.port()))
        if (s.labels.count("comm") && s.labels.at("comm") == comm) {
            if (s.name == "commdbg_comm_rank_seq") seqs[s.labels.at("rank")] = s.value;
            if (s.name == "commdbg_comm_rank_idle_seconds") idle[s.labels.at("rank")] = s.value;
        }
    EXPECT_EQ(seqs, (std::map<std::string, double>{{"0", seq}, {"1", seq}, {"2", seq}}));
    ASSERT_EQ(idle.size(), 3u);
    for (const auto& [rank, secs] : idle) EXPECT_GT(secs, 0) << "rank " << rank;
}

// `commdbg hang --socket` on the ranks, which must exit `status`: its report
// (empty when it did not), and its table in `table` when asked.
json hang_report(const Daemon& d, const SharedDir& tmp, const std::vector<int>& pids, int status = 3,
                 std::string* table = nullptr) {
    auto out = tmp.path("hang.json");
    std::vector<std::string> argv = {commdbg_bin(), "hang", "--socket", d.socket(), "--json", out};
    for (int p : pids) argv.push_back(std::to_string(p));
    auto r = run(argv);
    EXPECT_EQ(r.status, status) << r.out << r.err;
    if (table) *table = r.out;
    return r.status == status ? read_json(out) : json::object();
}

// A verdict's "signatures": the ranks' first, the odd rank's second.
json two_signatures(const std::string& common, const std::vector<int>& common_pids, const std::string& odd, int odd_pid) {
    return json::array({{{"signature", common}, {"pids", common_pids}}, {{"signature", odd}, {"pids", {odd_pid}}}});
}

TEST(HangDaemon, ARankOneCollectiveShortIsNamedWithTheNumberItNeverIssued) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    auto h = run({testprog("nccl_workload"), "--init-seed", "7", "--print-id-hash", "--calls", "all_reduce=0"});
    ASSERT_EQ(h.status, 0) << h.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(h.out, m, std::regex("id_hash=(0x[0-9a-f]{16})"))) << h.out;
    const std::string id_hash = m[1];

    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls - 1};
    CommRanks ranks = start_comm_ranks(calls);
    const std::vector<int>& pids = ranks.pids;
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    std::string table;
    const json report = hang_report(d, tmp, pids, 3, &table);
    ASSERT_FALSE(report.empty());
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "missing_ranks") << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_EQ(v["comm_id"], id_hash) << v.dump();
    EXPECT_EQ(v["seq"], kCalls) << v.dump();
    EXPECT_NE(table.find("pid " + std::to_string(pids[2]) + " never issued collective #" + std::to_string(kCalls) +
                         " of communicator " + id_hash),
              std::string::npos)
        << table;
    // Each rank's own count, as the daemon has it, in the report.
    for (int i = 0; i < 3; ++i) {
        const json& rank = report["ranks"][i];
        ASSERT_EQ(rank["pid"], pids[i]);
        ASSERT_EQ(rank["communicators"].size(), 1u) << rank.dump();
        EXPECT_EQ(rank["communicators"][0]["rank"], i);
        EXPECT_EQ(rank["communicators"][0]["issued"], i == 2 ? kCalls - 1 : kCalls);
    }
    // The ranks are as they were: blocked, never stopped.
    for (int pid : pids) EXPECT_EQ(proc_state(pid), 'S') << pid;
}

// The flight recorder in the kernel keeps each communicator's last
// collectives: rank 2's last all-reduce passes another count, and hang names
// that collective's number with both signatures.
TEST(HangDaemon, ARankWhoseLastCollectiveDiffersIsAMismatchWithBothSignatures) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls};
    CommRanks ranks = start_comm_ranks(calls, {{}, {}, {"--last-count", "512"}});
    const std::vector<int>& pids = ranks.pids;
    // commdbgd counts the mismatch as the calls arrive: when /metrics first
    // shows it, on CLOCK_MONOTONIC (the recorder's clock).
    const uint64_t seen_ns = first_mismatch_seen(d);
    ASSERT_NE(seen_ns, 0u) << "commdbg_collective_mismatch_total never appeared";
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    const json report = hang_report(d, tmp, pids);
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "collective_mismatch") << v.dump();
    EXPECT_EQ(v["seq"], kCalls) << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_EQ(v["signatures"], two_signatures("all_reduce count 1024 float32 sum", {pids[0], pids[1]},
                                              "all_reduce count 512 float32 sum", pids[2]))
        << v.dump();
    // Every rank's recorder holds its 6, numbered from 1, as the daemon answers it.
    for (const auto& rank : report["ranks"]) {
        const json last = rank["communicators"][0]["last"];
        ASSERT_EQ(last.size(), static_cast<size_t>(kCalls)) << rank.dump();
        for (int i = 0; i < kCalls; ++i) EXPECT_EQ(last[i]["seq"], i + 1);
    }
    ASSERT_NO_FATAL_FAILURE(expect_mismatch_counted(d, pids, kCalls, seen_ns));
}

// Sends and receives take no number (every rank issues its collectives in one
// order, not its point-to-point calls), and a rooted collective's signature
// has its root: rank 2 broadcasts from another root.
TEST(HangDaemon, ARootThatDiffersIsAMismatchAndSendsTakeNoNumber) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    // Per rank, round-robin: all_reduce, send, broadcast, all_reduce, send, all_reduce.
    const std::vector<std::string> more = {"--calls", "send=2,broadcast=1"};
    CommRanks ranks = start_comm_ranks({3, 3, 3}, {more, more, concat(more, {"--root", "1"})});
    const std::map<std::string, long> want = {{"nccl.all_reduce", 3}, {"nccl.send", 2}, {"nccl.broadcast", 1}};
    for (size_t r = 0; r < 3; ++r) {
        ASSERT_STALLED(*ranks.workloads[r]);
        ASSERT_EQ(daemon_counts_settled(d, ranks.pids[r], want), want) << "rank " << r;
    }
    const std::vector<int>& pids = ranks.pids;
    const json report = hang_report(d, tmp, pids);
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "collective_mismatch") << v.dump();
    EXPECT_EQ(v["seq"], 2) << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_EQ(v["signatures"], two_signatures("broadcast count 1024 float32 root 0", {pids[0], pids[1]},
                                              "broadcast count 1024 float32 root 1", pids[2]))
        << v.dump();
    for (const auto& rank : report["ranks"]) {
        const json c = rank["communicators"][0];
        EXPECT_EQ(c["issued"], 4) << "3 all-reduces and a broadcast, not the sends: " << rank.dump();
        std::vector<std::string> kinds;
        for (const auto& e : c["last"]) kinds.push_back(e["collective"]);
        EXPECT_EQ(kinds, (std::vector<std::string>{"all_reduce", "broadcast", "all_reduce", "all_reduce"}));
        EXPECT_EQ(c["last"][0]["op"], "sum");
    }
}

// NCCL's C API is return-probed, so the recorder keeps what each collective
// returned: rank 2's 6th all-reduce returns ncclRemoteError (the stub's fault
// injection, as NCCL answers once a peer failed).  The ranks issued the same
// collectives, so no count or signature differs: hang names the error.
TEST(HangDaemon, ACollectiveThatReturnedAnErrorIsNamedWithWhatItReturned) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls};
    CommRanks ranks = start_comm_ranks(calls, {}, {{}, {}, {{"NCCL_STUB_FAIL_CALL", std::to_string(kCalls)}}});
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    const std::vector<int>& pids = ranks.pids;
    std::string table;
    const json report = hang_report(d, tmp, pids, 3, &table);
    ASSERT_FALSE(report.empty());
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "collective_error") << v.dump();
    EXPECT_EQ(v["seq"], kCalls) << v.dump();
    EXPECT_EQ(v["collective"], "all_reduce") << v.dump();
    EXPECT_EQ(v["culprits"], json::array({pids[2]})) << v.dump();
    EXPECT_NE(table.find("#6 all_reduce count 1024 float32 sum returned ncclRemoteError"), std::string::npos) << table;
    for (int i = 0; i < 3; ++i) {
        const json& last = report["ranks"][i]["communicators"][0]["last"];
        ASSERT_EQ(last.size(), static_cast<size_t>(kCalls)) << report["ranks"][i].dump();
        for (int j = 0; j < kCalls; ++j)
            EXPECT_EQ(last[j]["status"], i == 2 && j == kCalls - 1 ? "ncclRemoteError" : "ncclSuccess")
                << "rank " << i << " #" << j + 1;
    }
    // The daemon's answer has each call's return time, after its entry.
    const json comms = flight_counts(d).value("communicators", json::array());
    ASSERT_EQ(comms.size(), 1u) << comms.dump();
    for (const json& rank : comms[0]["ranks"])
        for (const json& e : rank["flight"]["last"]) {
            ASSERT_TRUE(e.contains("return_ns")) << e.dump();
            EXPECT_GE(e["return_ns"].get<uint64_t>(), e["enter_ns"].get<uint64_t>()) << e.dump();
        }
}

// commdbgd --no-flight-recorder keeps counts only: the same differing last
// all-reduce is no longer seen (equal counts everywhere: below the host),
// nothing is recorded, and the mismatch counter never moves.
TEST(HangDaemon, WithoutTheFlightRecorderCountsRemainButNoSignature) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--no-flight-recorder"});
    const int kCalls = 6;
    const std::vector<int> calls = {kCalls, kCalls, kCalls};
    CommRanks ranks = start_comm_ranks(calls, {{}, {}, {"--last-count", "512"}});
    ASSERT_NO_FATAL_FAILURE(expect_comm_ranks_counted(d, ranks, calls));
    const std::vector<int>& pids = ranks.pids;
    std::string table;
    const json report = hang_report(d, tmp, pids, 1, &table);
    ASSERT_FALSE(report.empty());
    EXPECT_EQ(report["verdict"]["kind"], "below_host") << report["verdict"].dump();
    for (const auto& rank : report["ranks"]) {
        EXPECT_EQ(rank["communicators"][0]["issued"], kCalls) << rank.dump();
        EXPECT_TRUE(rank["communicators"][0]["last"].empty()) << rank.dump();
    }
    sleep_ms(1500);  // three refreshes
    for (const Sample& s : scrape(d.port())) EXPECT_NE(s.name, "commdbg_collective_mismatch_total");
}

// `commdbg hang --socket` on the job's launcher names its stuck rank as the
// one that never issued collective #issued of communicator `id`, in its
// verdict and its table, and exits 3.  Its report (empty when it did not).
json hang_names_the_stuck_rank(const Daemon& d, const SharedDir& tmp, const HungJob& job, const std::string& id,
                               int issued) {
    std::string table;
    const json report = hang_report(d, tmp, {job.launcher_pid}, 3, &table);
    if (report.empty()) return report;
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "missing_ranks") << v.dump();
    EXPECT_EQ(v["culprits"], json::array({job.stuck_pid})) << v.dump();
    EXPECT_EQ(v["comm_id"], id) << v.dump();
    EXPECT_EQ(v["seq"], issued) << v.dump();
    EXPECT_NE(table.find("pid " + std::to_string(job.stuck_pid) + " never issued collective #" + std::to_string(issued) +
                         " of communicator " + id),
              std::string::npos)
        << table;
    return report;
}

// c10d process groups under commdbgd from before the job (3 gloo ranks,
// rank 2 stuck in its loader before step hang_at's all-reduce): a group is
// known by the prefixes of the store keys its ranks meet under, the same on
// every rank, so the daemon numbers each group's collectives alike on every
// rank, and `commdbg hang`, given the launcher, names the stuck rank by the
// collective number it never issued.
void run_c10d_group_case(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--probes", "nccl,torch-c10d"});
    HungJob job;
    start_hung(job, argv, env);
    ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
    const json counts = flight_counts(d);
    std::vector<json> groups;
    for (const json& c : counts.value("communicators", json::array()))
        if (c["comm_id"].get<std::string>().starts_with("c10d:")) groups.push_back(c);
    ASSERT_EQ(groups.size(), 1u) << counts.dump().substr(0, 3000);
    const json& g = groups[0];
    const std::string id = g["comm_id"], name = g["c10d_group"];
    // The job by its launcher (no MASTER_ADDR/PORT: a tcp:// init method),
    // the group by its store prefixes, among them torch's own group name.
    EXPECT_TRUE(id.starts_with("c10d:launcher:" + std::to_string(job.launcher_pid) + ".")) << id;
    EXPECT_TRUE(id.ends_with("/" + name)) << id;
    ASSERT_EQ(std::set<std::string>(job.groups.begin(), job.groups.end()).size(), 1u);
    EXPECT_TRUE(("/" + name + "/").find("/" + job.groups[0] + "/") != std::string::npos)
        << name << " does not hold torch's group name " << job.groups[0];
    EXPECT_EQ(g["nranks"], 3);
    ASSERT_EQ(g["ranks"].size(), 3u) << g.dump();
    const int issued = job.hang_at + 1;  // steps 0..hang_at's all-reduces
    for (const json& r : g["ranks"]) {
        const int pid = r["pid"];
        const auto at = std::find(job.rank_pids.begin(), job.rank_pids.end(), pid);
        ASSERT_NE(at, job.rank_pids.end()) << pid;
        EXPECT_EQ(r["rank"], at - job.rank_pids.begin());
        const int want = pid == job.stuck_pid ? issued - 1 : issued;
        EXPECT_EQ(r["flight"]["seq"], want) << r.dump();
        ASSERT_EQ(r["flight"]["last"].size(), static_cast<size_t>(want)) << r.dump();
        // A c10d call has no count argument: its count and dtype are its
        // tensor's, read once commdbgd has told the kernel how (at most the
        // first ones go without: none is shown, never a wrong one).
        for (const json& e : r["flight"]["last"]) {
            EXPECT_EQ(e["collective"], "all_reduce") << e.dump();
            if (e.contains("count")) {
                EXPECT_EQ(e["count"], job.numel) << e.dump();
            }
            if (e.contains("dtype")) {
                EXPECT_EQ(e["dtype"], job.dtype) << e.dump();
            }
        }
        EXPECT_EQ(r["flight"]["last"].back().value("count", -1), job.numel) << r.dump();
        EXPECT_EQ(r["flight"]["last"].back().value("dtype", ""), job.dtype) << r.dump();
    }
    const json report = hang_names_the_stuck_rank(d, tmp, job, id, issued);
    ASSERT_FALSE(report.empty());
    // The fleet view: every rank's number, under the same communicator.
    std::map<std::string, double> seqs;
    for (const Sample& s : scrape(d.port()))
        if (s.name == "commdbg_comm_rank_seq" && s.labels.at("comm") == id) seqs[s.labels.at("rank")] = s.value;
    EXPECT_EQ(seqs, (std::map<std::string, double>{{"0", issued}, {"1", issued}, {"2", issued - 1}}));
}

TEST(HangDaemon, Torch113GlooGroupIsOneCommunicatorOnEveryRank) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    run_c10d_group_case({py, kJob, "loader"}, {});
}

TEST(HangDaemon, Torch26GlooGroupIsOneCommunicatorOnEveryRank) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    run_c10d_group_case({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/hang_job.py",
                         "loader"},
                        kRootJobEnv);
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// 3 gloo ranks whose step-2 collective differs on rank 2 in what `signature`
// (of a rank) says: commdbgd counts the mismatch at that number as the calls
// arrive, and `commdbg hang` names it with both signatures.
void run_c10d_mismatch_case(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                            const std::function<std::string(const HungJob&, int)>& signature) {
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--probes", "nccl,torch-c10d"});
    HungJob job;
    start_hung(job, argv, env, 0);  // the counter is timed from the call
    ASSERT_NE(job.stuck_pid, 0) << "the job did not reach its wait as planned";
    ASSERT_GE(job.reduce_ops.size(), 5u);
    for (const auto& [value, name] : job.reduce_ops)
        EXPECT_EQ(torch::c10d_reduce_op_name(static_cast<uint32_t>(value)), lower(name)) << value;
    const uint64_t seen_ns = first_mismatch_seen(d);
    ASSERT_NE(seen_ns, 0u) << "commdbg_collective_mismatch_total never appeared: " << flight_counts(d).dump().substr(0, 3000);
    const int seq = job.hang_at + 1;
    const json report = hang_report(d, tmp, {job.launcher_pid});
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "collective_mismatch") << v.dump();
    EXPECT_EQ(v["seq"], seq) << v.dump();
    EXPECT_EQ(v["culprits"], json::array({job.stuck_pid})) << v.dump();
    EXPECT_NE(signature(job, 0), signature(job, 2));
    EXPECT_EQ(signature(job, 0), signature(job, 1));
    EXPECT_EQ(v["signatures"], two_signatures(signature(job, 0), {job.rank_pids[0], job.rank_pids[1]},
                                              signature(job, 2), job.rank_pids[2]))
        << v.dump();
    ASSERT_NO_FATAL_FAILURE(expect_mismatch_counted(d, job.rank_pids, seq, seen_ns));
}

// A c10d collective's reduce op is in its signature: the kernel reads the
// c10d::ReduceOp its options hold first (where their first word is one of
// ReduceOp's vtables; op_'s offset derived from each torch file's code).
// Rank 2's step-2 all-reduce reduces with MAX, the others' with SUM: gloo
// completes it, each rank reducing with its own op (silent corruption).
// Each op is named as the job's torch names it (every RedOpType it has).
std::string all_reduce_with_op(const HungJob& job, int rank) {
    return "all_reduce count " + std::to_string(job.numel) + " " + job.dtype + " " + lower(job.ops.at(rank));
}

TEST(HangDaemon, Torch113GlooAllReduceWithAnotherReduceOpIsAMismatch) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    run_c10d_mismatch_case({py, kJob, "op_mismatch"}, {}, all_reduce_with_op);
}

TEST(HangDaemon, Torch26GlooAllReduceWithAnotherReduceOpIsAMismatch) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    run_c10d_mismatch_case({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3",
                            kInRoot + "/hang_job.py", "op_mismatch"},
                           kRootJobEnv, all_reduce_with_op);
}

// A c10d broadcast's root is in its signature: the kernel reads rootRank
// from its BroadcastOptions, at the offset ProcessGroupGloo::broadcast's own
// check of it (against size_) loads it from.  Rank 2 broadcasts its step-2
// batch from root 1, the others from root 0 (async: it never completes).
std::string broadcast_from_root(const HungJob& job, int rank) {
    return "broadcast count " + std::to_string(job.numel) + " " + job.dtype + " root " +
           std::to_string(job.roots.at(rank));
}

TEST(HangDaemon, Torch113GlooBroadcastFromAnotherRootIsAMismatch) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    run_c10d_mismatch_case({py, kJob, "root_mismatch"}, {}, broadcast_from_root);
}

TEST(HangDaemon, Torch26GlooBroadcastFromAnotherRootIsAMismatch) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    run_c10d_mismatch_case({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3",
                            kInRoot + "/hang_job.py", "root_mismatch"},
                           kRootJobEnv, broadcast_from_root);
}

// ---- the real libnccl, on a GPU: torch's NCCL process group, 3 ranks on
// the one device (tests/testprogs/hang_job.py --backend nccl), commdbgd from
// before the job.  No GPU: skipped, also under CI (docs/hang.md says how
// these ran on a GPU machine and what they printed).

// The job's one NCCL communicator as commdbgd has it, once every rank's
// number reached `issued` (polled for 30 s): each rank numbered as torch
// numbered it, and each of its all-reduces recorded with the job's count and
// dtype, `last_numel` by rank for the last.  Its id, empty on a failure.
std::string real_nccl_comm(const Daemon& d, const HungJob& job, const std::vector<int>& issued,
                           const std::vector<int>& last_numel) {
    json comm;
    for (int tries = 0; tries < 300; ++tries, sleep_ms(100)) {
        const json counts = flight_counts(d);
        std::vector<json> comms;
        for (const json& c : counts.value("communicators", json::array()))
            if (!c["comm_id"].get<std::string>().starts_with("c10d:")) comms.push_back(c);
        if (comms.size() != 1 || comms[0]["ranks"].size() != 3) continue;
        comm = comms[0];
        bool all = true;
        for (const json& r : comm["ranks"]) all = all && r["flight"]["seq"] != nullptr;
        if (!all) continue;
        std::vector<int> seqs;
        for (const json& r : comm["ranks"]) seqs.push_back(r["flight"]["seq"]);
        if (std::accumulate(seqs.begin(), seqs.end(), 0) == std::accumulate(issued.begin(), issued.end(), 0)) break;
    }
    EXPECT_EQ(comm.value("nranks", 0), 3) << comm.dump();
    if (!comm.contains("ranks") || comm["ranks"].size() != 3) {
        ADD_FAILURE() << "no communicator of 3 ranks: " << flight_counts(d).dump().substr(0, 3000);
        return {};
    }
    for (const json& r : comm["ranks"]) {
        const auto at = std::find(job.rank_pids.begin(), job.rank_pids.end(), r["pid"].get<int>());
        if (at == job.rank_pids.end()) {
            ADD_FAILURE() << "not a rank of the job: " << r.dump();
            continue;
        }
        const size_t rank = at - job.rank_pids.begin();
        EXPECT_EQ(r["rank"], rank) << r.dump();
        EXPECT_EQ(r["flight"]["seq"], issued[rank]) << r.dump();
        const json& last = r["flight"]["last"];
        EXPECT_EQ(last.size(), static_cast<size_t>(issued[rank])) << r.dump();
        for (size_t i = 0; i < last.size(); ++i) {
            EXPECT_EQ(last[i]["collective"], "all_reduce") << last[i].dump();
            EXPECT_EQ(last[i]["count"], i + 1 == last.size() ? last_numel[rank] : job.numel) << last[i].dump();
            EXPECT_EQ(last[i]["dtype"], job.dtype) << last[i].dump();
        }
    }
    return comm["comm_id"];
}

// Rank 2 stuck in its data loader before step 2: ranks 0 and 1 issued step
// 2's all-reduce and wait for the GPU, which waits for rank 2.
TEST(HangDaemon, RealNcclOnAGpuARankOneAllReduceShortIsNamed) {
    REQUIRE_BPF();
    REQUIRE_CUDA_TORCH(py);
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--probes", "nccl"});
    HungJob job;
    start_hung(job, {py, kJob, "--backend", "nccl", "loader"});
    ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
    const int issued = job.hang_at + 1, stuck = job.stuck_rank();
    std::vector<int> want(3, issued), numel(3, job.numel);
    want.at(stuck) = issued - 1;
    const std::string id = real_nccl_comm(d, job, want, numel);
    ASSERT_FALSE(id.empty());
    const json report = hang_names_the_stuck_rank(d, tmp, job, id, issued);
    ASSERT_FALSE(report.empty());
    for (const json& r : report["ranks"]) {
        if (r["pid"] != job.stuck_pid) continue;
        const json at = r.value("at", json::object());
        EXPECT_EQ(at.value("function", ""), job.stuck_function) << r.dump().substr(0, 2000);
    }
    // Never stopped nor signalled: ranks 0 and 1 spin in CUDA's wait (R),
    // rank 2 sleeps (S), as before.
    for (int pid : job.rank_pids) {
        const char state = proc_state(pid);
        EXPECT_TRUE(state == 'R' || state == 'S') << pid << " is " << state;
    }
}

// Every rank issues step 2's all-reduce, rank 2 with twice the elements:
// the daemon counts the mismatch as the calls arrive, and hang names it with
// both signatures.
TEST(HangDaemon, RealNcclOnAGpuAnAllReduceWithAnotherCountIsAMismatch) {
    REQUIRE_BPF();
    REQUIRE_CUDA_TORCH(py);
    SharedDir tmp;
    START_DAEMON(d, tmp, {"--probes", "nccl"});
    HungJob job;
    start_hung(job, {py, kJob, "--backend", "nccl", "mismatch"}, {}, 0);
    ASSERT_NE(job.stuck_pid, 0) << "the job did not hang as planned";
    const uint64_t seen_ns = first_mismatch_seen(d);
    ASSERT_NE(seen_ns, 0u) << "commdbg_collective_mismatch_total never appeared";
    const int issued = job.hang_at + 1, stuck = job.stuck_rank();
    std::vector<int> numel(3, job.numel);
    numel.at(stuck) = 2 * job.numel;
    const std::string id = real_nccl_comm(d, job, std::vector<int>(3, issued), numel);
    ASSERT_FALSE(id.empty());
    const json report = hang_report(d, tmp, {job.launcher_pid});
    const json& v = report["verdict"];
    EXPECT_EQ(v["kind"], "collective_mismatch") << v.dump();
    EXPECT_EQ(v["seq"], issued) << v.dump();
    EXPECT_EQ(v["culprits"], json::array({job.stuck_pid})) << v.dump();
    std::vector<int> others;
    for (int pid : job.rank_pids)
        if (pid != job.stuck_pid) others.push_back(pid);
    EXPECT_EQ(v["signatures"],
              two_signatures("all_reduce count " + std::to_string(job.numel) + " " + job.dtype + " sum", others,
                             "all_reduce count " + std::to_string(2 * job.numel) + " " + job.dtype + " sum",
                             job.stuck_pid))
        << v.dump();
    ASSERT_NO_FATAL_FAILURE(expect_mismatch_counted(d, job.rank_pids, issued, seen_ns));
}

}  // namespace
}  // namespace commdbg::e2e
