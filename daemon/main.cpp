// SPDX-License-Identifier: Apache-2.0
// commdbgd: the node service.  Counts every process's collectives at all
// times (exact kernel counters), serves `commdbg` over a Unix socket and
// exports Prometheus metrics over HTTP.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "counter.hpp"
#include "fsdp_watch.hpp"
#include "option_checks.hpp"
#include "server.hpp"
#include "revision.hpp"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET.
void notify_systemd(const char* state) {
    const char* path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if (len >= sizeof(addr.sun_path)) return;
    memcpy(addr.sun_path, path, len);
    if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sendto(fd, state, strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
    close(fd);
}

// httplib's default pool has max(8, cores - 1) threads and each open
// connection holds one while it waits for its request: a few dozen idle or
// trickling connections would stall every scrape.  Here a connection gets
// a thread of its own, started on demand up to a cap.
class ConnectionThreads : public httplib::TaskQueue {
public:
    explicit ConnectionThreads(size_t max_threads) : max_(max_threads) {}
    void enqueue(std::function<void()> fn) override {
        {
            std::lock_guard lock(mu_);
            jobs_.push_back(std::move(fn));
            if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
        }
        cv_.notify_one();
    }
    void shutdown() override {
        {
            std::lock_guard lock(mu_);
            shutdown_ = true;
        }
        cv_.notify_all();
        for (auto& t : threads_) t.join();
    }

private:
    void work() {
        for (;;) {
            std::function<void()> fn;
            {
                std::unique_lock lock(mu_);
                ++idle_;
                cv_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
                --idle_;
                if (jobs_.empty()) return;
                fn = std::move(jobs_.front());
                jobs_.pop_front();
            }
            fn();
        }
    }
    const size_t max_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t idle_ = 0;
    bool shutdown_ = false;
};

// Connections served at once; past it they wait for a thread.
constexpr size_t kHttpThreads = 256;
// A connection that sends nothing for this long is closed, and a kept-alive
// one between requests too, so idle connections do not pile up.
constexpr time_t kHttpTimeoutS = 2;

bool split_host_port(const std::string& s, std::string& host, int& port) {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) return false;
    host = s.substr(0, colon);
    if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    try {
        port = std::stoi(s.substr(colon + 1));
    } catch (...) {
        return false;
    }
    return port >= 0 && port < 65536;
}

// What the command line asks for.
struct DaemonArgs {
    std::string socket_path = "/run/commdbg/commdbgd.sock";
    std::string metrics_listen = "127.0.0.1:9464";
    std::string metrics_host;  // metrics_listen split
    int metrics_port = 0;
    commdbg::daemon::NodeCounterOptions counter;
    size_t max_sessions = commdbg::daemon::ControlServer::kDefaultMaxSessions;
    bool fsdp_checks = false;
    commdbg::daemon::FsdpWatchOptions fsdp;
};

// Parses argv into `a`; returns the exit status when commdbgd should exit
// now (--help, --version, a usage error).
std::optional<int> parse_args(int argc, char** argv, DaemonArgs& a) {
    using namespace commdbg;
    using namespace commdbg::daemon;
    CLI::App app{"commdbgd — commdbg node service: always-on exact collective counts, Prometheus metrics, "
                 "tracing sessions for `commdbg`"};
    app.set_version_flag("--version", std::string("commdbgd ") + COMMDBG_VERSION + " (" + COMMDBG_REVISION + ")");
    NodeCounterOptions& opts = a.counter;
    long ttl_s = 600;
    app.add_option("--socket", a.socket_path, "Control socket path");
    app.add_option("--metrics-listen", a.metrics_listen, "HOST:PORT for /metrics (Prometheus); empty: no HTTP");
    app.add_option("--scope-cgroup", opts.scope_cgroup,
                   "Only count processes in this cgroup v2 subtree (e.g. /sys/fs/cgroup/unified/job1)");
    app.add_option("--probes", opts.probes, "Probe specs for always-on counting (default: nccl)")->delimiter(',');
    app.add_option("--series-ttl", ttl_s, "Seconds the series of an exited process stay exported")
        ->check(CLI::Range(1L, 7L * 24 * 3600));
    app.add_option("--max-series", opts.max_series,
                   "Cap on exported series (a uid other than root: a quarter); past it an overflow counter counts")
        ->check(integer_in(1, 10'000'000));
    app.add_option("--max-files-per-uid", opts.library_files_per_uid,
                   "Library files (libnccl copies) probed for one user other than root; past it that user's new "
                   "files are neither probed nor stopped for (all such users together: 3/4 of the kernel's 4096)")
        ->check(integer_in(1, 3072));
    bool no_count_errors = false;
    app.add_flag("--no-count-errors", no_count_errors,
                 "Count collectives with entry probes only: each call traps once, not twice (about 40% less per call), "
                 "and commdbg_collective_errors_total stays 0; `commdbg attach` sessions still count errors");
    bool no_flight_recorder = false;
    app.add_flag("--no-flight-recorder", no_flight_recorder,
                 "Keep no flight recorder for the processes the node counter counts: `commdbg hang` then has counts "
                 "and stacks but no signatures, and commdbg_collective_mismatch_total stays 0 (`commdbg attach` "
                 "sessions keep none either way)");
    app.add_option("--max-sessions", a.max_sessions,
                   "Tracing sessions (`commdbg attach`) run at once; each may hold ~0.3 GB at the default " +
                       std::to_string(limits::kDefaultMaxRecords) + "-record budget")
        ->check(CLI::Range(size_t{1}, size_t{64}));
    long fsdp_window_s = 60;
    app.add_flag("--fsdp-checks", a.fsdp_checks,
                 "Run the FSDP lifecycle checks all the time for every process that loads libtorch (scopes and "
                 "collectives only); findings go to /metrics as commdbg_fsdp_violations_total");
    app.add_option("--fsdp-window", fsdp_window_s,
                   "Seconds of records the FSDP checks analyse at once, then drop (a process's exit ends one too)")
        ->check(CLI::Range(1L, 86400L));
    app.add_option("--fsdp-max-records", a.fsdp.max_records,
                   "Records the FSDP checks keep per process and window; a window past it is not checked")
        ->check(integer_in(100, limits::kMaxRecordsCeiling));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // Usage errors exit 2, as commdbg's do (CLI11 has a code per error kind).
        return app.exit(e) == 0 ? 0 : 2;
    }
    opts.series_ttl = std::chrono::seconds(ttl_s);
    opts.count_errors = !no_count_errors;
    opts.flight_recorder = !no_flight_recorder;
    a.fsdp.window = std::chrono::seconds(fsdp_window_s);
    a.fsdp.scope_cgroup = opts.scope_cgroup;
    if (!a.metrics_listen.empty() && !split_host_port(a.metrics_listen, a.metrics_host, a.metrics_port)) {
        std::cerr << "commdbgd: --metrics-listen " << a.metrics_listen
                  << ": expected HOST:PORT, e.g. 127.0.0.1:9464\n";
        return 2;
    }
    return std::nullopt;
}

void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
}

// Binds /metrics at the address asked for and serves it on a thread of its
// own; false (said on stderr) when it cannot listen there.  Port 0: the
// kernel picks a free one, and a.metrics_port says which.
bool serve_metrics(httplib::Server& http, std::thread& thread, commdbg::daemon::NodeCounter& counter, DaemonArgs& a) {
    http.Get("/metrics", [&counter](const httplib::Request&, httplib::Response& res) {
        res.set_content(counter.metrics().render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    // httplib's default sets SO_REUSEPORT: a second daemon would share the
    // port silently and scrapes would alternate between them.
    socket_t listening = INVALID_SOCKET;
    http.set_socket_options([&listening](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        listening = sock;
    });
    http.new_task_queue = [] { return new ConnectionThreads(kHttpThreads); };
    http.set_read_timeout(kHttpTimeoutS, 0);
    http.set_write_timeout(kHttpTimeoutS, 0);
    http.set_keep_alive_timeout(kHttpTimeoutS);
    http.set_keep_alive_max_count(100);
    int& port = a.metrics_port;
    const bool bound =
        port == 0 ? (port = http.bind_to_any_port(a.metrics_host)) > 0 : http.bind_to_port(a.metrics_host, port);
    if (!bound) {
        std::cerr << "commdbgd: --metrics-listen " << a.metrics_listen
                  << ": cannot listen there (in use or not a local address) — pick another port\n";
        return false;
    }
    // Debian's libcpp-httplib listens with a backlog of 5: a burst of
    // connections would see SYNs dropped and retried a second later.
    if (listening != INVALID_SOCKET) ::listen(listening, SOMAXCONN);
    thread = std::thread([&http] { http.listen_after_bind(); });
    return true;
}

void say_ready(const DaemonArgs& a) {
    const std::string& host = a.metrics_host;
    const std::string metrics_at =
        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(a.metrics_port);
    std::cerr << "commdbgd " << COMMDBG_VERSION << " (" << COMMDBG_REVISION << "): counting"
              << (a.counter.scope_cgroup.empty() ? " on this node" : " in " + a.counter.scope_cgroup) << "; socket "
              << a.socket_path << (a.metrics_listen.empty() ? "" : "; metrics http://" + metrics_at + "/metrics")
              << (a.fsdp_checks ? "; FSDP checks every " + std::to_string(a.fsdp.window.count()) + " s" : "") << "\n";
    notify_systemd("READY=1");
}

}  // namespace

int main(int argc, char** argv) {
    using namespace commdbg;
    using namespace commdbg::daemon;
    DaemonArgs a;
    if (auto exit_now = parse_args(argc, argv, a)) return *exit_now;
    install_signal_handlers();

    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(a.socket_path).parent_path(), ec);
    auto counter = NodeCounter::create(a.counter);
    if (!counter) {
        std::cerr << counter.error() << "\n";
        return 1;
    }
    auto control = ControlServer::open(a.socket_path, **counter, a.max_sessions);
    if (!control) {
        std::cerr << control.error() << "\n";
        return 1;
    }
    (*control)->start();
    (*counter)->watch_stop_flag(g_stop);

    std::unique_ptr<FsdpWatch> fsdp;
    std::thread fsdp_thread;
    if (a.fsdp_checks) {
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        auto w = FsdpWatch::create(a.fsdp, (*counter)->metrics(), host);
        if (!w) {
            std::cerr << w.error() << "\n";
            return 1;
        }
        fsdp = std::move(w.value());
        fsdp_thread = std::thread([&fsdp] { fsdp->run(g_stop); });
    }

    httplib::Server http;
    std::thread http_thread;
    if (!a.metrics_listen.empty() && !serve_metrics(http, http_thread, **counter, a)) {
        g_stop = true;
        if (fsdp_thread.joinable()) fsdp_thread.join();
        return 1;
    }
    say_ready(a);
    while (!g_stop) (*counter)->step(100);
    notify_systemd("STOPPING=1");
    // First: no process is stopped at a new library file from now on, and
    // those stopped are resumed; the sessions and the rest end after.
    (*counter)->stop_stopping_processes();
    if (fsdp_thread.joinable()) fsdp_thread.join();
    (*control)->stop();
    if (http_thread.joinable()) {
        http.stop();
        http_thread.join();
    }
    std::cerr << "commdbgd: stopped\n";
    return 0;
}
