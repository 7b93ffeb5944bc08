// SPDX-License-Identifier: Apache-2.0
// commdbg attach PID: trace one running process for a window.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "procfs.hpp"

namespace commdbg::cli {

namespace {

struct AttachOptions {
    int pid = 0;
    double duration = 0;  // 0: until Ctrl-C or the target exits
    TraceCliOptions trace;
};

int run_attach(const AttachOptions& o) {
    const std::string who = "commdbg: attach " + std::to_string(o.pid);
    auto info = read_process(o.pid);
    if (!info) {
        std::cerr << who << ": " << info.error() << "\n";
        return 1;
    }
    if (info->kernel_thread) {
        std::cerr << who << ": is a kernel thread (" << info->comm
                  << ") — attach to the user process that runs the training job\n";
        return 1;
    }
    if (geteuid() != 0 && info->uid != geteuid()) {
        std::cerr << who << ": permission denied — run as root or as the process owner\n";
        return 1;
    }
    auto session = TraceSession::create(session_options(o.trace));
    if (!session) {
        std::cerr << who << ": " << session.error() << "\n";
        return 1;
    }
    TraceSession& s = *session.value();
    // No loader stop here: the target's parent may be an interactive shell that
    // would see the stop.  Libraries loaded during the window are attached as
    // soon as the loader event arrives.
    if (auto r = s.add_process(o.pid, /*follow=*/false, /*dl_stop=*/false); !r) {
        std::cerr << who << ": " << r.error() << "\n";
        return 1;
    }
    print_messages(s);
    std::cerr << "commdbg: tracing " << describe_pid(o.pid);
    if (o.duration > 0) std::cerr << " for " << o.duration << " s";
    std::cerr << " (" << s.attached_files().size() << " library file(s) probed; Ctrl-C to stop)\n";

    install_stop_handlers();
    if (run_attach_window(s, o.pid, o.duration, [] { return g_stop_signal != 0; }))
        std::cerr << "commdbg: pid " << o.pid << " exited; report covers its life since attach\n";
    return emit_outputs(s, o.trace);
}

}  // namespace

void register_attach(CLI::App& app) {
    auto opts = std::make_shared<AttachOptions>();
    CLI::App* sub = app.add_subcommand("attach", "Trace one running process for a window, then print what it saw");
    sub->add_option("pid", opts->pid, "Process to trace")->required()->check(CLI::PositiveNumber);
    sub->add_option("-d,--duration", opts->duration, "Seconds to trace (default: until Ctrl-C or the process exits)")
        ->check(CLI::NonNegativeNumber);
    add_trace_options(sub, opts->trace);
    sub->callback([opts] { throw CommandDone(run_attach(*opts)); });
}

}  // namespace commdbg::cli
