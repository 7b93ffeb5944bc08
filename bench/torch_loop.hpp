// SPDX-License-Identifier: Apache-2.0
// One python with torch, driven over pipes, for the benchmarks that trace
// it (bench_aten, bench_anchor): each "go N" line runs N torch.add on 8
// floats and answers with the seconds they took.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

}  // namespace commdbg::bench
