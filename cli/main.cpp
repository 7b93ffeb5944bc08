// SPDX-License-Identifier: Apache-2.0
// commdbg: see what a distributed training job's collectives do, from outside.
#include <iostream>

#include "commands.hpp"
#include "result.hpp"
#include "revision.hpp"

int main(int argc, char** argv) {
    using namespace commdbg::cli;
    CLI::App app{"commdbg — trace NCCL collectives and framework ops of running processes with eBPF, no code change"};
    app.set_version_flag("--version", std::string("commdbg ") + COMMDBG_VERSION + " (" + COMMDBG_REVISION + ")");
    app.require_subcommand(1);
    register_attach(app);
    register_run(app);
    register_check(app);
    register_hang(app);
    register_probes(app);
    register_daemon_commands(app);
    try {
        app.parse(argc, argv);
    } catch (const CommandDone& d) {
        return d.rc;
    } catch (const CLI::ParseError& e) {
        // Usage errors exit 2 (CLI11 has a code per error kind: 105, 106, ...).
        int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    } catch (const commdbg::CommdbgError& e) {
        std::cerr << "commdbg: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
