// SPDX-License-Identifier: Apache-2.0
// The cost of the Python stack in BPF (issue 11, point 5): ns per
// ncclAllReduce (the stub, through ctypes) called from 20 Python frames deep
// in Debian's /usr/bin/python3.11 (tests/testprogs/py_stack_workload.py
// bench), three ways in one run:
//   unprobed | commdbg attach, the call's spec with "py_stack": false |
//   the same spec with "py_stack": true (the walk of 20 frames per call)
// over several rounds (argv[2], default 5): the median per way and the
// median and range of the per-round ratio stack / no stack (issue 27's
// target: <= 1.25x, the median of three runs).
// Usage: bench_py_stack [calls] [rounds].
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "test_proc.hpp"

namespace {

using commdbg::bench::median;

using commdbg::testproc::Background;
constexpr int kDepth = 20;

// The workload's bench mode, driven over pipes: "go N" runs N calls, the
// answer is the seconds they took.
class PyLoop {
public:
    bool start(const std::vector<std::string>& argv) {
        int to[2], from[2];
        if (pipe(to) || pipe(from)) return false;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to[0], 0);
            dup2(from[1], 1);
            close(to[1]);
            close(from[0]);
            std::vector<char*> args;
            for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
            args.push_back(nullptr);
            execv(args[0], args.data());
            _exit(127);
        }
        close(to[0]);
        close(from[1]);
        in_ = fdopen(to[1], "w");
        out_ = fdopen(from[0], "r");
        char line[64];
        return fgets(line, sizeof(line), out_) && std::string(line) == "ready\n";
    }
    // ns per call over n calls; < 0 if python died.
    double ns_per_call(long n) {
        std::fprintf(in_, "go %ld\n", n);
        std::fflush(in_);
        char line[64];
        if (!fgets(line, sizeof(line), out_)) return -1;
        return std::atof(line) * 1e9 / static_cast<double>(n);
    }
    pid_t pid() const { return pid_; }
    ~PyLoop() {
        if (in_) fclose(in_);
        if (out_) fclose(out_);
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }

private:
    pid_t pid_ = -1;
    FILE* in_ = nullptr;
    FILE* out_ = nullptr;
};

double best_of(PyLoop& py, long n) {
    double best = 1e18;
    for (int r = 0; r < 3; ++r) best = std::min(best, py.ns_per_call(n));
    return best;
}

// A one-symbol spec: ncclAllReduce as specs/nccl.json has it, with the
// stack capture on or off.  Written as DIR/NAME.json (a spec's name is its file's).
std::string write_spec(const std::string& dir, const std::string& name, bool py_stack) {
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << R"({"name": ")" << name << R"(", "description": "bench_py_stack", "layer": "nccl",
  "library": ["libnccl.so", "libnccl.so.*"], "return_probes": true,
  "symbols": [{"match": "ncclAllReduce", "role": "collective", "collective": "all_reduce",
    "args": {"sendbuff": 0, "recvbuff": 1, "count": 2, "dtype": 3, "redop": 4, "comm": 5, "stream": 6},
    "py_stack": )" << (py_stack ? "true" : "false")
                        << "}]}\n";
    return path;
}

// commdbg attached with `spec` while the calls run; < 0: not measured (`why`).
double measure_attached(PyLoop& py, const std::string& spec, const std::string& table, long n, std::string& why) {
    Background dbg({COMMDBG_BIN, "attach", std::to_string(py.pid()), "--no-daemon", "--probes", spec,
                    "--noise-level", "0", "--table", table});
    if (dbg.wait_for_err_line("commdbg: tracing", 60).empty()) {
        why = "commdbg did not attach: " + dbg.wait(5).err.substr(0, 300);
        return -1;
    }
    double ns = best_of(py, n);
    kill(dbg.pid(), SIGINT);
    dbg.wait(120);
    return ns;
}


}  // namespace

int main(int argc, char** argv) {
    auto a = commdbg::bench::bench_args(argc, argv, {{"calls", 100000, 10}, {"rounds", 5, 1}});
    long n = a[0];
    int rounds = static_cast<int>(a[1]);
    if (geteuid() != 0) {
        std::printf("bench_py_stack: skipped — needs root to attach uprobes\n");
        return 0;
    }
    const std::string python = "/usr/bin/python3.11";
    if (access(python.c_str(), X_OK) != 0) {
        std::printf("bench_py_stack: skipped — no %s (Debian's python3.11)\n", python.c_str());
        return 0;
    }
    PyLoop py;
    if (!py.start({python, std::string(SOURCE_DIR) + "/tests/testprogs/py_stack_workload.py", "bench",
                   std::to_string(kDepth), "--lib", STUB_NCCL})) {
        std::printf("bench_py_stack: the workload did not start\n");
        return 1;
    }
    char dir_tmpl[] = "/tmp/commdbg-bench-XXXXXX";
    const std::string dir = mkdtemp(dir_tmpl);
    const std::string off = write_spec(dir, "bench-py-stack-off", false);
    const std::string on = write_spec(dir, "bench-py-stack-on", true);
    std::printf("ncclAllReduce (stub, ctypes) from %d Python frames in %s (pid %d), %ld calls per measurement "
                "(best of 3), %d rounds\n",
                kDepth, python.c_str(), py.pid(), n, rounds);
    std::vector<double> base, no_stack, stack, ratio;
    std::string why;
    for (int r = 0; r < rounds && why.empty(); ++r) {
        base.push_back(best_of(py, n));
        double a = measure_attached(py, off, dir + "/off.txt", n, why);
        double b = a < 0 ? -1 : measure_attached(py, on, dir + "/on.txt", n, why);
        if (a < 0 || b < 0) break;
        no_stack.push_back(a);
        stack.push_back(b);
        ratio.push_back(b / a);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ratio.empty()) {
        std::printf("  not measured: %s\n", why.c_str());
        return 1;
    }
    auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
    std::printf("  %-44s %9.1f ns\n", "unprobed", median(base));
    std::printf("  %-44s %9.1f ns  %6.2fx unprobed\n", "commdbg attach, py_stack false", median(no_stack),
                median(no_stack) / median(base));
    std::printf("  %-44s %9.1f ns  %6.2fx unprobed\n", "commdbg attach, py_stack true (20 frames)", median(stack),
                median(stack) / median(base));
    std::printf("  stack / no stack: %.2fx (rounds %.2f-%.2f; target <= 1.25x)\n", median(ratio), *lo, *hi);
    return 0;
}
