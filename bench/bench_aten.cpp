// SPDX-License-Identifier: Apache-2.0
// The torch-aten spec on a live python: how long attaching ~2950 entry probes
// to libtorch_cpu takes, and ops/s of an op-heavy loop in the SAME process
// unprobed, with counters only, and with counters + records.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "bench_args.hpp"
#include "torch_loop.hpp"
#include "trace_session.hpp"

using namespace commdbg;

namespace {

// One round of n ops; drains the ring buffer while python runs, as a real session does.
double round_seconds(bench::TorchLoop& py, long n, session::TraceSession* s) {
    py.go(n);
    pollfd pf{py.result_fd(), POLLIN, 0};
    while (poll(&pf, 1, 0) == 0)
        if (s) s->poll(10);
        else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    double secs = py.seconds();
    if (s) s->drain();
    return secs;
}

}  // namespace

int main(int argc, char** argv) {
    long n = bench::bench_args(argc, argv, {{"calls", 100000, 10}})[0];
    if (geteuid() != 0) {
        std::printf("bench_aten: skipped — needs root to attach uprobes\n");
        return 0;
    }
    const char* exe = nullptr;
    bench::TorchLoop py;
    for (const char* cand : {"/usr/bin/python3", "python3"})
        if (py.start(cand)) {
            exe = cand;
            break;
        }
    if (!exe) {
        std::printf("bench_aten: skipped — no python3 here imports torch (Debian: apt install python3-torch)\n");
        return 0;
    }
    double base = round_seconds(py, n, nullptr);
    base = std::min(base, round_seconds(py, n, nullptr));
    std::printf("ops per measurement: %ld torch.add on 8 floats (python %s, pid %d)\n", n, exe, py.pid());
    std::printf("%-34s %10.0f ops/s  ratio 1.00\n", "unprobed", n / base);
    for (bool records : {false, true}) {
        session::SessionOptions so;
        so.probes = {"torch-aten"};
        so.records = records;
        auto s = session::TraceSession::create(so);
        if (!s) {
            std::fprintf(stderr, "bench_aten: %s\n", s.error().c_str());
            return 1;
        }
        auto t0 = std::chrono::steady_clock::now();
        auto r = (*s)->add_process(py.pid(), false, false);
        double attach = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        size_t probes = 0;
        for (const auto& f : (*s)->attached_files()) probes += f.entry_probes;
        if (!r || probes == 0) {
            std::fprintf(stderr, "bench_aten: attach failed: %s\n", r ? "no probes" : r.error().c_str());
            return 1;
        }
        double t = round_seconds(py, n, s->get());
        std::printf("%-34s %10.0f ops/s  ratio %.2f of unprobed  (attach %zu probes: %.3f s)\n",
                    records ? "torch-aten counters + records" : "torch-aten counters only", n / t, base / t,
                    probes, attach);
    }
    return 0;
}
