// SPDX-License-Identifier: Apache-2.0
// What `attach` and `run` share: trace options, stop signals, output.
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <string>
#include <vector>

#include "limits.hpp"
#include "option_checks.hpp"
#include "output_file.hpp"
#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg::cli {

struct TraceCliOptions {
    std::string json_file;
    std::string table_file;
    std::string trace_file;
    int noise_level = 1;
    size_t max_records = limits::kDefaultMaxRecords;
    size_t max_depth = limits::kDefaultMaxDepth;
    size_t ringbuf_kb = limits::kDefaultRingbufKb;
    std::vector<std::string> probes;
    bool counts_only = false;
    bool stack_args = false;
    std::string py_stack = "default";
    uint32_t py_depth = CD_DEFAULT_PY_FRAMES;
    bool cost = false;  // --cost: commdbg's own CPU on stderr at the end
    std::vector<fsdp::Profile> lifecycle_profiles;  // commdbg check --profile
    // Which outputs the user named (`--json ""` is named, and an error).
    CLI::Option* json_opt = nullptr;
    CLI::Option* table_opt = nullptr;
    CLI::Option* trace_opt = nullptr;
    // Filled by check_trace_outputs() before tracing starts.
    std::vector<host::OutputTarget> targets;
};

void add_trace_options(CLI::App* app, TraceCliOptions& o);
session::SessionOptions session_options(const TraceCliOptions& o);

// Checks every output the user named before anything is traced (directory,
// writable, not a directory, distinct, room left); on a problem prints it
// and returns false.
bool check_trace_outputs(TraceCliOptions& o);

// Set by SIGINT / SIGTERM / SIGHUP (a dropped ssh session); the handlers are
// installed without SA_RESTART so a blocking poll returns at once.  SIGPIPE is
// ignored: a closed stdout or stderr must not cost the user the files.
extern std::atomic<int> g_stop_signal;
void install_stop_handlers();

// Prints notes, the table(s) and writes the requested files.  Returns 0, or 1
// when an output file could not be written.
int emit_outputs(session::TraceSession& s, const TraceCliOptions& o);

void print_messages(session::TraceSession& s);

// --cost's line: commdbg's own CPU in all (getrusage), setting up, per record.
std::string describe_cost(const session::SessionCost& c);
std::string describe_probe_hits(const capture::ProbeHits& h);

// Prints messages and the table, writes the requested files (also used for a
// session that commdbgd ran).  Returns 0, or 1 when a file could not be written.
// `stdout_text`: printed in place of the table (commdbg check's verdict).
int write_outputs(const session::SessionOutput& out, const TraceCliOptions& o,
                  const std::string* stdout_text = nullptr);

}  // namespace commdbg::cli
