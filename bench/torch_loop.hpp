// SPDX-License-Identifier: Apache-2.0
// One python with torch, driven over pipes, for the benchmarks that trace
// it (bench_aten, bench_anchor, bench_c10d, bench_module_enter): each "go N"
// line runs N calls of its loop (torch.add on 8 floats by default) and
// answers with the seconds they took; and one measured round of it, alone or
// under a session attached to it.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <bpf/bpf.h>

#include "bench_args.hpp"
#include "trace_session.hpp"
#include <string>

namespace commdbg::bench {

class TorchLoop {
public:
    // False when `exe` cannot run or cannot import torch.
    // `script` as kScript does: a "ready" line, then per "go N" line the
    // seconds N calls took.
    bool start(const std::string& exe, const char* script = kScript) {
        stop();  // a python that failed to start before
        int to[2], from[2];
        if (pipe(to) || pipe(from)) return false;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to[0], 0);
            dup2(from[1], 1);
            close(to[1]);
            close(from[0]);
            execl(exe.c_str(), exe.c_str(), "-c", script, nullptr);
            _exit(127);
        }
        close(to[0]);
        close(from[1]);
        in_ = fdopen(to[1], "w");
        out_ = fdopen(from[0], "r");
        char line[64];
        return fgets(line, sizeof(line), out_) && std::string(line) == "ready\n";
    }
    // Starts a round of n ops; its answer is readable on result_fd().
    void go(long n) {
        std::fprintf(in_, "go %ld\n", n);
        std::fflush(in_);
    }
    int result_fd() const { return fileno(out_); }
    // The seconds the round took (blocks until it is done), -1 if python died.
    double seconds() {
        char line[64];
        return fgets(line, sizeof(line), out_) ? std::atof(line) : -1;
    }
    pid_t pid() const { return pid_; }
    ~TorchLoop() { stop(); }

private:
    void stop() {
        if (in_) fclose(in_);
        if (out_) fclose(out_);
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        in_ = out_ = nullptr;
        pid_ = -1;
    }
    static constexpr const char* kScript = R"PY(
import sys, time, torch
a = torch.ones(8); b = torch.ones(8)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line.split()[1])
    t0 = time.perf_counter()
    for _ in range(n):
        torch.add(a, b)
    print(time.perf_counter() - t0, flush=True)
)PY";
    pid_t pid_ = -1;
    FILE* in_ = nullptr;
    FILE* out_ = nullptr;
};

// CPU seconds this process (a tracer's userspace and its system calls) has used.
inline double own_cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Seconds n calls of py's loop took; the session (if any) drains the ring
// buffer while python runs, as a real one does.
inline double round_seconds(TorchLoop& py, long n, session::TraceSession* s) {
    py.go(n);
    pollfd pf{py.result_fd(), POLLIN, 0};
    while (poll(&pf, 1, 0) == 0)
        if (s) s->poll(10);
        else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    double secs = py.seconds();
    if (s) s->drain();
    return secs;
}

// One round under a fresh session of `so` attached to py: the seconds, the
// tracer's own CPU, and the BPF programs' time per probed call while the
// kernel's BPF stats are on (bpf_enable_stats; tail calls count in the
// program that made them), -1 when not counted.
struct TracedRound {
    double secs = 0, cpu_secs = 0, bpf_ns = -1;
};
inline Result<TracedRound> traced_round(TorchLoop& py, long n, const session::SessionOptions& so) {
    auto s = session::TraceSession::create(so);
    if (!s) return Result<TracedRound>::fail(s.error());
    if (auto a = (*s)->add_process(py.pid(), false, false); !a) return Result<TracedRound>::fail("attach: " + a.error());
    TracedRound r;
    const double cpu0 = own_cpu_seconds();
    r.secs = round_seconds(py, n, s->get());
    r.cpu_secs = own_cpu_seconds() - cpu0;
    uint64_t runs = 0, run_ns = 0;
    for (const auto& p : (*s)->program_stats()) runs = std::max(runs, p.runs), run_ns += p.run_ns;
    if (runs > 0) r.bpf_ns = double(run_ns) / double(runs);
    return r;
}

// One way of running py's loop: unprobed (no options) or under a session of
// `so`; per round, the time per unit, the tracer's own CPU per unit and the
// BPF programs' time per probed call (where the kernel counted it).
struct Mode {
    std::string what;
    std::optional<session::SessionOptions> so;
    std::vector<double> ns, cpu_ns, bpf_ns;
};

// Every mode in turn, `rounds` times over (the machine's speed drifts: each
// ratio is taken against the first mode's run of the same round); `units`
// per round of n calls divide the times.  The kernel's BPF stats are on
// meanwhile.
inline Result<bool> measure_modes(TorchLoop& py, long n, double units, int rounds, std::vector<Mode>& modes) {
    const int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);  // on while the fd is open
    Result<bool> out = true;
    for (int r = 0; r < rounds && out; ++r)
        for (auto& m : modes) {
            if (!m.so) {
                m.ns.push_back(round_seconds(py, n, nullptr) * 1e9 / units);
                continue;
            }
            auto t = traced_round(py, n, *m.so);
            if (!t) {
                out = Result<bool>::fail(m.what + ": " + t.error());
                break;
            }
            m.ns.push_back(t->secs * 1e9 / units);
            m.cpu_ns.push_back(t->cpu_secs * 1e9 / units);
            if (stats_fd >= 0 && t->bpf_ns >= 0) m.bpf_ns.push_back(t->bpf_ns);
        }
    if (stats_fd >= 0) close(stats_fd);
    return out;
}

// Mode m's time against the first mode's of the same round: median and range.
struct Ratio {
    double median = 0, lo = 0, hi = 0;
};
inline Ratio ratio_to_first(const std::vector<Mode>& modes, const Mode& m) {
    std::vector<double> r;
    for (size_t i = 0; i < m.ns.size() && i < modes[0].ns.size(); ++i) r.push_back(m.ns[i] / modes[0].ns[i]);
    if (r.empty()) return {};
    auto [lo, hi] = std::minmax_element(r.begin(), r.end());
    return {median(r), *lo, *hi};
}

// A traced mode's options: these specs, with records or counters only.
inline session::SessionOptions traced_specs(std::vector<std::string> specs, bool records) {
    session::SessionOptions so;
    so.probes = std::move(specs);
    so.records = records;
    return so;
}

// The start every torch benchmark shares: root, `script` running under
// Debian's python3, one warm-up of n / 10.  False, with the reason printed
// as `name: skipped — ...`, when it cannot run here.
inline bool start_or_skip(TorchLoop& py, const char* name, const char* script, long n, const char* needs) {
    if (geteuid() != 0) {
        std::printf("%s: skipped — needs root to attach uprobes\n", name);
        return false;
    }
    if (!py.start("/usr/bin/python3", script)) {
        std::printf("%s: skipped — /usr/bin/python3 %s\n", name, needs);
        return false;
    }
    round_seconds(py, n / 10, nullptr);  // warm-up
    return true;
}

}  // namespace commdbg::bench
