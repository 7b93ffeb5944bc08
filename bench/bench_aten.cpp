// SPDX-License-Identifier: Apache-2.0
// The torch-aten spec on a live python: how long attaching ~2950 entry probes
// to libtorch_cpu takes, and ops/s of an op-heavy loop in the SAME process
// unprobed, with counters only, and with counters + records.
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
    double base = bench::round_seconds(py, n, nullptr);
    base = std::min(base, bench::round_seconds(py, n, nullptr));
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
        double t = bench::round_seconds(py, n, s->get());
        std::printf("%-34s %10.0f ops/s  ratio %.2f of unprobed  (attach %zu probes: %.3f s)\n",
                    records ? "torch-aten counters + records" : "torch-aten counters only", n / t, base / t,
                    probes, attach);
    }
    return 0;
}
