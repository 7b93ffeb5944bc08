// SPDX-License-Identifier: Apache-2.0
// What a finished tracing window produces, rendered once and shared by the
// CLI (embedded session) and commdbgd (session on behalf of a client).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "trace_session.hpp"

namespace commdbg::session {

struct SessionOutput {
    std::string table;        // plain text
    std::string table_color;  // ANSI colours, for a terminal (when wanted)
    std::string json;         // the --json dump (when wanted)
    std::string trace;        // Chrome trace JSON (when wanted)
    std::vector<std::string> messages;  // "note: ...", "warning: ..." lines for stderr
    // The FSDP lifecycle checks (commdbg check): processes whose scopes a
    // lifecycle profile recognised, and what was found in them and across them.
    struct Fsdp {
        size_t processes = 0, violations = 0, warnings = 0;
        std::string verdict;  // the table's check sections, for `commdbg check`
    } fsdp;
};

// The ranks of one job compared: every report with a lifecycle, in rank
// order where a communicator says the rank, else by pid.
std::vector<fsdp::Finding> fsdp_cross_rank(const std::vector<snapshot::ProcessSnapshot>& reports);

// The outputs by their control-protocol names ("table", "table_color",
// "json", "trace"), in the order a daemon session sends them.
std::array<std::pair<const char*, std::string*>, 4> named_outputs(SessionOutput& o);

// Only what is wanted is rendered: at the default budget of 200000 records
// per process each output is tens of MB of text.
struct OutputWants {
    bool table_color = true;
    bool json = true;
    bool trace = false;
};

SessionOutput render_session(TraceSession& s, int noise_level, const OutputWants& wants);

// Traces until `duration_s` passes (0: no limit), `stop()` turns true, or the
// target exits; then drains the ring buffer.  Returns whether it exited.
bool run_attach_window(TraceSession& s, int pid, double duration_s, const std::function<bool()>& stop);

}  // namespace commdbg::session
