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
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "control_server.hpp"
#include "node_counter.hpp"

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

}  // namespace

int main(int argc, char** argv) {
    using namespace commdbg;
    CLI::App app{"commdbgd — commdbg node service: always-on exact collective counts, Prometheus metrics, "
                 "tracing sessions for `commdbg`"};
    app.set_version_flag("--version", std::string("commdbgd ") + COMMDBG_VERSION);
    std::string socket_path = "/run/commdbg/commdbgd.sock";
    std::string metrics_listen = "127.0.0.1:9464";
    NodeCounterOptions opts;
    long ttl_s = 600;
    app.add_option("--socket", socket_path, "Control socket path");
    app.add_option("--metrics-listen", metrics_listen, "HOST:PORT for /metrics (Prometheus); empty: no HTTP");
    app.add_option("--scope-cgroup", opts.scope_cgroup,
                   "Only count processes in this cgroup v2 subtree (e.g. /sys/fs/cgroup/unified/job1)");
    app.add_option("--probes", opts.probes, "Probe specs for always-on counting (default: nccl)")->delimiter(',');
    app.add_option("--series-ttl", ttl_s, "Seconds the series of an exited process stay exported")
        ->check(CLI::Range(1L, 7L * 24 * 3600));
    app.add_option("--max-series", opts.max_series, "Cap on exported series; past it an overflow counter counts")
        ->check(CLI::PositiveNumber);
    size_t max_sessions = ControlServer::kDefaultMaxSessions;
    app.add_option("--max-sessions", max_sessions,
                   "Tracing sessions (`commdbg attach`) run at once; each may hold ~0.3 GB at the default "
                   "200000-record budget")
        ->check(CLI::Range(size_t{1}, size_t{64}));
    CLI11_PARSE(app, argc, argv);
    opts.series_ttl = std::chrono::seconds(ttl_s);

    std::string host;
    int port = 0;
    if (!metrics_listen.empty() && !split_host_port(metrics_listen, host, port)) {
        std::cerr << "commdbgd: --metrics-listen " << metrics_listen << ": expected HOST:PORT, e.g. 127.0.0.1:9464\n";
        return 2;
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);

    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(socket_path).parent_path(), ec);
    auto counter = NodeCounter::create(opts);
    if (!counter) {
        std::cerr << counter.error() << "\n";
        return 1;
    }
    auto control = ControlServer::open(socket_path, **counter, max_sessions);
    if (!control) {
        std::cerr << control.error() << "\n";
        return 1;
    }
    (*control)->start();

    httplib::Server http;
    std::thread http_thread;
    if (!metrics_listen.empty()) {
        http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
            res.set_content((*counter)->metrics().render(), "text/plain; version=0.0.4; charset=utf-8");
        });
        // httplib's default sets SO_REUSEPORT: a second daemon would share the
        // port silently and scrapes would alternate between them.
        http.set_socket_options([](socket_t sock) {
            int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        });
        if (!http.bind_to_port(host.c_str(), port)) {
            std::cerr << "commdbgd: --metrics-listen " << metrics_listen
                      << ": cannot listen there (in use or not a local address) — pick another port\n";
            return 1;
        }
        http_thread = std::thread([&] { http.listen_after_bind(); });
    }
    std::cerr << "commdbgd " << COMMDBG_VERSION << ": counting"
              << (opts.scope_cgroup.empty() ? " on this node" : " in " + opts.scope_cgroup) << "; socket "
              << socket_path << (metrics_listen.empty() ? "" : "; metrics http://" + metrics_listen + "/metrics")
              << "\n";
    notify_systemd("READY=1");
    while (!g_stop) (*counter)->step(100);
    notify_systemd("STOPPING=1");
    (*control)->stop();
    if (http_thread.joinable()) {
        http.stop();
        http_thread.join();
    }
    std::cerr << "commdbgd: stopped\n";
    return 0;
}
