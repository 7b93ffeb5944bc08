// SPDX-License-Identifier: Apache-2.0
#include "common.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "render.hpp"
#include "session_output.hpp"

namespace commdbg::cli {

std::atomic<int> g_stop_signal{0};

namespace {
void on_stop(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: interrupt the poll
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
}

void add_trace_options(CLI::App* app, TraceCliOptions& o) {
    o.json_opt = app->add_option("--json", o.json_file,
                                 "Write the JSON dump (comm_counts, records, communicators, ...) to FILE: a regular "
                                 "file is replaced atomically, a device, FIFO or /dev/stdout written through");
    o.table_opt = app->add_option("--table", o.table_file, "Write the table to FILE (no colour)");
    o.trace_opt = app->add_option("--trace", o.trace_file, "Write a Chrome/Perfetto trace (trace event JSON) to FILE");
    app->add_option("--noise-level", o.noise_level,
                    "0 collectives only, 1 + ops (default), 2 + module annotations, 3 + trivial ops")
        ->check(CLI::Range(0, 3));
    app->add_option("--max-records", o.max_records,
                    "Records retained per process (default " + std::to_string(limits::kDefaultMaxRecords) +
                        "); past it they are counted as dropped")
        ->check(integer_in(1, limits::kMaxRecordsCeiling));
    app->add_option("--max-depth", o.max_depth,
                    "Nesting depth retained per thread (default " + std::to_string(limits::kDefaultMaxDepth) + ")")
        ->check(integer_in(1, limits::kMaxDepthCeiling));
    app->add_option("--ringbuf-kb", o.ringbuf_kb,
                    "Kernel ring-buffer size in KiB (default " + std::to_string(limits::kDefaultRingbufKb) +
                        "; records past it are dropped and counted)")
        ->check(integer_in(limits::kMinRingbufKb, limits::kMaxRingbufKb));
    app->add_option("--probes", o.probes,
                    "Probe specs to use: built-in names (see `commdbg probes list`) or JSON files; default: all built-ins")
        ->delimiter(',');
    app->add_flag("--counts-only", o.counts_only,
                  "Exact counters only, no per-call records (lowest overhead: only collectives, communicator and "
                  "group calls are probed)");
    app->add_flag("--stack-args", o.stack_args,
                  "Records also show the arguments passed on the caller's stack that nothing counts (NCCL's "
                  "stream): one user-memory read more per recorded call");
    app->add_option("--py-stack", o.py_stack,
                    "Python stacks in records: off, default (collectives, c10d calls, record_function scopes) "
                    "or ops (also every ATen op)")
        ->check(CLI::IsMember({"off", "default", "ops"}));
    app->add_option("--py-depth", o.py_depth,
                    "Python frames captured per record, innermost first (default " +
                        std::to_string(CD_DEFAULT_PY_FRAMES) + ", at most " + std::to_string(CD_MAX_PY_FRAMES) +
                        "); deeper stacks are marked truncated")
        ->check(integer_in(1, CD_MAX_PY_FRAMES));
    app->add_flag("--cost", o.cost,
                  "Print commdbg's own CPU at the end (stderr): setting processes up (symbols, probes, Python and "
                  "torch discovery), and handling records, per record; and how often the probes fired (each a trap "
                  "in the calling process; the kernel's BPF run statistics are on meanwhile)");
}

session::SessionOptions session_options(const TraceCliOptions& o) {
    session::SessionOptions s;
    s.ringbuf_bytes = o.ringbuf_kb * 1024;
    s.limits.max_records = o.max_records;
    s.limits.max_depth = o.max_depth;
    s.probes = o.probes;
    s.records = !o.counts_only;
    s.stack_args = o.stack_args;
    s.py_stack = python::parse_py_stack_mode(o.py_stack).value_or(python::PyStackMode::Default);
    s.py_depth = o.py_depth;
    s.lifecycle_profiles = o.lifecycle_profiles;
    s.view_noise_level = o.trace_opt && o.trace_opt->count() ? 3 : o.noise_level;
    s.owner_uid = geteuid();  // the kernel's rule, as through commdbgd (0: root, unchecked)
    s.owner_gid = getegid();
    s.probe_hits = o.cost;
    return s;
}

bool check_trace_outputs(TraceCliOptions& o) {
    std::vector<std::pair<std::string, std::string>> named;
    if (o.table_opt && o.table_opt->count()) named.emplace_back("--table", o.table_file);
    if (o.json_opt && o.json_opt->count()) named.emplace_back("--json", o.json_file);
    if (o.trace_opt && o.trace_opt->count()) named.emplace_back("--trace", o.trace_file);
    auto targets = host::check_outputs(named);
    if (!targets) {
        std::cerr << "commdbg: " << targets.error() << " (nothing was traced)\n";
        return false;
    }
    o.targets = std::move(targets.value());
    return true;
}

void print_messages(session::TraceSession& s) {
    for (const auto& m : s.take_messages()) std::cerr << "commdbg: note: " << m << "\n";
}

int write_outputs(const session::SessionOutput& out, const TraceCliOptions& o, const std::string* stdout_text) {
    for (const auto& m : out.messages) std::cerr << "commdbg: " << m << "\n";
    int rc = 0;
    for (const auto& t : o.targets) {
        const bool table = t.option == "--table", json = t.option == "--json";
        const std::string& content = table ? out.table : json ? out.json : out.trace;
        const char* what = table ? "table" : json ? "JSON dump" : "trace";
        try {
            write_output(t, content);
        } catch (const std::exception& e) {
            rc = 1;
            // Checked before the window, failed after it (the disk filled up,
            // the reader went away): the window is kept somewhere else.
            const char* kind = table ? "table" : json ? "dump" : "trace";
            auto saved = host::save_fallback(kind, table ? "txt" : "json", content);
            std::cerr << "commdbg: writing the " << what << " (" << t.option << "): " << e.what()
                      << (saved ? " — saved it to " + *saved + " instead" : " — and no fallback worked: " + saved.error())
                      << "\n";
        }
    }
    // Files first: a closed stdout (`| head`) must not cost the user the dump.
    std::cout << (stdout_text ? *stdout_text : isatty(STDOUT_FILENO) ? out.table_color : out.table);
    std::cout.flush();
    return rc;
}

// "commdbg: own CPU 1.42 s: 0.61 s in 12 process set-ups (...), 0.74 s
// handling 52113 records (14.2 us each), 0.07 s the rest (loading the BPF
// programs, the report)".
std::string describe_cost(const session::SessionCost& c) {
    rusage self{};
    getrusage(RUSAGE_SELF, &self);
    auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
    const double total = secs(self.ru_utime) + secs(self.ru_stime);
    const double setup = 1e-9 * static_cast<double>(c.setup_ns), records = 1e-9 * static_cast<double>(c.records_ns);
    char line[768];
    std::snprintf(line, sizeof line,
                  "commdbg: own CPU %.2f s: %.2f s in %llu process set-ups (at attach, fork, exec and dlopen: symbols, "
                  "probes, Python and torch discovery; %llu loader stops before a mapping needed none), %.2f s handling "
                  "%llu records (%.1f us each; %llu came in their thread's batch, %llu of them read from the thread at "
                  "the window's end), %.2f s the rest (loading the BPF programs, the report)\n",
                  total, setup, static_cast<unsigned long long>(c.setups),
                  static_cast<unsigned long long>(c.loader_stops_unscanned), records,
                  static_cast<unsigned long long>(c.records),
                  c.records ? 1e6 * records / static_cast<double>(c.records) : 0.0,
                  static_cast<unsigned long long>(c.batched), static_cast<unsigned long long>(c.batched_at_end),
                  std::max(0.0, total - setup - records));
    return line;
}

// "commdbg: probes fired 120034 times (120000 entries, 30 returns, 4 loader
// changes) ...": what the job paid, beside commdbg's own CPU.
std::string describe_probe_hits(const capture::ProbeHits& h) {
    if (!h.counted)
        return "commdbg: probe hits not counted: the kernel refused to turn its BPF run statistics on "
               "(bpf_enable_stats; needs CAP_SYS_ADMIN)\n";
    const uint64_t hits = h.entries + h.returns + h.loader;
    char line[640];
    std::snprintf(line, sizeof line,
                  "commdbg: probes fired %llu times (%llu entries, %llu returns, %llu loader changes), each a trap "
                  "in the calling thread, %s (docs/safety.md); commdbg's BPF programs took %.3f s of them "
                  "(%.0f ns a hit)\n",
                  static_cast<unsigned long long>(hits), static_cast<unsigned long long>(h.entries),
                  static_cast<unsigned long long>(h.returns), static_cast<unsigned long long>(h.loader),
                  h.one_process ? "in the traced process only (--no-follow)"
                                : "in every process that maps a probed file, traced or not",
                  1e-9 * static_cast<double>(h.run_ns),
                  hits ? static_cast<double>(h.run_ns) / static_cast<double>(hits) : 0.0);
    return line;
}

int emit_outputs(session::TraceSession& s, const TraceCliOptions& o) {
    session::OutputWants wants{.table_color = isatty(STDOUT_FILENO) != 0,
                      .json = !o.json_file.empty(),
                      .trace = !o.trace_file.empty()};
    const int rc = write_outputs(render_session(s, o.noise_level, wants), o);
    if (o.cost) std::cerr << describe_cost(s.cost()) << describe_probe_hits(s.probe_hits());
    return rc;
}

}  // namespace commdbg::cli
