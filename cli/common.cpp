// SPDX-License-Identifier: Apache-2.0
#include "common.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "report.hpp"
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
}

void add_trace_options(CLI::App* app, TraceCliOptions& o) {
    app->add_option("--json", o.json_file, "Write the JSON dump (comm_counts, records, communicators, ...) to FILE, atomically");
    app->add_option("--table", o.table_file, "Write the table to FILE (no colour)");
    app->add_option("--trace", o.trace_file, "Write a Chrome/Perfetto trace (trace event JSON) to FILE");
    app->add_option("--noise-level", o.noise_level,
                    "0 collectives only, 1 + ops (default), 2 + module annotations, 3 + trivial ops")
        ->check(CLI::Range(0, 3));
    app->add_option("--max-records", o.max_records, "Records retained per process; past it they are counted as dropped")
        ->check(CLI::PositiveNumber);
    app->add_option("--max-depth", o.max_depth, "Nesting depth retained per thread")->check(CLI::PositiveNumber);
    app->add_option("--ringbuf-kb", o.ringbuf_kb, "Kernel ring-buffer size in KiB (records past it are dropped and counted)")
        ->check(CLI::Range(4, 1 << 20));
    app->add_option("--probes", o.probes,
                    "Probe specs to use: built-in names (see `commdbg probes list`) or JSON files; default: all built-ins")
        ->delimiter(',');
    app->add_flag("--counts-only", o.counts_only, "Exact counters only, no per-call records (lowest overhead)");
}

SessionOptions session_options(const TraceCliOptions& o) {
    SessionOptions s;
    s.ringbuf_bytes = o.ringbuf_kb * 1024;
    s.limits.max_records = o.max_records;
    s.limits.max_depth = o.max_depth;
    s.probes = o.probes;
    s.records = !o.counts_only;
    return s;
}

void print_messages(TraceSession& s) {
    for (const auto& m : s.take_messages()) std::cerr << "commdbg: note: " << m << "\n";
}

int write_outputs(const SessionOutput& out, const TraceCliOptions& o) {
    for (const auto& m : out.messages) std::cerr << "commdbg: " << m << "\n";
    int rc = 0;
    auto write = [&](const std::string& path, const std::string& content, const char* what) {
        if (path.empty()) return;
        try {
            write_file_atomic(path, content);
        } catch (const std::exception& e) {
            std::cerr << "commdbg: writing the " << what << ": " << e.what() << "\n";
            rc = 1;
        }
    };
    write(o.table_file, out.table, "table");
    write(o.json_file, out.json, "JSON dump");
    write(o.trace_file, out.trace, "trace");
    // Files first: a closed stdout (`| head`) must not cost the user the dump.
    std::cout << (isatty(STDOUT_FILENO) ? out.table_color : out.table);
    std::cout.flush();
    return rc;
}

int emit_outputs(TraceSession& s, const TraceCliOptions& o) {
    OutputWants wants{.table_color = isatty(STDOUT_FILENO) != 0,
                      .json = !o.json_file.empty(),
                      .trace = !o.trace_file.empty()};
    return write_outputs(render_session(s, o.noise_level, wants), o);
}

}  // namespace commdbg::cli
