// SPDX-License-Identifier: Apache-2.0
// commdbg against the anchor a user would compare it with: bpftrace counting
// the same calls.  One run, one process making the calls, each tracer
// attached to it from outside in turn:
//   ncclAllReduce (real libnccl.so.2 where installed, else the stub):
//     unprobed | bpftrace count() on entry | bpftrace count() on entry and
//     return | commdbg attach --counts-only | commdbg attach (records), and
//     with each record sent by itself (COMMDBG_RECORD_BATCH=0, no per-thread
//     batches) | commdbgd's always-on node counter, with and without
//     --no-count-errors | bpftrace's entry+return count with a clock read at
//     each probe (the floor of timing calls) | bpftrace timing each call
//   on a communicator (the stub's fake one: calls that succeed, as a job's
//     do): bpftrace's entry+return count, bpftrace counting what
//     --counts-only counts (calls, elements and errors per process,
//     communicator and datatype), commdbg attach --counts-only and
//     with records (a session keeps no flight recorder; batched and not),
//     commdbgd's node
//     counter with and without --no-flight-recorder, and the two bpftrace
//     scripts that time calls, as above
//   a system call (getppid) on the host: unprobed | under commdbgd's node
//     counter, which hooks every syscall's exit | under a session
//   context switches (two threads handing a byte back and forth): unprobed
//     | under a session --counts-only | with records, whose on_switch
//     program runs at every switch of the host
//   a bystander: the same calls in this process, never traced, while each
//     tracer traces another process that maps the same file (attach
//     --no-follow too, whose probes are in that process alone)
//   torch-aten (a python loop of torch.add): unprobed | bpftrace count() on
//     at::_ops::add_Tensor::call | commdbg attach --probes torch-aten
//     --noise-level 2 (records; below level 1, or --counts-only, no op is
//     probed at all)
// ns per call and each as a ratio to bpftrace's entry+return count (for
// torch: its entry count, since return probes are off limits on C++), over
// several rounds (argv[2], default 5): the median and the range of the
// per-round ratios.  Usage: bench_anchor [calls] [rounds].
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.hpp"
#include "test_proc.hpp"
#include "torch_loop.hpp"

namespace {

using commdbg::bench::median;

using AllReduceFn = int (*)(const void*, void*, size_t, int, int, void*, void*);
using commdbg::testproc::Background;
using Clock = std::chrono::steady_clock;

struct Target {
    // Runs n calls, returns ns per call.
    std::function<double(long)> ns_per_call;
    long n;
};

double best_of(const Target& t, int rounds = 3) {
    double best = 1e18;
    for (int r = 0; r < rounds; ++r) best = std::min(best, t.ns_per_call(t.n));
    return best;
}

// bpftrace prints "Attaching N probes..." before it attaches: it is in
// place once it holds a perf_event fd per probe (its uprobes); up to 20 s.
bool wait_perf_event_fds(pid_t pid, int want) {
    auto deadline = Clock::now() + std::chrono::seconds(20);
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    while (Clock::now() < deadline) {
        int n = 0;
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(fd_dir, ec)) {
            std::error_code lec;
            if (std::filesystem::read_symlink(e.path(), lec).string() == "anon_inode:[perf_event]") ++n;
        }
        if (n >= want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

// How to start one tracer and know it is in place.
struct Tracer {
    std::string what;
    std::vector<std::string> argv;  // empty: the unprobed call
    std::string ready;              // a line it prints once attached
    bool on_stderr = true;
    int stop_sig = SIGINT;
    int perf_events = 0;  // bpftrace: in place once it holds this many perf_event fds
    std::string why;      // set: not measured, and why
};

// One tracer's measurements, one per round.
struct Row {
    std::string what;
    std::vector<double> ns;  // empty: not measured, `why` says why
    std::string why;
};

// Starts the tracer, waits until it says `ready` (commdbg and commdbgd say so
// once attached) and, for bpftrace, until its perf_events probes exist;
// measures, then stops it with `stop_sig`.  < 0: not measured (`why`).
double measure_with(const Tracer& tr, const Target& t, std::string& why) {
    if (tr.argv.empty()) return best_of(t);
    Background tracer(tr.argv);
    std::string line = tr.on_stderr ? tracer.wait_for_err_line(tr.ready, 60) : tracer.wait_for_line(tr.ready, 60);
    if (line.empty()) {
        auto r = tracer.wait(5);
        why = "did not start: " + r.err.substr(0, 300);
        return -1;
    }
    double ns = -1;
    if (tr.perf_events && !wait_perf_event_fds(tracer.pid(), tr.perf_events)) {
        why = "its probes were not attached within 20 s";
    } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ns = best_of(t);
    }
    kill(tracer.pid(), tr.stop_sig);
    tracer.wait(120);
    return ns;
}


// Every tracer in turn, `rounds` times over: the machine's speed drifts (a
// 2-core VM, bimodal), so each ratio is taken against the anchor measured in
// the same round, and the median and range over rounds are printed.
std::vector<Row> measure_rounds(const std::vector<Tracer>& tracers, const Target& t, int rounds) {
    std::vector<Row> rows;
    for (const auto& tr : tracers) rows.push_back({tr.what, {}, tr.why});
    for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < tracers.size(); ++i) {
            if (!tracers[i].why.empty() || (r > 0 && rows[i].ns.empty())) continue;
            double ns = measure_with(tracers[i], t, rows[i].why);
            if (ns >= 0) rows[i].ns.push_back(ns);
        }
    return rows;
}

std::optional<std::string> find_bpftrace() {
    for (const char* p : {"/usr/bin/bpftrace", "/usr/sbin/bpftrace", "/usr/local/bin/bpftrace"})
        if (access(p, X_OK) == 0) return std::string(p);
    return std::nullopt;
}

// a over b, round by round: the median and the range; nullopt unless both
// were measured in every round.
struct Ratio {
    double median, lo, hi;
};
std::optional<Ratio> round_ratio(const Row& a, const Row& b) {
    if (a.ns.empty() || a.ns.size() != b.ns.size()) return std::nullopt;
    std::vector<double> ratio;
    for (size_t i = 0; i < a.ns.size(); ++i) ratio.push_back(a.ns[i] / b.ns[i]);
    auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
    return Ratio{median(ratio), *lo, *hi};
}

// rows[0] is the unprobed call; `anchor` indexes the row ratios are to.
void print_rows(const std::vector<Row>& rows, size_t anchor, const std::string& anchor_name) {
    const Row& base = rows[0];
    const Row& anc = rows[anchor];
    for (const auto& r : rows) {
        if (r.ns.empty()) {
            std::printf("  %-52s %12s  (%s)\n", r.what.c_str(), "-", r.why.c_str());
            continue;
        }
        std::printf("  %-52s %9.1f ns  %7.2fx unprobed", r.what.c_str(), median(r.ns), median(r.ns) / median(base.ns));
        if (auto q = round_ratio(r, anc))
            std::printf("  %5.2fx %s (rounds %.2f-%.2f)", q->median, anchor_name.c_str(), q->lo, q->hi);
        std::printf("\n");
    }
}

// rows[num] over rows[den], round by round: the median and the range.
void print_ratio(const std::vector<Row>& rows, size_t num, size_t den, const std::string& what) {
    if (auto q = round_ratio(rows[num], rows[den]))
        std::printf("  %s: %.2fx (rounds %.2f-%.2f)\n", what.c_str(), q->median, q->lo, q->hi);
}

// What timing each call costs whoever does it, from rows[count] (bpftrace's
// entry+return count), rows[clocked] (the same with a clock read at each
// probe), rows[latency] (bpftrace timing each call), rows[counts] (commdbg
// --counts-only) and rows[records] (commdbg with records): the two clock
// reads over the count, records over the count with them, records over
// --counts-only, and records over bpftrace's histogram of durations.
void print_timing_floor(const std::vector<Row>& rows, size_t count, size_t clocked, size_t latency, size_t counts,
                        size_t records) {
    print_ratio(rows, clocked, count, "two clock reads a call: bpftrace's count with them over without them");
    print_ratio(rows, records, clocked, "records over bpftrace's count with a clock read at each probe");
    print_ratio(rows, records, counts, "records over --counts-only");
    print_ratio(rows, records, latency, "records over bpftrace timing each call");
}

// A directory for the tracers' outputs, removed with it.
struct ScratchDir {
    std::string path;
    ScratchDir() {
        char tmpl[] = "/tmp/commdbg-bench-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

// Every tracer in turn over the rounds, then their table.
void measure_and_print(const std::vector<Tracer>& tracers, const Target& t, int rounds, size_t anchor,
                       const std::string& anchor_name) {
    print_rows(measure_rounds(tracers, t, rounds), anchor, anchor_name);
}

// `commdbg attach pid` with the nccl spec, its table into `out`: counts
// only, or records (noise level 0).
Tracer attach_nccl(const std::string& what, const std::string& commdbg, const std::string& pid, bool records,
                   const std::string& out, const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {commdbg, "attach", pid, "--no-daemon", "--probes", "nccl", "--table", out};
    argv.insert(argv.end(), more.begin(), more.end());
    if (records)
        argv.insert(argv.end(), {"--noise-level", "0"});
    else
        argv.push_back("--counts-only");
    return {what, argv, "commdbg: tracing", true, SIGINT, 0, ""};
}

// The same session with each record sent by itself, as before per-thread
// batches (bpf/lib/batch.h): their A/B in one run.
Tracer unbatched(Tracer t) {
    t.what += ", unbatched";
    t.argv.insert(t.argv.begin(), {"env", "COMMDBG_RECORD_BATCH=0"});
    return t;
}

// commdbgd (beside `commdbg`)'s node counter on the socket `sock`, with
// `more` options.
Tracer node_counter(const std::string& what, const std::string& commdbg, const std::string& sock,
                    const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {commdbg.substr(0, commdbg.rfind('/')) + "/commdbgd", "--socket", sock,
                                     "--metrics-listen", ""};
    argv.insert(argv.end(), more.begin(), more.end());
    return {what, argv, "counting", true, SIGTERM, 0, ""};
}

// bpftrace with `args`, in place once it holds `probes` perf_event fds; not
// measured where there is no bpftrace, or where `why` says.
Tracer bpftrace_tracer(const std::string& what, const std::optional<std::string>& bpftrace,
                       const std::vector<std::string>& args, int probes, const std::string& why = "") {
    std::vector<std::string> argv = {bpftrace.value_or("bpftrace")};
    argv.insert(argv.end(), args.begin(), args.end());
    return {what, argv, "Attaching", false, SIGINT, probes,
            !bpftrace ? "no bpftrace (make bench installs Debian's)" : why};
}

// Runs `call` `calls` times; ns per call.
template <class Call>
double ns_per_call(long calls, Call call) {
    auto t0 = Clock::now();
    for (long i = 0; i < calls; ++i) call();
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(calls);
}

// ---- NCCL ---------------------------------------------------------------------

// n calls of `h`'s ncclAllReduce on `comm`, one float each.
Target allreduce_target(void* h, void* comm, long n) {
    auto fn = reinterpret_cast<AllReduceFn>(dlsym(h, "ncclAllReduce"));
    return {[fn, comm](long calls) {
                static float buf[4];
                return ns_per_call(calls, [&] { fn(buf, buf, 1, 7, 0, comm, nullptr); });
            },
            n};
}

// The real libnccl where installed, else the stub; the communicator each
// call passes: the real library rejects a NULL one at once (no GPU needed),
// the stub never dereferences its fake one.
struct Nccl {
    std::string lib;
    void* handle = nullptr;
    void* comm = nullptr;
    Nccl() {
        const std::string real = "/usr/local/cuda/lib64/libnccl.so.2";
        lib = access(real.c_str(), R_OK) == 0 ? real : std::string(STUB_NCCL);
        handle = dlopen(lib.c_str(), RTLD_NOW);
        if (!handle) std::printf("bench_anchor: cannot load %s: %s\n", lib.c_str(), dlerror());
        comm = lib == real ? nullptr : reinterpret_cast<void*>(0x1000);
    }
    ~Nccl() {
        if (handle) dlclose(handle);
    }
};

// bpftrace counting ncclAllReduce in `lib` on entry (and return), each probe
// with `pred` (a predicate, or empty) and `also` (statements, or none).
std::string bpftrace_count(const std::string& lib, bool returns, const std::string& pred = "",
                           const std::string& also = "") {
    std::string script = "uprobe:" + lib + ":ncclAllReduce " + pred + " { " + also + "@calls = count(); }";
    if (returns) script += " uretprobe:" + lib + ":ncclAllReduce " + pred + " { " + also + "@returns = count(); }";
    return script;
}

// The same entry+return count with the clock read at each probe (into a
// variable: bpftrace keeps the helper call, checked in its bytecode): the
// floor of every tracer that times calls, which a record's two timestamps
// pay (bpf_ktime_get_ns; a uprobe program may read no cheaper clock).
std::string bpftrace_count_clocked(const std::string& lib) {
    return bpftrace_count(lib, true, "", "$t = nsecs; ");
}

// bpftrace timing each ncclAllReduce in `lib`, as a user writes it to see
// how long the calls take (funclatency): the entry's time kept by thread,
// a histogram of durations at the return.  A record keeps each duration.
std::string bpftrace_latency(const std::string& lib) {
    return "uprobe:" + lib + ":ncclAllReduce { @start[tid] = nsecs; } uretprobe:" + lib +
           ":ncclAllReduce /@start[tid]/ { @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }";
}

// bpftrace counting what `commdbg attach --counts-only` counts of
// ncclAllReduce in `lib`: calls and elements per process, communicator and
// datatype at the entry, and at the return the calls that returned non-zero
// under the same key, which the entry leaves in a map by thread.
std::string bpftrace_keyed_count(const std::string& lib) {
    return "uprobe:" + lib +
           ":ncclAllReduce { @calls[pid, arg5, arg3] = count(); @elements[pid, arg5, arg3] = sum(arg2); "
           "@comm[tid] = arg5; @dtype[tid] = arg3; } uretprobe:" +
           lib +
           ":ncclAllReduce { if ((int32)retval != 0) { @errors[pid, @comm[tid], @dtype[tid]] = count(); } "
           "delete(@comm[tid]); delete(@dtype[tid]); }";
}

void bench_nccl(const std::string& commdbg, const std::optional<std::string>& bpftrace, long n, int rounds) {
    Nccl nccl;
    if (!nccl.handle) return;
    const Target t = allreduce_target(nccl.handle, nccl.comm, n);
    const std::string pid = std::to_string(getpid());
    std::printf("ncclAllReduce on %s, %ld calls per measurement (best of 3), %d rounds, pid %s\n", nccl.lib.c_str(),
                n, rounds, pid.c_str());
    ScratchDir dir;
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        bpftrace_tracer("bpftrace count() on entry", bpftrace, {"-p", pid, "-e", bpftrace_count(nccl.lib, false)}, 1),
        bpftrace_tracer("bpftrace count() on entry and return", bpftrace,
                        {"-p", pid, "-e", bpftrace_count(nccl.lib, true)}, 2),
        attach_nccl("commdbg attach --counts-only", commdbg, pid, false, dir.path + "/counts.txt"),
        attach_nccl("commdbg attach (records)", commdbg, pid, true, dir.path + "/records.txt"),
        unbatched(attach_nccl("commdbg attach (records)", commdbg, pid, true, dir.path + "/records-u.txt")),
        node_counter("commdbgd node counter (always on)", commdbg, dir.path + "/d.sock"),
        node_counter("commdbgd node counter --no-count-errors", commdbg, dir.path + "/d2.sock", {"--no-count-errors"}),
        bpftrace_tracer("bpftrace entry+return count, a clock read at each", bpftrace,
                        {"-p", pid, "-e", bpftrace_count_clocked(nccl.lib)}, 2),
        bpftrace_tracer("bpftrace timing each call (histogram)", bpftrace,
                        {"-p", pid, "-e", bpftrace_latency(nccl.lib)}, 2),
    };
    const std::vector<Row> rows = measure_rounds(tracers, t, rounds);
    print_rows(rows, 2, "bpftrace entry+return");
    print_ratio(rows, 4, 5, "records in per-thread batches over each record by itself");
    print_timing_floor(rows, 2, 8, 9, 3, 4);
}

// What a tracer of another process costs a process it does not trace that
// calls the same function (a bystander: another job's rank on the same node,
// a notebook using the same NCCL).  The other process maps the same file and
// holds it; this one, never traced, makes the calls.  A uprobe belongs to the
// file: every process mapping it takes the trap, and commdbg's program
// returns at once for an untraced one (docs/safety.md), except under attach
// --no-follow, whose probes are in the traced process alone.  bpftrace is
// measured with -p and with a pid predicate.
void bench_bystander(const std::string& commdbg, const std::optional<std::string>& bpftrace, long n, int rounds) {
    Nccl nccl;
    if (!nccl.handle) return;
    Background other({LIB_MAPPER, "--hold", "3600000", nccl.lib});
    if (other.wait_for_line("done", 30).empty()) {
        std::printf("bench_anchor: %s did not map %s\n", LIB_MAPPER, nccl.lib.c_str());
        return;
    }
    const Target t = allreduce_target(nccl.handle, nccl.comm, n);
    const std::string pid = std::to_string(other.pid());
    std::printf("a bystander: ncclAllReduce on %s in this process (pid %d, never traced) while a tracer traces "
                "pid %s, which maps the same file; %ld calls per measurement (best of 3), %d rounds\n",
                nccl.lib.c_str(), static_cast<int>(getpid()), pid.c_str(), n, rounds);
    ScratchDir dir;
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        bpftrace_tracer("bpftrace -p <other> entry+return count", bpftrace,
                        {"-p", pid, "-e", bpftrace_count(nccl.lib, true)}, 2),
        bpftrace_tracer("bpftrace /pid == <other>/ entry+return count", bpftrace,
                        {"-e", bpftrace_count(nccl.lib, true, "/pid == " + pid + "/")}, 2),
        attach_nccl("commdbg attach <other> --counts-only", commdbg, pid, false, dir.path + "/counts.txt"),
        attach_nccl("commdbg attach <other> (records)", commdbg, pid, true, dir.path + "/records.txt"),
        attach_nccl("commdbg attach <other> --no-follow --counts-only", commdbg, pid, false,
                    dir.path + "/counts-nf.txt", {"--no-follow"}),
        attach_nccl("commdbg attach <other> --no-follow (records)", commdbg, pid, true, dir.path + "/records-nf.txt",
                    {"--no-follow"}),
    };
    measure_and_print(tracers, t, rounds, 0, "unprobed");
    kill(other.pid(), SIGTERM);
    other.wait(10);
}

// Calls that succeed on a communicator, as a job's do (the stub with its
// fake one: real NCCL without a GPU rejects the NULL one at once, so the
// section above measures calls that fail, each counted as an error at its
// return, and never the flight recorder, which skips a call without a
// communicator): bpftrace's entry+return count, commdbg's sessions, and
// commdbgd's node counter without and with its flight recorder.  A session
// keeps no recorder (only commdbgd's is read).  Ratios to bpftrace, then the
// recorder's: the node counter with it over the node counter without.
void bench_comm(const std::string& commdbg, const std::optional<std::string>& bpftrace, long n, int rounds) {
    void* h = dlopen(STUB_NCCL, RTLD_NOW);
    if (!h) {
        std::printf("bench_anchor: cannot load %s: %s\n", STUB_NCCL, dlerror());
        return;
    }
    const Target t = allreduce_target(h, reinterpret_cast<void*>(0x1000), n);
    const std::string pid = std::to_string(getpid());
    std::printf("on a communicator: ncclAllReduce on %s, %ld calls per measurement (best of 3), %d rounds\n",
                STUB_NCCL, n, rounds);
    ScratchDir dir;
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        bpftrace_tracer("bpftrace count() on entry and return", bpftrace,
                        {"-p", pid, "-e", bpftrace_count(STUB_NCCL, true)}, 2),
        bpftrace_tracer("bpftrace keyed as --counts-only counts", bpftrace,
                        {"-p", pid, "-e", bpftrace_keyed_count(STUB_NCCL)}, 2),
        attach_nccl("commdbg attach --counts-only", commdbg, pid, false, dir.path + "/counts.txt"),
        attach_nccl("commdbg attach (records)", commdbg, pid, true, dir.path + "/records.txt"),
        unbatched(attach_nccl("commdbg attach (records)", commdbg, pid, true, dir.path + "/records-u.txt")),
        node_counter("commdbgd node counter --no-flight-recorder", commdbg, dir.path + "/d.sock",
                     {"--no-flight-recorder"}),
        node_counter("commdbgd node counter (recorder on)", commdbg, dir.path + "/d2.sock"),
        bpftrace_tracer("bpftrace entry+return count, a clock read at each", bpftrace,
                        {"-p", pid, "-e", bpftrace_count_clocked(STUB_NCCL)}, 2),
        bpftrace_tracer("bpftrace timing each call (histogram)", bpftrace,
                        {"-p", pid, "-e", bpftrace_latency(STUB_NCCL)}, 2),
    };
    const std::vector<Row> rows = measure_rounds(tracers, t, rounds);
    print_rows(rows, 1, "bpftrace entry+return");
    print_ratio(rows, 3, 2, "--counts-only over bpftrace counting the same keys and errors");
    print_ratio(rows, 4, 5, "records in per-thread batches over each record by itself");
    print_ratio(rows, 7, 6, "the flight recorder: the node counter with it over without it");
    print_timing_floor(rows, 1, 8, 9, 3, 4);
    dlclose(h);
}

// What commdbgd costs every system call on the host: to stop a process that
// maps a new libnccl file before its first call, the node counter hooks the
// exit of every system call (tp_btf/sys_exit; no fexit on this kernel), and
// an enabled syscall tracepoint sends every syscall of every task through
// the kernel's slow exit path.  A session hooks none.  getppid(2) in a loop,
// unprobed and under each.
void bench_syscall(const std::string& commdbg, long n, int rounds) {
    void* h = dlopen(STUB_NCCL, RTLD_NOW);  // for the session to probe
    const Target t = {[](long calls) { return ns_per_call(calls, [] { syscall(SYS_getppid); }); }, n};
    std::printf("a system call: getppid() in this process, %ld calls per measurement (best of 3), %d rounds\n", n,
                rounds);
    ScratchDir dir;
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        node_counter("commdbgd node counter", commdbg, dir.path + "/d.sock"),
        attach_nccl("commdbg attach --counts-only (this process)", commdbg, std::to_string(getpid()), false,
                    dir.path + "/counts.txt"),
    };
    measure_and_print(tracers, t, rounds, 0, "unprobed");
    if (h) dlclose(h);
}

// A session with batched records runs a program at every context switch of
// the host (bpf/lib/batch.h, on_switch).  Two threads of this process, both on CPU 0,
// hand a byte to each other through pipes: each hand-over a switch from one
// to the other.  Under --counts-only the program is not there: their ratio
// is its cost.
void bench_switch(const std::string& commdbg, long n, int rounds) {
    void* h = dlopen(STUB_NCCL, RTLD_NOW);  // for the session to probe
    int there[2], back[2];
    if (pipe(there) || pipe(back)) return;
    cpu_set_t all, cpu0;
    CPU_ZERO(&cpu0);
    CPU_SET(0, &cpu0);
    pthread_getaffinity_np(pthread_self(), sizeof all, &all);
    pthread_setaffinity_np(pthread_self(), sizeof cpu0, &cpu0);
    std::thread echo([&] {
        pthread_setaffinity_np(pthread_self(), sizeof cpu0, &cpu0);
        char c = 0;
        while (read(there[0], &c, 1) == 1 && c) (void)!write(back[1], &c, 1);
    });
    // Two calls first, whose records (without context) start the session's
    // batches and with them its switch-out program; time for it to see them.
    auto call = h ? reinterpret_cast<AllReduceFn>(dlsym(h, "ncclAllReduce")) : nullptr;
    const Target t = {[&](long trips) {
                          static float buf[4];
                          for (int i = 0; call && i < 2; ++i)
                              call(buf, buf, 1, 7, 0, reinterpret_cast<void*>(0x1000), nullptr);
                          std::this_thread::sleep_for(std::chrono::milliseconds(50));
                          return ns_per_call(trips, [&] {
                              char c = 1;
                              (void)!write(there[1], &c, 1);
                              (void)!read(back[0], &c, 1);
                          });
                      },
                      n};
    std::printf("context switches: a byte there and back between two threads of this process on one CPU (two "
                "switches), %ld round trips per measurement (best of 3), %d rounds\n",
                n, rounds);
    ScratchDir dir;
    const std::string pid = std::to_string(getpid());
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        attach_nccl("commdbg attach --counts-only (this process)", commdbg, pid, false, dir.path + "/counts.txt"),
        attach_nccl("commdbg attach (records; on_switch)", commdbg, pid, true, dir.path + "/records.txt"),
    };
    const std::vector<Row> rows = measure_rounds(tracers, t, rounds);
    print_rows(rows, 0, "unprobed");
    print_ratio(rows, 2, 1, "the switch-out flush: records over --counts-only");
    char stop = 0;
    (void)!write(there[1], &stop, 1);
    echo.join();
    pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
    if (h) dlclose(h);
}

// ---- torch-aten ------------------------------------------------------------------

std::optional<std::string> libtorch_of(pid_t pid) {
    FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "r");
    if (!f) return std::nullopt;
    char line[4096];
    std::optional<std::string> out;
    while (std::fgets(line, sizeof(line), f)) {
        std::string l = line;
        auto at = l.find('/');
        if (at == std::string::npos || l.find("libtorch_cpu.so") == std::string::npos) continue;
        out = l.substr(at, l.find_last_not_of("\n") - at + 1);
        break;
    }
    std::fclose(f);
    return out;
}

void bench_torch(const std::string& commdbg, const std::optional<std::string>& bpftrace, long n, int rounds) {
    commdbg::bench::TorchLoop py;
    if (access("/usr/bin/python3", X_OK) != 0 || !py.start("/usr/bin/python3")) {
        std::printf("torch-aten: skipped — /usr/bin/python3 cannot import torch (Debian: apt install python3-torch)\n");
        return;
    }
    Target t{[&py](long ops) {
                 py.go(ops);
                 return py.seconds() * 1e9 / static_cast<double>(ops);
             },
             n};
    auto lib = libtorch_of(py.pid());
    const std::string pid = std::to_string(py.pid());
    std::printf("torch.add on 8 floats in /usr/bin/python3 (pid %s), %ld ops per measurement (best of 3), %d rounds\n",
                pid.c_str(), n, rounds);
    ScratchDir dir;
    std::vector<Tracer> tracers = {
        {"unprobed", {}, "", true, 0, 0, ""},
        bpftrace_tracer("bpftrace count() on entry of at::_ops::add_Tensor::call", bpftrace,
                        {"-p", pid, "-e",
                         "uprobe:" + lib.value_or("") +
                             ":_ZN2at4_ops10add_Tensor4callERKNS_6TensorES4_RKN3c106ScalarE { @calls = count(); }"},
                        1, lib ? "" : "libtorch_cpu.so not mapped"),
        // Ops are probed only where records show them (noise level >= 1;
        // --counts-only counts collectives only): the level that shows add.
        {"commdbg attach --probes torch-aten --noise-level 2",
         {commdbg, "attach", pid, "--no-daemon", "--probes", "torch-aten", "--noise-level", "2", "--table",
          dir.path + "/records.txt"},
         "commdbg: tracing", true, SIGINT, 0, ""},
    };
    measure_and_print(tracers, t, rounds, 1, "bpftrace entry");
}

}  // namespace

int main(int argc, char** argv) {
    auto a = commdbg::bench::bench_args(argc, argv, {{"calls", 200000, 10}, {"rounds", 5, 1}});
    long n = a[0];
    int rounds = static_cast<int>(a[1]);
    if (geteuid() != 0) {
        std::printf("bench_anchor: skipped — needs root to attach uprobes\n");
        return 0;
    }
    auto bpftrace = find_bpftrace();
    bench_nccl(COMMDBG_BIN, bpftrace, n, rounds);
    bench_comm(COMMDBG_BIN, bpftrace, n, rounds);
    bench_syscall(COMMDBG_BIN, n * 5, rounds);
    bench_switch(COMMDBG_BIN, n / 10, rounds);
    bench_bystander(COMMDBG_BIN, bpftrace, n / 10, rounds);
    bench_torch(COMMDBG_BIN, bpftrace, n / 10, rounds);
    return 0;
}
