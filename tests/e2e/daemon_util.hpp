// SPDX-License-Identifier: Apache-2.0
// Helpers for tests that run commdbgd for real: a daemon per test on its own
// socket and port, the CLI against it (also as uid 65534), scrapes of
// /metrics, workloads held until the test reads their counts, BPF links and
// maps of a process, raw control-socket connections.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "e2e_util.hpp"

extern char** environ;

namespace commdbg::e2e::daemon_util {


using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Distinct counts per kind so a swapped or merged kind shows.
const std::vector<std::pair<std::string, int>> kPattern = {
    {"all_reduce", 13}, {"broadcast", 7}, {"all_gather", 5}, {"send", 3}, {"recv", 2},
};

const std::vector<std::string> kProgramNames = {"call_enter", "call_exit",    "dl_debug_state", "on_fork",
                                                "on_exit",    "on_mmap_file", "on_exec"};

const std::vector<std::string> kAsNobody = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
constexpr uint32_t kNobody = 65534;


inline int total_of(const std::vector<std::pair<std::string, int>>& pattern) {
    int t = 0;
    for (const auto& [k, n] : pattern) t += n;
    return t;
}


inline void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

inline std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}


inline bool alive(int pid) {
    char st = proc_state(pid);
    return st != 0 && st != 'Z' && st != 'X';
}

// ---- the CLI ------------------------------------------------------------------

inline ProcResult cli(const std::vector<std::string>& args, bool as_nobody = false, int timeout_s = 60) {
    std::vector<std::string> argv = as_nobody ? kAsNobody : std::vector<std::string>{};
    argv.push_back(commdbg_bin());
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, {}, timeout_s);
}

// `commdbg ARGS --json`, parsed; a failure is a test failure with stderr.
inline json cli_json(const std::vector<std::string>& args, bool as_nobody = false) {
    auto r = cli(concat(args, {"--json"}), as_nobody);
    EXPECT_EQ(r.status, 0) << "commdbg " << ::testing::PrintToString(args) << ": " << r.err;
    auto j = json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << "commdbg " << ::testing::PrintToString(args) << " printed: " << r.out;
    return j.is_object() ? j : json::object();
}

// ---- the daemon ---------------------------------------------------------------

// A commdbgd of this test.  SIGTERM and a bounded wait at the end (a clean
// shutdown detaches), then Background's SIGKILL.
class Daemon {
public:
    Daemon(std::string socket, int port, const std::vector<std::string>& extra = {},
           const std::map<std::string, std::string>& env = {})
        : socket_(std::move(socket)), port_(port) {
        std::vector<std::string> argv = {commdbgd_bin(), "--socket", socket_, "--metrics-listen",
                                         "127.0.0.1:" + std::to_string(port_)};
        argv.insert(argv.end(), extra.begin(), extra.end());
        proc_ = std::make_unique<Background>(argv, env);
    }
    ~Daemon() { stop(SIGTERM, 10); }
    Daemon(const Daemon&) = delete;
    Daemon& operator=(const Daemon&) = delete;

    // Until `commdbg status --socket S` succeeds; empty, or why not.
    std::string wait_ready(int timeout_s = 60) {
        auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
        std::string last;
        while (Clock::now() < deadline) {
            if (!alive(pid())) {
                auto r = proc_->wait(5);
                stopped_ = true;
                return "commdbgd exited with status " + std::to_string(r.status) + ": " + r.err;
            }
            auto r = cli({"status", "--socket", socket_}, false, 10);
            if (r.status == 0) return {};
            last = r.err;
            sleep_ms(100);
        }
        return "commdbg status never succeeded: " + last;
    }

    // Sends SIG, waits up to timeout_s; *seconds: how long it took to exit.
    ProcResult stop(int sig, int timeout_s, double* seconds = nullptr) {
        if (stopped_) return result_;
        stopped_ = true;
        auto t0 = Clock::now();
        kill(proc_->pid(), sig);
        result_ = proc_->wait(timeout_s);
        if (seconds) *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        return result_;
    }

    int pid() const { return proc_->pid(); }
    int port() const { return port_; }
    const std::string& socket() const { return socket_; }

private:
    std::string socket_;
    int port_;
    std::unique_ptr<Background> proc_;
    bool stopped_ = false;
    ProcResult result_;
};

// A temp dir that uid 65534 may enter and write into (mkdtemp makes 0700).
struct SharedDir {
    TempDir tmp;
    SharedDir() { chmod(tmp.path("").c_str(), 0777); }
    std::string path(const std::string& name) const { return tmp.path(name); }
};

#define START_DAEMON(var, dir, ...)                                                  \
    Daemon var((dir).path("commdbgd.sock"), free_loopback_port(), ##__VA_ARGS__);   \
    do {                                                                             \
        std::string why_ = var.wait_ready();                                         \
        ASSERT_TRUE(why_.empty()) << why_;                                           \
    } while (0)

// ---- uid 65534 ---------------------------------------------------------------

// uid 65534 must be able to run the binaries and load the stub; where
// build/ is not readable for it, copies in a world-readable dir are used.
struct NobodyBins {
    std::string commdbg, workload, sleeper, flood, stub_dir;
    std::unique_ptr<SharedDir> copies;
};

inline NobodyBins nobody_bins() {
    NobodyBins b{commdbg_bin(),        testprog("nccl_workload"), testprog("plain_sleeper"),
                 testprog("counter_flood"), STUB_NCCL_DIR,             nullptr};
    auto ok = run(concat(kAsNobody, {"/bin/sh", "-c",
                                     "test -x \"$0\" && test -x \"$1\" && test -x \"$2\" && test -x \"$3\" && "
                                     "test -r \"$4\"",
                                     b.commdbg, b.workload, b.sleeper, b.flood, b.stub_dir + "/libnccl.so.2"}));
    if (ok.status == 0) return b;
    b.copies = std::make_unique<SharedDir>();
    namespace fs = std::filesystem;
    auto copy = [&](const std::string& from) {
        std::string to = b.copies->path(fs::path(from).filename());
        fs::copy_file(from, to, fs::copy_options::overwrite_existing);
        chmod(to.c_str(), 0755);
        return to;
    };
    b.commdbg = copy(commdbg_bin());
    b.workload = copy(testprog("nccl_workload"));
    b.sleeper = copy(testprog("plain_sleeper"));
    b.flood = copy(testprog("counter_flood"));
    fs::copy_file(fs::canonical(lib_path(false)), b.copies->path("libnccl.so.2"));
    chmod(b.copies->path("libnccl.so.2").c_str(), 0755);
    b.stub_dir = b.copies->path("");
    return b;
}

// The stub-NCCL workload run as uid 65534 with `args`: its argv and environment.
inline std::vector<std::string> nobody_workload(const NobodyBins& b, const std::vector<std::string>& args) {
    return concat(concat(kAsNobody, {b.workload}), args);
}
inline std::map<std::string, std::string> nobody_env(const NobodyBins& b) { return {{"LD_LIBRARY_PATH", b.stub_dir}}; }

inline ProcResult cli_as_nobody(const NobodyBins& b, const std::vector<std::string>& args, int timeout_s = 60) {
    return run(concat(concat(kAsNobody, {b.commdbg}), args), {}, timeout_s);
}

// ---- /metrics -----------------------------------------------------------------

// GET over plain HTTP/1.0; the body, or empty with *status != 200.
inline std::string http_get(int port, const std::string& target, int* status = nullptr) {
    if (status) *status = -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return {};
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(fd);
        return {};
    }
    std::string req = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    (void)!send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string resp;
    char buf[65536];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        resp.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    size_t sp = resp.find(' ');
    if (status && sp != std::string::npos) *status = atoi(resp.c_str() + sp + 1);
    size_t body = resp.find("\r\n\r\n");
    return body == std::string::npos ? std::string() : resp.substr(body + 4);
}

struct Sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
};

// Prometheus text format, the subset commdbgd writes.
inline std::vector<Sample> parse_metrics(const std::string& text) {
    std::vector<Sample> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        Sample s;
        size_t i = 0;
        while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
        if (i < line.size() && line[i] == '{') {
            ++i;
            while (i < line.size() && line[i] != '}') {
                std::string key;
                while (i < line.size() && line[i] != '=') key += line[i++];
                i += 2;  // ="
                std::string val;
                while (i < line.size() && line[i] != '"') {
                    if (line[i] == '\\' && i + 1 < line.size()) {
                        ++i;
                        val += line[i] == 'n' ? '\n' : line[i];
                    } else {
                        val += line[i];
                    }
                    ++i;
                }
                ++i;  // closing quote
                if (i < line.size() && line[i] == ',') ++i;
                s.labels[key] = val;
            }
            ++i;  // }
        }
        s.value = strtod(line.c_str() + i, nullptr);
        out.push_back(std::move(s));
    }
    return out;
}

inline std::vector<Sample> scrape(int port) {
    int status = 0;
    std::string body = http_get(port, "/metrics", &status);
    EXPECT_EQ(status, 200) << "GET /metrics";
    return parse_metrics(body);
}

// metric summed per collective over the series of one pid.
inline std::map<std::string, long> sum_by_collective(const std::vector<Sample>& samples, const std::string& metric,
                                              int pid) {
    std::map<std::string, long> m;
    for (const auto& s : samples)
        if (s.name == metric && s.labels.count("pid") && s.labels.at("pid") == std::to_string(pid))
            m[s.labels.at("collective")] += static_cast<long>(s.value);
    return m;
}

inline size_t count_series(const std::vector<Sample>& samples, const std::string& metric) {
    size_t n = 0;
    for (const auto& s : samples) n += s.name == metric;
    return n;
}

inline std::map<std::string, long> expected_map(const std::vector<std::pair<std::string, int>>& pattern,
                                         const std::string& prefix = "") {
    std::map<std::string, long> m;
    for (const auto& [k, n] : pattern) m[prefix + k] = n;
    return m;
}

// Polls /metrics until the pid's calls per collective equal `want` (or
// timeout); returns the last value seen.
inline std::map<std::string, long> metrics_calls_settled(int port, int pid, const std::map<std::string, long>& want,
                                                  int timeout_ms = 5000) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::map<std::string, long> got;
    do {
        got = sum_by_collective(scrape(port), "commdbg_collective_calls_total", pid);
        if (got == want) break;
        sleep_ms(100);
    } while (Clock::now() < deadline);
    return got;
}

// ---- `commdbg counts` ---------------------------------------------------------

inline json process_entry(const json& counts, int pid) {
    for (const auto& p : counts.value("processes", json::array()))
        if (p.value("pid", 0) == pid) return p;
    return json();
}

inline std::map<std::string, long> comm_counts_of(const json& proc) {
    std::map<std::string, long> m;
    if (!proc.is_object()) return m;
    const json cc = proc.value("comm_counts", json::object());  // (a local: items() of a temporary dangles)
    for (const auto& [k, v] : cc.items()) m[k] = v.get<long>();
    return m;
}

// Polls `commdbg counts --pid P --json` until the counts equal `want` (or
// timeout); returns the last counts seen.
inline std::map<std::string, long> daemon_counts_settled(const Daemon& d, int pid, const std::map<std::string, long>& want,
                                                  bool as_nobody = false, int timeout_ms = 5000) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::map<std::string, long> got;
    do {
        auto j = cli_json({"counts", "--socket", d.socket(), "--pid", std::to_string(pid)}, as_nobody);
        got = comm_counts_of(process_entry(j, pid));
        if (got == want) break;
        sleep_ms(100);
    } while (Clock::now() < deadline);
    return got;
}

// ---- a workload that stays alive after its last call ----------------------------

// Runs a workload whose stdout is a pipe the test filled beforehand: it makes
// all its calls, then blocks writing its report until finish() drains the
// pipe.  (Without --wait-file nothing reaches stdout before the report: a
// pipe is fully buffered.)  stderr goes to a memfd.
class StalledWorkload {
public:
    StalledWorkload(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
        int o[2];
        if (pipe2(o, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
        // Fill through a second open file description, so the workload's
        // end stays blocking.
        int filler = open(("/proc/self/fd/" + std::to_string(o[1])).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (filler < 0) throw std::runtime_error("reopen pipe");
        std::string chunk(4096, '.');
        while (write(filler, chunk.data(), chunk.size()) > 0) {
        }
        while (write(filler, ".", 1) > 0) {
        }
        close(filler);
        err_fd_ = memfd_create("workload-stderr", MFD_CLOEXEC);
        std::vector<std::string> envs;
        for (char** e = environ; *e; ++e) {
            std::string kv = *e;
            if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
        }
        for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
        std::vector<char*> a, ev;
        for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        for (const auto& s : envs) ev.push_back(const_cast<char*>(s.c_str()));
        ev.push_back(nullptr);
        pid_ = fork();
        if (pid_ == 0) {
            setpgid(0, 0);
            dup2(o[1], 1);
            dup2(err_fd_, 2);
            int devnull = open("/dev/null", O_RDONLY);
            dup2(devnull, 0);
            execvpe(a[0], a.data(), ev.data());
            _exit(127);
        }
        close(o[1]);
        out_fd_ = o[0];
    }
    ~StalledWorkload() {
        if (!reaped_ && pid_ > 0) {
            kill(-pid_, SIGKILL);
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (out_fd_ >= 0) close(out_fd_);
        if (err_fd_ >= 0) close(err_fd_);
    }
    StalledWorkload(const StalledWorkload&) = delete;
    StalledWorkload& operator=(const StalledWorkload&) = delete;

    int pid() const { return pid_; }

    // True once the workload sits in write(1, ...): every call is made.
    bool wait_stalled(int timeout_ms = 60000) {
        auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        const std::string want = std::to_string(SYS_write) + " 0x1 ";
        while (Clock::now() < deadline) {
            if (!alive(pid_)) return false;
            std::ifstream in("/proc/" + std::to_string(pid_) + "/syscall");
            std::string line;
            if (std::getline(in, line) && line.rfind(want, 0) == 0) return true;
            sleep_ms(5);
        }
        return false;
    }

    // Drains stdout (dropping the filler), reaps; out holds what it printed.
    ProcResult finish(int timeout_s = 60) {
        ProcResult r;
        auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
        std::string out;
        char buf[65536];
        while (Clock::now() < deadline) {
            pollfd p{out_fd_, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            ssize_t n = read(out_fd_, buf, sizeof(buf));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            out.append(buf, static_cast<size_t>(n));
        }
        int ws = 0;
        if (Clock::now() >= deadline) kill(pid_, SIGKILL);
        waitpid(pid_, &ws, 0);
        reaped_ = true;
        r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : -1;
        size_t first = out.find_first_not_of('.');
        r.out = first == std::string::npos ? std::string() : out.substr(first);
        lseek(err_fd_, 0, SEEK_SET);
        ssize_t n;
        while ((n = read(err_fd_, buf, sizeof(buf))) > 0) r.err.append(buf, static_cast<size_t>(n));
        return r;
    }

    std::string stderr_now() {
        std::string s;
        char buf[4096];
        ssize_t n;
        off_t at = 0;
        while ((n = pread(err_fd_, buf, sizeof(buf), at)) > 0) {
            s.append(buf, static_cast<size_t>(n));
            at += n;
        }
        return s;
    }

private:
    int pid_ = -1;
    int out_fd_ = -1, err_fd_ = -1;
    bool reaped_ = false;
};

#define ASSERT_STALLED(w)                                                                              \
    ASSERT_TRUE((w).wait_stalled()) << "workload " << (w).pid() << " never finished its calls (state " \
                                    << proc_state((w).pid()) << "); stderr: " << (w).stderr_now()

// ---- ranks of one stub-NCCL communicator ----------------------------------------

// Ranks of one communicator (the stub's, from one unique id: --init-seed 7),
// rank r making calls[r] all-reduces (with extra[r] added to its command
// line), then held blocked writing its report: a job hung after its calls.
using EnvVars = std::map<std::string, std::string>;

struct CommRanks {
    std::vector<std::unique_ptr<StalledWorkload>> workloads;
    std::vector<int> pids;
};

// `extra[r]`: more arguments of rank r; `envs[r]`: its environment's additions.
inline CommRanks start_comm_ranks(const std::vector<int>& calls, const std::vector<std::vector<std::string>>& extra = {},
                                  const std::vector<std::map<std::string, std::string>>& envs = {}) {
    CommRanks out;
    const auto n = std::to_string(calls.size());
    for (size_t r = 0; r < calls.size(); ++r) {
        std::vector<std::string> argv = {testprog("nccl_workload"), "--init-seed", "7", "--nranks", n, "--rank",
                                         std::to_string(r), "--calls", "all_reduce=" + std::to_string(calls[r])};
        if (r < extra.size()) argv.insert(argv.end(), extra[r].begin(), extra[r].end());
        out.workloads.push_back(std::make_unique<StalledWorkload>(argv, r < envs.size() ? envs[r] : EnvVars{}));
        out.pids.push_back(out.workloads.back()->pid());
    }
    return out;
}

// Every rank made its calls, and the daemon counts each exactly (use with
// ASSERT_NO_FATAL_FAILURE).
inline void expect_comm_ranks_counted(const Daemon& d, CommRanks& ranks, const std::vector<int>& calls) {
    for (auto& w : ranks.workloads) ASSERT_STALLED(*w);
    for (size_t r = 0; r < calls.size(); ++r) {
        const std::map<std::string, long> want = {{"nccl.all_reduce", calls[r]}};
        ASSERT_EQ(daemon_counts_settled(d, ranks.pids[r], want), want) << "rank " << r;
    }
}

// ---- BPF links and maps of a daemon ------------------------------------------------

// "key:\tvalue" fields of /proc/PID/fdinfo/* that hold `key`.
inline std::vector<std::map<std::string, std::string>> fdinfos_with(int pid, const std::string& key) {
    std::vector<std::map<std::string, std::string>> out;
    std::string dir = "/proc/" + std::to_string(pid) + "/fdinfo";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        std::ifstream in(e.path());
        std::map<std::string, std::string> f;
        std::string line;
        while (std::getline(in, line)) {
            size_t c = line.find(':');
            if (c == std::string::npos) continue;
            std::string v = line.substr(c + 1);
            v.erase(0, v.find_first_not_of(" \t"));
            f[line.substr(0, c)] = v;
        }
        if (f.count(key)) out.push_back(f);
    }
    return out;
}

inline std::set<int> link_ids_held_by(int pid) {
    std::set<int> ids;
    for (const auto& f : fdinfos_with(pid, "link_id")) ids.insert(std::stoi(f.at("link_id")));
    return ids;
}

inline std::set<int> live_link_ids() {
    std::set<int> ids;
    auto r = run({"bpftool", "-j", "link", "show"});
    auto j = json::parse(r.out, nullptr, false);
    if (j.is_array())
        for (const auto& l : j)
            if (l.contains("id")) ids.insert(l["id"].get<int>());
    return ids;
}

inline std::set<int> still_live(const std::set<int>& ids) {
    std::set<int> live = live_link_ids(), out;
    for (int id : ids)
        if (live.count(id)) out.insert(id);
    return out;
}

// Polls until none of `ids` is a live link; the ones left.
inline std::set<int> wait_links_gone(const std::set<int>& ids, int timeout_ms = 5000) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::set<int> left = still_live(ids);
    while (!left.empty() && Clock::now() < deadline) {
        sleep_ms(100);
        left = still_live(ids);
    }
    return left;
}

// The brief's global check: no links of our program names at all.  Other
// commdbg instances on the machine may hold such links legitimately; the
// per-id check above is the hard one.
inline void expect_no_links_of_our_programs(int timeout_ms = 5000) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int n = count_links_of_programs(kProgramNames);
    while (n != 0 && Clock::now() < deadline) {
        sleep_ms(100);
        n = count_links_of_programs(kProgramNames);
    }
    if (n != 0) {
        bool others = false;
        for (const auto& e : std::filesystem::directory_iterator("/proc")) {
            std::string name = e.path().filename();
            if (name.find_first_not_of("0123456789") != std::string::npos) continue;
            std::ifstream comm(e.path() / "comm");
            std::string c;
            std::getline(comm, c);
            if (c.rfind("commdbg", 0) == 0 && !link_ids_held_by(std::stoi(name)).empty()) others = true;
        }
        EXPECT_TRUE(others) << n << " link(s) of commdbg's programs remain and no commdbg process holds any";
        if (others) std::cout << "[ note ] " << n << " link(s) of commdbg's programs held by other commdbg processes\n";
    }
}

// Entries of each hash map a daemon holds, by map name.
inline std::map<std::string, size_t> hash_map_entries(int pid) {
    std::map<std::string, size_t> out;
    for (const auto& f : fdinfos_with(pid, "map_id")) {
        if (f.count("map_type") == 0 || f.at("map_type") != "1") continue;  // BPF_MAP_TYPE_HASH
        std::string id = f.at("map_id");
        auto show = json::parse(run({"bpftool", "-j", "map", "show", "id", id}).out, nullptr, false);
        std::string name = show.is_object() ? show.value("name", id) : id;
        auto dump = json::parse(run({"bpftool", "-j", "map", "dump", "id", id}).out, nullptr, false);
        out[name] = dump.is_array() ? dump.size() : static_cast<size_t>(-1);
    }
    return out;
}

inline long vm_rss_kb(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmRSS:", 0) == 0) return atol(line.c_str() + 6);
    return -1;
}

inline long fd_count(int pid) {
    long n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         it != std::filesystem::directory_iterator(); ++it)
        ++n;
    return n;
}

// ---- raw control-socket clients --------------------------------------------------

inline int connect_unix(const std::string& path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

inline void send_bytes(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // the daemon may close early: fine
        off += static_cast<size_t>(n);
    }
}

struct Reply {
    std::string data;  // everything read
    bool closed = false;  // EOF or reset before the timeout
};

// Reads until `lines` newline-terminated lines arrived, EOF/reset, or timeout.
inline Reply read_reply(int fd, size_t lines, int timeout_ms = 5000) {
    Reply r;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    char buf[65536];
    while (Clock::now() < deadline) {
        if (lines && static_cast<size_t>(std::count(r.data.begin(), r.data.end(), '\n')) >= lines) break;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            r.closed = true;
            break;
        }
        r.data.append(buf, static_cast<size_t>(n));
    }
    return r;
}

inline std::vector<json> reply_lines(const std::string& data) {
    std::vector<json> out;
    std::istringstream in(data);
    std::string line;
    while (std::getline(in, line)) out.push_back(json::parse(line, nullptr, false));
    return out;
}

// ---- short workloads in bulk ---------------------------------------------------------

// Runs n short stub workloads, `parallel` at a time, starting at most
// `per_second` of them a second (0: as fast as they go); returns how many
// failed.  *pids: the pids they had.
inline int run_short_workloads(int n, int parallel, const std::vector<std::string>& argv, double per_second = 0,
                        std::set<int>* pids = nullptr) {
    std::mutex mu;
    const auto start = Clock::now();
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e)
        if (std::string(*e).rfind("LD_LIBRARY_PATH=", 0) != 0) envs.push_back(*e);
    envs.push_back(std::string("LD_LIBRARY_PATH=") + STUB_NCCL_DIR);
    std::vector<char*> a, ev;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (const auto& s : envs) ev.push_back(const_cast<char*>(s.c_str()));
    ev.push_back(nullptr);
    std::atomic<int> next{0}, failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < parallel; ++t)
        threads.emplace_back([&] {
            posix_spawn_file_actions_t fa;
            posix_spawn_file_actions_init(&fa);
            posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
            posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
            posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
            for (int i; (i = next.fetch_add(1)) < n;) {
                if (per_second > 0)
                    std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<long>(i * 1e6 / per_second)));
                pid_t pid;
                if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), ev.data()) != 0) {
                    ++failed;
                    continue;
                }
                if (pids) {
                    std::lock_guard lock(mu);
                    pids->insert(pid);
                }
                int ws = 0;
                while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
                }
                if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) ++failed;
            }
            posix_spawn_file_actions_destroy(&fa);
        });
    for (auto& t : threads) t.join();
    return failed;
}

}  // namespace commdbg::e2e::daemon_util
