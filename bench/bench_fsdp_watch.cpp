// SPDX-License-Identifier: Apache-2.0
// The cost of commdbgd --fsdp-checks (issue 12, point 7: "scopes only,
// cheap: measure it"): the real FSDP2 job (tests/testprogs/fsdp2_workload.py
// clean: 2 ranks x 3 optimizer steps, torch 2.6 on CPU + gloo in the trixie
// root): N rounds alone, then N under one commdbgd --fsdp-checks kept for
// all of them, after a first job that pays the attach (libtorch_cpu's
// symbols, read once per file and daemon).  Per traced job the CPU time
// commdbgd used from the job's start until its last window was analysed,
// less what it uses idle over as long (the 1 s scans for new processes):
// that per optimizer step and per record analysed, and the job's wall-time
// ratio to the rounds alone.
// Usage (root, from the build tree): bench_fsdp_watch [rounds] [trixie root]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.hpp"
#include "proc_cpu.hpp"

extern char** environ;

namespace {

using commdbg::bench::cpu_seconds;
using commdbg::bench::median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr int kPort = 19571;
constexpr double kSteps = 2 * 3;  // ranks x optimizer steps of the clean job

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> a, ev;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (const auto& s : env) ev.push_back(const_cast<char*>(s.c_str()));
    ev.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), ev.data()) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

std::string metrics() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(kPort);
    std::string resp;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        (void)!send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL);
        char buf[65536];
        for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return resp;
}

double metric(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (line.rfind(name + "{", 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
    return 0;
}


// The clean job, to its end; its wall time, or < 0 if it failed.
double run_job(const fs::path& src, const std::string& root) {
    const auto t0 = Clock::now();
    pid_t job = spawn({(src / "tests/trixie_run.sh").string(), "--bind",
                       (src / "tests/testprogs").string() + ":/opt/commdbg-testprogs", root, "python3",
                       "/opt/commdbg-testprogs/fsdp2_workload.py", "clean"},
                      {"USE_LIBUV=0", "GLOO_SOCKET_IFNAME=lo"});
    int status = 0;
    waitpid(job, &status, 0);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? wall : -1;
}

pid_t start_daemon(const fs::path& bin) {
    pid_t d = spawn({(bin / "commdbgd").string(), "--socket", "/tmp/bench_fsdp_watch.sock", "--metrics-listen",
                     "127.0.0.1:" + std::to_string(kPort), "--fsdp-checks"},
                    {});
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (metrics().find("commdbg_build_info") == std::string::npos && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return d;
}

}  // namespace

int main(int argc, char** argv) {
    std::string root = "/var/cache/commdbg/trixie-root";
    const auto args = commdbg::bench::bench_args(argc, argv, {{"rounds", 3, 1}}, "trixie-root", &root);
    const int rounds = static_cast<int>(args[0]);
    const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
    const fs::path src = SOURCE_DIR;
    if (geteuid() != 0 || !fs::exists(root + "/.commdbg-trixie-root")) {
        std::fprintf(stderr, "bench_fsdp_watch: needs root and the trixie root at %s (make trixie-root)\n",
                     root.c_str());
        return 2;
    }
    std::vector<double> alone, traced, cpu, idle, records;
    for (int r = 0; r < rounds; ++r) alone.push_back(run_job(src, root));
    pid_t d = start_daemon(bin);
    // The first job on a node pays the attach (libtorch_cpu's symbols read
    // once per file): said apart, not per step.
    double c0 = cpu_seconds(d);
    const double warm_wall = run_job(src, root);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const double attach = cpu_seconds(d) - c0;
    double seen = metric(metrics(), "commdbg_fsdp_records_released_total");
    for (int r = 0; r < rounds; ++r) {
        c0 = cpu_seconds(d);
        const auto t0 = Clock::now();
        traced.push_back(run_job(src, root));
        std::this_thread::sleep_for(std::chrono::seconds(2));  // the job's last window
        const double span = std::chrono::duration<double>(Clock::now() - t0).count();
        cpu.push_back(cpu_seconds(d) - c0);
        const double now_seen = metric(metrics(), "commdbg_fsdp_records_released_total");
        records.push_back(now_seen - seen);
        seen = now_seen;
        // The same span with no job: the scans for new processes.
        c0 = cpu_seconds(d);
        std::this_thread::sleep_for(std::chrono::duration<double>(span));
        idle.push_back((cpu_seconds(d) - c0) / span);
    }
    kill(d, SIGTERM);
    waitpid(d, nullptr, 0);
    if (warm_wall < 0 || *std::min_element(alone.begin(), alone.end()) < 0 ||
        *std::min_element(traced.begin(), traced.end()) < 0) {
        std::fprintf(stderr, "bench_fsdp_watch: a job failed\n");
        return 1;
    }
    const double job_span = median(traced) + 2;
    const double extra = median(cpu) - median(idle) * job_span;
    std::printf("FSDP2 clean job (2 ranks x 3 optimizer steps), %d rounds, medians\n", rounds);
    std::printf("  job wall: %.2f s alone, %.2f s under commdbgd --fsdp-checks (%.3fx)\n", median(alone),
                median(traced), median(traced) / median(alone));
    std::printf("  commdbgd CPU: first job on the node %.3f s (attach), then %.3f s per job; idle %.1f ms/s\n",
                attach, median(cpu), 1e3 * median(idle));
    std::printf("  the checks: %.2f ms CPU per optimizer step, %.1f us per record (%.0f records a job)\n",
                1e3 * extra / kSteps, 1e6 * extra / std::max(1.0, median(records)), median(records));
    return 0;
}
