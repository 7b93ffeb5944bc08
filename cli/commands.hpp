// SPDX-License-Identifier: Apache-2.0
// One file per subcommand; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

#include "common.hpp"

namespace commdbg::cli {

// Thrown by a subcommand's callback to carry its exit status out of CLI11.
struct CommandDone {
    int rc;
};

void register_attach(CLI::App& app);
void register_run(CLI::App& app);
void register_probes(CLI::App& app);
void register_daemon_commands(CLI::App& app);  // status, counts, sessions, detach

}  // namespace commdbg::cli
