// SPDX-License-Identifier: Apache-2.0
// What `attach` and `run` share: trace options, stop signals, output.
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <string>
#include <vector>

#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg::cli {

struct TraceCliOptions {
    std::string json_file;
    std::string table_file;
    std::string trace_file;
    int noise_level = 1;
    size_t max_records = 200000;
    size_t max_depth = 128;
    size_t ringbuf_kb = 8192;
    std::vector<std::string> probes;
    bool counts_only = false;
};

void add_trace_options(CLI::App* app, TraceCliOptions& o);
SessionOptions session_options(const TraceCliOptions& o);

// Set by SIGINT / SIGTERM; the handlers are installed without SA_RESTART so a
// blocking poll returns at once.
extern std::atomic<int> g_stop_signal;
void install_stop_handlers();

// Prints notes, the table(s) and writes the requested files.  Returns 0, or 1
// when an output file could not be written.
int emit_outputs(TraceSession& s, const TraceCliOptions& o);

void print_messages(TraceSession& s);

// Prints messages and the table, writes the requested files (also used for a
// session that commdbgd ran).  Returns 0, or 1 when a file could not be written.
int write_outputs(const SessionOutput& out, const TraceCliOptions& o);

}  // namespace commdbg::cli
