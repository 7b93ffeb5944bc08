// SPDX-License-Identifier: Apache-2.0
// Acceptance (fleet): two commdbgd daemons stand for two nodes, each scoped
// to its own cgroup v2 directory and serving its own metrics port; a real
// Prometheus server (Debian's prometheus package) scrapes both.  Four ranks
// of one job run with known counts, two on each "node", and rank 3 stops
// early.  PromQL over the fleet must give exactly the totals the pattern
// implies, per collective and per node, and the lagging-rank query of
// docs/fleet.md must name rank 3 (and only it) with how far it is behind.
// A workload outside both cgroups must be counted by neither daemon.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

const std::string kCgroup2Root = "/sys/fs/cgroup/unified";
const std::string kPrometheus = "/usr/bin/prometheus";
const std::string kPromtool = "/usr/bin/promtool";
const std::string kFleetDoc = std::string(SOURCE_DIR) + "/docs/fleet.md";
constexpr long kCgroup2SuperMagic = 0x63677270;  // CGROUP2_SUPER_MAGIC

// ---- the queries: docs/fleet.md shows exactly these strings ----------------
const std::string kQueryByCollective = "sum by (collective) (commdbg_collective_calls_total)";
const std::string kQueryByNode = "sum by (instance) (commdbg_collective_calls_total)";
const std::string kQueryRanksPerNode = "sum by (instance, env_rank) (commdbg_collective_calls_total)";
const std::string kQueryJobByRank =
    "sum by (env_slurm_job_id, env_rank) (commdbg_collective_calls_total{env_slurm_job_id!=\"\"})";
const std::string kQueryLaggingRank =
    "max by (comm) (sum by (comm, rank) (commdbg_collective_calls_total))"
    " - on (comm) group_right"
    " sum by (comm, rank, instance) (commdbg_collective_calls_total) > 0";
const std::string kQueryBytesByCollective = "sum by (collective) (commdbg_collective_bytes_total)";
const std::string kQueryBytesRate = "sum by (instance, collective) (rate(commdbg_collective_bytes_total[1m]))";

bool is_cgroup2_mount(const std::string& path) {
    struct statfs fs {};
    return statfs(path.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == kCgroup2SuperMagic;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A port nobody listens on now: the kernel's pick for port 0, bound without
// SO_REUSEPORT so a port another listener holds is never handed out.

std::string url_encode(const std::string& s) {
    static const char* hexd = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += hexd[c >> 4];
            out += hexd[c & 15];
        }
    }
    return out;
}

struct HttpReply {
    int status = 0;  // 0: no answer
    std::string body;
    std::string error;
};

// HTTP/1.0 GET on 127.0.0.1:port; the server closes after the answer.
HttpReply http_get(int port, const std::string& target, int timeout_ms = 3000) {
    HttpReply r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        r.error = std::string("socket: ") + strerror(errno);
        return r;
    }
    struct timeval tv {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        r.error = "connect 127.0.0.1:" + std::to_string(port) + ": " + strerror(errno);
        close(fd);
        return r;
    }
    std::string req = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) +
                      "\r\nAccept: */*\r\nConnection: close\r\n\r\n";
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
        r.error = std::string("send: ") + strerror(errno);
        close(fd);
        return r;
    }
    std::string resp;
    char buf[65536];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n > 0) {
            resp.append(buf, static_cast<size_t>(n));
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) r.error = std::string("recv: ") + strerror(errno);
        break;
    }
    close(fd);
    size_t sp = resp.find(' ');
    size_t hdr_end = resp.find("\r\n\r\n");
    if (resp.rfind("HTTP/", 0) != 0 || sp == std::string::npos || hdr_end == std::string::npos) {
        if (r.error.empty()) r.error = "not an HTTP answer: " + resp.substr(0, 200);
        return r;
    }
    r.status = atoi(resp.c_str() + sp + 1);
    r.body = resp.substr(hdr_end + 4);
    return r;
}

// ---- RAII guards: everything goes away even when an assertion fails ------

// A cgroup v2 directory of ours; at the end its remaining processes (only
// ever ours) are killed and the directory removed.
class Cgroup {
public:
    explicit Cgroup(std::string path) : path_(std::move(path)) {
        if (mkdir(path_.c_str(), 0755) != 0) error_ = "mkdir " + path_ + ": " + strerror(errno);
    }
    ~Cgroup() {
        if (!error_.empty()) return;
        auto deadline = Clock::now() + std::chrono::seconds(10);
        for (;;) {
            std::ifstream procs(path_ + "/cgroup.procs");
            int pid;
            while (procs >> pid) kill(pid, SIGKILL);
            if (rmdir(path_.c_str()) == 0 || errno == ENOENT) return;
            if (Clock::now() > deadline) {
                ADD_FAILURE() << "cannot remove " << path_ << ": " << strerror(errno);
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    Cgroup(const Cgroup&) = delete;
    Cgroup& operator=(const Cgroup&) = delete;
    const std::string& path() const { return path_; }
    const std::string& error() const { return error_; }

private:
    std::string path_;
    std::string error_;
};

// A long-running server: SIGTERM and a bounded wait first (a clean shutdown
// of a daemon detaches its probes), then Background's SIGKILL.
class Server {
public:
    Server(std::string name, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {})
        : name_(std::move(name)), proc_(std::make_unique<Background>(argv, env)) {}
    ~Server() { stop(); }
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;
    int pid() const { return proc_->pid(); }
    bool alive() const {
        char st = proc_state(proc_->pid());
        return st != 0 && st != 'Z' && st != 'X';
    }
    ProcResult stop() {
        if (!stopped_) {
            stopped_ = true;
            kill(proc_->pid(), SIGTERM);
            result_ = proc_->wait(10);
        }
        return result_;
    }
    const std::string& name() const { return name_; }

private:
    std::string name_;
    std::unique_ptr<Background> proc_;
    bool stopped_ = false;
    ProcResult result_;
};



// A rank's stdout: a FIFO whose buffer the test fills before the rank starts,
// so the rank makes all its calls and then blocks writing its report at exit,
// alive, like a real rank waiting for the next step (or, for rank 3, hung).
// release() drains it: the rank exits and its report comes back.
class HeldStdout {
public:
    explicit HeldStdout(std::string path) : path_(std::move(path)) {
        if (mkfifo(path_.c_str(), 0600) != 0) {
            error_ = "mkfifo " + path_ + ": " + strerror(errno);
            return;
        }
        rfd_ = open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        int wfd = open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (rfd_ < 0 || wfd < 0) {
            error_ = "open " + path_ + ": " + strerror(errno);
            if (wfd >= 0) close(wfd);
            return;
        }
        std::string chunk(4096, '.');
        for (;;) {
            ssize_t n = write(wfd, chunk.data(), chunk.size());
            if (n > 0) filled_ += static_cast<size_t>(n);
            else break;  // EAGAIN: full
        }
        close(wfd);
    }
    ~HeldStdout() {
        if (rfd_ >= 0) close(rfd_);
    }
    HeldStdout(const HeldStdout&) = delete;
    HeldStdout& operator=(const HeldStdout&) = delete;
    const std::string& path() const { return path_; }
    const std::string& error() const { return error_; }
    // Reads until every writer is gone (or timeout); returns what the rank wrote.
    std::string release(int timeout_ms) {
        std::string all;
        bool writer_seen = false;
        auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        char buf[65536];
        while (rfd_ >= 0 && Clock::now() < deadline) {
            ssize_t n = read(rfd_, buf, sizeof(buf));
            if (n > 0) {
                all.append(buf, static_cast<size_t>(n));
                writer_seen = writer_seen || all.size() > filled_;
            } else if (n == 0 && (writer_seen || all.size() >= filled_)) {
                break;  // EOF: the rank closed its stdout (exited)
            } else {
                struct pollfd p {rfd_, POLLIN, 0};
                poll(&p, 1, 20);
            }
        }
        return all.size() > filled_ ? all.substr(filled_) : std::string();
    }

private:
    std::string path_, error_;
    int rfd_ = -1;
    size_t filled_ = 0;
};

// "processes counted: N" of `commdbg status`, or -1.
int processes_counted(const std::string& socket) {
    ProcResult st = run({commdbg_bin(), "status", "--json", "--socket", socket}, {}, 10);
    json j = json::parse(st.out, nullptr, false);
    if (!j.is_object()) return -1;
    const json& body = j.contains("processes") ? j : j.value("result", json::object());
    return body.contains("processes") && body["processes"].is_number() ? body["processes"].get<int>() : -1;
}

// ---- Prometheus HTTP API ---------------------------------------------------

struct Sample {
    std::map<std::string, std::string> labels;
    double value = 0;
};

struct QueryReply {
    bool ok = false;
    std::string error;  // why not ok
    std::vector<Sample> samples;
    std::string raw;
};

QueryReply prom_query(int port, const std::string& q) {
    QueryReply r;
    HttpReply h = http_get(port, "/api/v1/query?query=" + url_encode(q));
    r.raw = h.body;
    if (h.status != 200) {
        r.error = "HTTP " + std::to_string(h.status) + " " + h.error + " " + h.body;
        return r;
    }
    json j = json::parse(h.body, nullptr, false);
    if (!j.is_object() || j.value("status", "") != "success" || !j.contains("data")) {
        r.error = "bad answer: " + h.body;
        return r;
    }
    const json& data = j["data"];
    if (data.value("resultType", "") != "vector") {
        r.error = "not an instant vector: " + h.body;
        return r;
    }
    for (const auto& s : data["result"]) {
        Sample smp;
        for (auto& [k, v] : s["metric"].items()) smp.labels[k] = v.get<std::string>();
        smp.value = std::stod(s["value"][1].get<std::string>());
        r.samples.push_back(std::move(smp));
    }
    r.ok = true;
    return r;
}

// {label value -> sample value} of a query grouped by one label.
std::map<std::string, double> by_label(const QueryReply& r, const std::string& label) {
    std::map<std::string, double> m;
    for (const auto& s : r.samples) {
        auto it = s.labels.find(label);
        m[it == s.labels.end() ? "" : it->second] = s.value;
    }
    return m;
}

// The same, keyed by two labels joined with '/'.
std::map<std::string, double> by_labels(const QueryReply& r, const std::string& l1, const std::string& l2) {
    std::map<std::string, double> m;
    for (const auto& s : r.samples) {
        auto a = s.labels.find(l1), b = s.labels.find(l2);
        m[(a == s.labels.end() ? "" : a->second) + "/" + (b == s.labels.end() ? "" : b->second)] = s.value;
    }
    return m;
}

std::string show(const std::map<std::string, double>& m) {
    std::string s = "{";
    for (const auto& [k, v] : m) s += (s.size() > 1 ? ", " : "") + k + ": " + std::to_string(static_cast<long long>(v));
    return s + "}";
}

// ---- the job -------------------------------------------------------------

constexpr int kK = 40;         // all_reduce calls of a rank that keeps up
constexpr int kBehind = 5;     // all_reduce calls rank 3 never makes
constexpr int kCount = 1024;   // elements per call, float32
constexpr int kSeed = 4242;    // --init-seed: one communicator id for all ranks
constexpr int kWorldSize = 4;

struct RankPlan {
    int rank;
    int node;  // 0: node A, 1: node B
    int all_reduce;
    int all_gather;
    int total() const { return all_reduce + all_gather; }
};

std::vector<RankPlan> job_plan() {
    std::vector<RankPlan> p;
    for (int r = 0; r < kWorldSize; ++r) p.push_back({r, r < 2 ? 0 : 1, r == 3 ? kK - kBehind : kK, kK / 2});
    return p;
}

TEST(Fleet, PrometheusAggregatesTwoNodesAndFindsTheLaggingRank) {
    REQUIRE_BPF();
    REQUIRE_OR_SKIP(access(kPrometheus.c_str(), X_OK) == 0,
                    kPrometheus + " is missing (Debian package prometheus)");
    REQUIRE_OR_SKIP(is_cgroup2_mount(kCgroup2Root), "no cgroup v2 mount at " + kCgroup2Root);
    const auto t0 = Clock::now();

    TempDir tmp;
    const std::string tag = "commdbg-test-" + std::to_string(getpid());
    Cgroup cg_a(kCgroup2Root + "/" + tag + "-a");
    Cgroup cg_b(kCgroup2Root + "/" + tag + "-b");
    ASSERT_TRUE(cg_a.error().empty()) << cg_a.error();
    ASSERT_TRUE(cg_b.error().empty()) << cg_b.error();
    const Cgroup* cgs[2] = {&cg_a, &cg_b};

    // ---- two nodes: a daemon per cgroup, each with its own metrics port ----
    int mport[2] = {free_loopback_port(), free_loopback_port()};
    while (mport[1] == mport[0]) mport[1] = free_loopback_port();
    ASSERT_GT(mport[0], 0);
    ASSERT_GT(mport[1], 0);
    const char* node_name[2] = {"A", "B"};
    std::vector<std::unique_ptr<Server>> daemons;
    std::string sock[2];
    for (int n = 0; n < 2; ++n) {
        sock[n] = tmp.path(std::string("commdbgd-") + node_name[n] + ".sock");
        daemons.push_back(std::make_unique<Server>(
            std::string("commdbgd ") + node_name[n],
            std::vector<std::string>{commdbgd_bin(), "--scope-cgroup", cgs[n]->path(), "--metrics-listen",
                                     "127.0.0.1:" + std::to_string(mport[n]), "--socket", sock[n],
                                     "--series-ttl", "600"}));
    }
    for (int n = 0; n < 2; ++n) {
        ProcResult st;
        auto deadline = Clock::now() + std::chrono::seconds(20);
        while (Clock::now() < deadline) {
            st = run({commdbg_bin(), "status", "--socket", sock[n]}, {}, 10);
            if (st.status == 0 || !daemons[n]->alive()) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        ASSERT_EQ(st.status, 0) << daemons[n]->name() << " never answered `commdbg status`:\n"
                                << st.out << st.err << "\ndaemon: " << daemons[n]->stop().err;
        EXPECT_NE(st.out.find(cgs[n]->path()), std::string::npos) << "status does not name its scope:\n" << st.out;
        HttpReply m = http_get(mport[n], "/metrics");
        ASSERT_EQ(m.status, 200) << daemons[n]->name() << " /metrics: " << m.error;
    }

    // ---- Prometheus scraping both, every second ----------------------------
    int pport = free_loopback_port();
    while (pport == mport[0] || pport == mport[1]) pport = free_loopback_port();
    const std::string target[2] = {"127.0.0.1:" + std::to_string(mport[0]), "127.0.0.1:" + std::to_string(mport[1])};
    {
        std::ofstream y(tmp.path("prometheus.yml"));
        y << "global:\n"
             "  scrape_interval: 1s\n"
             "  scrape_timeout: 1s\n"
             "  evaluation_interval: 1s\n"
             "scrape_configs:\n"
             "  - job_name: commdbg\n"
             "    scrape_interval: 1s\n"
             "    static_configs:\n"
             "      - targets: ['"
          << target[0] << "', '" << target[1] << "']\n";
    }
    const std::string prom_log = tmp.path("prometheus.log");
    Server prom("prometheus",
                {"/bin/sh", "-c", "exec \"$0\" \"$@\" >\"$PROM_LOG\" 2>&1", kPrometheus,
                 "--config.file=" + tmp.path("prometheus.yml"), "--storage.tsdb.path=" + tmp.path("tsdb"),
                 "--web.listen-address=127.0.0.1:" + std::to_string(pport), "--log.level=info"},
                {{"PROM_LOG", prom_log}});
    auto prom_diag = [&] {
        std::string log = read_text(prom_log);
        return "\nprometheus log (tail):\n" + (log.size() > 4000 ? log.substr(log.size() - 4000) : log) + "\n";
    };

    // Both targets up.
    {
        std::string last;
        int up = 0;
        auto deadline = Clock::now() + std::chrono::seconds(20);
        while (Clock::now() < deadline && prom.alive()) {
            HttpReply h = http_get(pport, "/api/v1/targets?state=active");
            last = h.status ? h.body : h.error;
            json j = json::parse(h.body, nullptr, false);
            up = 0;
            if (j.is_object() && j.contains("data"))
                for (const auto& t : j["data"]["activeTargets"])
                    if (t.value("health", "") == "up") ++up;
            if (up == 2) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        ASSERT_EQ(up, 2) << "Prometheus never had both targets up; last /api/v1/targets: " << last << prom_diag();
    }

    // ---- the job: 4 ranks, 2 per node, rank 3 stops early ------------------
    const auto plan = job_plan();
    const std::string job_id = "fleet-" + std::to_string(getpid());
    std::vector<std::unique_ptr<HeldStdout>> held;
    std::vector<std::unique_ptr<Background>> ranks;
    for (const auto& p : plan) {
        // Real ranks stay alive while they are scraped; these would finish in
        // a millisecond.  Each is held alive after its calls (HeldStdout) until
        // its daemon counts it: commdbgd reads a process's environment (the
        // env_* labels) when it adopts it, which for a process that maps an
        // already-attached libnccl is at its next refresh (every 500 ms); a
        // process gone by then keeps empty env_* labels (docs/fleet.md,
        // "Known issues").
        held.push_back(std::make_unique<HeldStdout>(tmp.path("rank" + std::to_string(p.rank) + ".out")));
        ASSERT_TRUE(held.back()->error().empty()) << held.back()->error();
        auto env = nccl_env(false);
        env["RANK"] = std::to_string(p.rank);
        env["LOCAL_RANK"] = std::to_string(p.rank % 2);
        env["WORLD_SIZE"] = std::to_string(kWorldSize);
        env["SLURM_JOB_ID"] = job_id;
        env["HELD_STDOUT"] = held.back()->path();
        // sh puts itself into the node's cgroup, then execs the rank: every
        // NCCL call, and the library load before them, happens inside it.
        std::string calls = "all_reduce=" + std::to_string(p.all_reduce) + ",all_gather=" + std::to_string(p.all_gather);
        ranks.push_back(std::make_unique<Background>(
            std::vector<std::string>{
                "/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\" > \"$HELD_STDOUT\"", cgs[p.node]->path() + "/cgroup.procs",
                testprog("nccl_workload"), "--calls", calls, "--count", std::to_string(kCount), "--dtype", "float32",
                "--init-seed", std::to_string(kSeed), "--nranks", std::to_string(kWorldSize), "--rank",
                std::to_string(p.rank)},
            env));
    }
    // And one in neither cgroup: neither daemon may count it.
    auto outside_env = nccl_env(false);
    outside_env["RANK"] = "99";
    outside_env["WORLD_SIZE"] = "100";
    Background outside({testprog("nccl_workload"), "--calls", "all_reduce=11,broadcast=7", "--init-seed", "77",
                        "--nranks", "2", "--rank", "1"},
                       outside_env);
    // Each daemon counts its two ranks (they are alive, blocked after their calls).
    for (int n = 0; n < 2; ++n) {
        int counted = -1;
        auto until = Clock::now() + std::chrono::seconds(15);
        while (Clock::now() < until && (counted = processes_counted(sock[n])) != 2)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(counted, 2) << daemons[n]->name() << " does not count its two ranks";
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
        std::string out = held[i]->release(15000);
        ProcResult r = ranks[i]->wait(30);
        ASSERT_EQ(r.status, 0) << "rank " << plan[i].rank << ": " << out << r.err;
        json rep = workload_report(out);
        ASSERT_TRUE(rep.is_object()) << "rank " << plan[i].rank << " stdout: " << out;
        EXPECT_EQ(rep["calls"]["all_reduce"].get<int>(), plan[i].all_reduce);
        EXPECT_EQ(rep["calls"]["all_gather"].get<int>(), plan[i].all_gather);
    }
    ProcResult outside_r = outside.wait(30);
    ASSERT_EQ(outside_r.status, 0) << outside_r.out << outside_r.err;
    const std::string outside_pid = std::to_string(outside.pid());

    // ---- what the fleet must add up to, from the plan ----------------------
    std::map<std::string, double> want_by_coll, want_by_node, want_ranks_per_node, want_job_by_rank, want_bytes;
    int max_total = 0;
    for (const auto& p : plan) {
        want_by_coll["all_reduce"] += p.all_reduce;
        want_by_coll["all_gather"] += p.all_gather;
        want_bytes["all_reduce"] += 4.0 * kCount * p.all_reduce;
        want_bytes["all_gather"] += 4.0 * kCount * p.all_gather;
        want_by_node[target[p.node]] += p.total();
        want_ranks_per_node[target[p.node] + "/" + std::to_string(p.rank)] += p.total();
        want_job_by_rank[job_id + "/" + std::to_string(p.rank)] += p.total();
        max_total = std::max(max_total, p.total());
    }
    std::map<std::string, double> want_lag;  // rank -> calls behind the furthest rank of its communicator
    std::map<std::string, std::string> want_lag_instance;
    for (const auto& p : plan)
        if (p.total() < max_total) {
            want_lag[std::to_string(p.rank)] = max_total - p.total();
            want_lag_instance[std::to_string(p.rank)] = target[p.node];
        }
    ASSERT_EQ(want_lag.size(), 1u);  // the plan: only rank 3 is behind

    // What each daemon says about itself, for failure messages.
    auto daemons_diag = [&] {
        std::string d;
        for (int n = 0; n < 2; ++n) {
            ProcResult st = run({commdbg_bin(), "status", "--socket", sock[n]}, {}, 10);
            HttpReply m = http_get(mport[n], "/metrics");
            d += "\n--- " + daemons[n]->name() + " (" + target[n] + ") status:\n" + st.out + st.err +
                 "--- its /metrics, calls:\n";
            std::istringstream lines(m.body);
            for (std::string l; std::getline(lines, l);)
                if (l.rfind("commdbg_collective_calls_total{", 0) == 0) d += l + "\n";
        }
        return d;
    };

    // ---- poll until Prometheus has the final counts (at most ~30 s) --------
    QueryReply by_coll;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
        by_coll = prom_query(pport, kQueryByCollective);
        if (by_coll.ok && by_label(by_coll, "collective") == want_by_coll) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    // One more scrape interval: a count still rising would show as a change.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    by_coll = prom_query(pport, kQueryByCollective);
    ASSERT_TRUE(by_coll.ok) << by_coll.error;
    std::cout << "[fleet] " << kQueryByCollective << " => " << show(by_label(by_coll, "collective")) << "\n";
    EXPECT_EQ(by_label(by_coll, "collective"), want_by_coll)
        << kQueryByCollective << "\n got  " << show(by_label(by_coll, "collective")) << "\n want "
        << show(want_by_coll) << "\n raw: " << by_coll.raw << daemons_diag();

    QueryReply by_node = prom_query(pport, kQueryByNode);
    ASSERT_TRUE(by_node.ok) << by_node.error;
    std::cout << "[fleet] " << kQueryByNode << " => " << show(by_label(by_node, "instance")) << "\n";
    EXPECT_EQ(by_label(by_node, "instance"), want_by_node) << kQueryByNode << "\n raw: " << by_node.raw;

    // Each node counted its own two ranks and nothing else.
    QueryReply rpn = prom_query(pport, kQueryRanksPerNode);
    ASSERT_TRUE(rpn.ok) << rpn.error;
    std::cout << "[fleet] " << kQueryRanksPerNode << " => " << show(by_labels(rpn, "instance", "env_rank")) << "\n";
    EXPECT_EQ(by_labels(rpn, "instance", "env_rank"), want_ranks_per_node)
        << kQueryRanksPerNode << "\n raw: " << rpn.raw;

    QueryReply job = prom_query(pport, kQueryJobByRank);
    ASSERT_TRUE(job.ok) << job.error;
    std::cout << "[fleet] " << kQueryJobByRank << " => " << show(by_labels(job, "env_slurm_job_id", "env_rank"))
              << "\n";
    EXPECT_EQ(by_labels(job, "env_slurm_job_id", "env_rank"), want_job_by_rank) << kQueryJobByRank << "\n raw: " << job.raw;

    // The lagging rank: exactly rank 3, on node B, kBehind calls behind.
    QueryReply lag = prom_query(pport, kQueryLaggingRank);
    ASSERT_TRUE(lag.ok) << lag.error;
    std::cout << "[fleet] " << kQueryLaggingRank << " => " << show(by_labels(lag, "rank", "instance")) << "\n";
    EXPECT_EQ(by_label(lag, "rank"), want_lag) << kQueryLaggingRank << "\n raw: " << lag.raw;
    for (const auto& s : lag.samples) {
        EXPECT_EQ(s.labels.count("comm"), 1u) << "the lagging rank's communicator is not named: " << lag.raw;
        auto rank = s.labels.find("rank"), inst = s.labels.find("instance");
        ASSERT_TRUE(rank != s.labels.end() && inst != s.labels.end()) << lag.raw;
        EXPECT_EQ(inst->second, want_lag_instance[rank->second]) << "wrong node for the lagging rank: " << lag.raw;
    }

    QueryReply bytes = prom_query(pport, kQueryBytesByCollective);
    ASSERT_TRUE(bytes.ok) << bytes.error;
    std::cout << "[fleet] " << kQueryBytesByCollective << " => " << show(by_label(bytes, "collective")) << "\n";
    EXPECT_EQ(by_label(bytes, "collective"), want_bytes) << kQueryBytesByCollective << "\n raw: " << bytes.raw;
    QueryReply rate = prom_query(pport, kQueryBytesRate);
    EXPECT_TRUE(rate.ok) << kQueryBytesRate << ": " << rate.error;

    // ---- the workload outside both cgroups: in neither daemon's metrics -----
    QueryReply out_q = prom_query(pport, "count(commdbg_collective_calls_total{env_rank=\"99\"})");
    ASSERT_TRUE(out_q.ok) << out_q.error;
    EXPECT_TRUE(out_q.samples.empty()) << "a process outside both cgroups was counted: " << out_q.raw;
    for (int n = 0; n < 2; ++n) {
        HttpReply m = http_get(mport[n], "/metrics");
        ASSERT_EQ(m.status, 200) << m.error;
        EXPECT_EQ(m.body.find("pid=\"" + outside_pid + "\""), std::string::npos)
            << daemons[n]->name() << " counted pid " << outside_pid << " from outside its cgroup:\n" << m.body;
        EXPECT_EQ(m.body.find("collective=\"broadcast\""), std::string::npos) << daemons[n]->name() << ":\n" << m.body;
    }

    // ---- shut down in order; the cgroups go when their guards do -----------
    prom.stop();
    for (int n = 1; n >= 0; --n) {
        ProcResult r = daemons[n]->stop();
        EXPECT_EQ(r.status, 0) << daemons[n]->name() << " did not stop cleanly: " << r.err;
        // What it logged (a rank it could not stop, ...), where anything failed.
        if (::testing::Test::HasFailure()) std::cout << "--- " << daemons[n]->name() << "'s log:\n" << r.err;
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << "[fleet] took " << secs << " s\n";
    EXPECT_LT(secs, 60.0);
}

// docs/fleet.md shows the very queries the test above runs, and its example
// prometheus.yml passes `promtool check config`.
TEST(Fleet, DocsShowTheQueriesTheTestUses) {
    std::string doc = read_text(kFleetDoc);
    ASSERT_FALSE(doc.empty()) << "cannot read " << kFleetDoc;
    for (const auto* q : {&kQueryByCollective, &kQueryByNode, &kQueryRanksPerNode, &kQueryJobByRank,
                          &kQueryLaggingRank, &kQueryBytesByCollective, &kQueryBytesRate})
        EXPECT_NE(doc.find(*q), std::string::npos) << kFleetDoc << " does not show the query\n  " << *q;

    // The first ```yaml block is the example prometheus.yml.
    size_t at = doc.find("```yaml\n");
    ASSERT_NE(at, std::string::npos) << "no ```yaml block in " << kFleetDoc;
    size_t end = doc.find("```", at + 8);
    ASSERT_NE(end, std::string::npos);
    REQUIRE_OR_SKIP(access(kPromtool.c_str(), X_OK) == 0, kPromtool + " is missing (Debian package prometheus)");
    TempDir tmp;
    std::ofstream(tmp.path("prometheus.yml")) << doc.substr(at + 8, end - at - 8);
    ProcResult r = run({kPromtool, "check", "config", tmp.path("prometheus.yml")}, {}, 30);
    EXPECT_EQ(r.status, 0) << "promtool check config on the example in " << kFleetDoc << ":\n" << r.out << r.err;
}

}  // namespace
}  // namespace commdbg::e2e
