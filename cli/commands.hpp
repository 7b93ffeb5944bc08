// SPDX-License-Identifier: Apache-2.0
// One file per subcommand; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace commdbg::cli {

// Thrown by a subcommand's callback to carry its exit status out of CLI11.
struct CommandDone {
    int rc;
};

// What a subcommand does with a finished window: render, write, decide the
// exit status (the traced command's wait status, when it ran one).
using FinishWindow = std::function<int(session::TraceSession& s, std::optional<int> wait_status)>;

// `commdbg run`'s tracing: CMD started held, traced from its first
// instruction with every process it forks, until it exits.
int trace_command(std::string_view verb, const std::vector<std::string>& command, TraceCliOptions& trace,
                  const FinishWindow& finish);
int exit_status(int wait_status);  // as a shell reports it: 128+N for signal N
// `commdbg attach`'s checks of a pid (the process of a thread id): its tgid,
// or nullopt once the problem is said.
std::optional<int> attach_target(int pid, std::string_view verb);
// Traces `pid` in this process for `duration` seconds (0: until Ctrl-C or it exits).
int attach_in_process(std::string_view verb, int pid, double duration, bool follow, TraceCliOptions& trace,
                      const FinishWindow& finish);

void register_attach(CLI::App& app);
void register_check(CLI::App& app);
void register_hang(CLI::App& app);
void register_run(CLI::App& app);
void register_probes(CLI::App& app);
void register_daemon_commands(CLI::App& app);  // status, counts, sessions, detach

}  // namespace commdbg::cli
