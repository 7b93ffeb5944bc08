// SPDX-License-Identifier: Apache-2.0
// Does a commdbg --trace file open in Perfetto, and show what the file says?
//
// load_in_perfetto() feeds the file to Perfetto's trace processor -- the
// WebAssembly engine of a packaged Perfetto UI build, driven over the UI's own
// RPC by perfetto_tp.js under node -- and reads back what the UI would draw:
// slices with their thread, depth and parent, process and thread names, the
// trace bounds, the args of collectives, and Perfetto's import error stats.
// compare_with_file() sets that against the file's own events, so a trace the
// viewer misreads (wrong unit, broken nesting, lost events) is a mismatch.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>


#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "test_proc.hpp"

namespace commdbg::perfetto_check {

// Empty when node and the Perfetto UI build are present, else why not and
// what to run.
std::string unavailable_reason();

// Skips a test that needs Perfetto where it is missing; under CI=true,
// where `make test` has fetched it, a missing Perfetto is a failure.
#define REQUIRE_PERFETTO() REQUIRE_NO_REASON(::commdbg::perfetto_check::unavailable_reason())

struct Slice {
    uint64_t pid = 0, tid = 0;
    std::string name, cat;
    int64_t ts = 0, dur = 0;  // ns
    int64_t depth = 0;
    std::string parent;     // parent slice's name, "" for a root
    std::string collective;  // args.collective, "" when absent
    int64_t bytes = -1;      // args.bytes, -1 when absent
};

struct Loaded {
    std::string perfetto_version;
    std::string error;  // the load failed, or a query did
    std::vector<Slice> slices;  // ordered by pid, tid, ts, depth
    std::map<uint64_t, std::string> process_names, thread_names;
    int64_t start_ts = 0, end_ts = 0;  // trace_bounds
    std::vector<std::string> error_stats;  // "name[idx]=value" of error/data_loss stats
};

Loaded load_in_perfetto(const std::string& trace_path);

// What Perfetto must show for this Chrome trace JSON: its "X" events as
// slices (us -> ns), nested per thread by time, and its name metadata.
Loaded expected_from_file(const nlohmann::json& trace);

// Every difference between what Perfetto shows and what the file says; empty
// when they agree.  Perfetto v20 turns a fractional "dur" into ns by
// truncating a double, so a duration may read 1 ns short; nothing else may
// differ.
std::vector<std::string> compare_with_file(const Loaded& got, const nlohmann::json& trace);

// One indented line per difference, for a failure message.
std::string lines(const std::vector<std::string>& diffs);

}  // namespace commdbg::perfetto_check
