// SPDX-License-Identifier: Apache-2.0
// commdbg attach PID: trace one running process for a window.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "daemon_client.hpp"
#include "procfs.hpp"

namespace commdbg::cli {

namespace {

struct AttachOptions {
    int pid = 0;
    double duration = 0;  // 0: until Ctrl-C or the target exits
    TraceCliOptions trace;
    std::string socket;
    bool no_daemon = false;
    bool no_follow = false;
};

// The daemon's errors name the attach themselves ("attach N: ..."): once is
// enough; a protocol field is named by the option that set it.
std::string daemon_error_for_user(int pid, std::string error) {
    for (const std::string& own :
         {"attach " + std::to_string(pid) + ": ", std::string("attach: "), std::string("commdbg: ")})
        if (error.rfind(own, 0) == 0) error.erase(0, own.size());
    static const std::pair<const char*, const char*> kOptionOf[] = {
        {"field \"duration_s\"", "--duration"},    {"field \"noise_level\"", "--noise-level"},
        {"field \"max_records\"", "--max-records"}, {"field \"max_depth\"", "--max-depth"},
        {"field \"ringbuf_kb\"", "--ringbuf-kb"},   {"field \"probes\"", "--probes"},
        {"field \"py_stack\"", "--py-stack"},     {"field \"py_depth\"", "--py-depth"}};
    for (const auto& [field, option] : kOptionOf)
        if (error.rfind(field, 0) == 0) error.replace(0, std::string(field).size(), option);
    return error;
}

nlohmann::json attach_request(const AttachOptions& o) {
    nlohmann::json req = {{"op", "attach"},
                          {"pid", o.pid},
                          {"duration_s", o.duration},  // 0: until Ctrl-C or the process exits
                          {"noise_level", o.trace.noise_level},
                          {"max_records", o.trace.max_records},
                          {"max_depth", o.trace.max_depth},
                          {"counts_only", o.trace.counts_only},
                          {"stack_args", o.trace.stack_args},
                          {"follow", !o.no_follow},
                          {"ringbuf_kb", o.trace.ringbuf_kb},
                          {"py_stack", o.trace.py_stack},
                          {"py_depth", o.trace.py_depth}};
    // Only what this client writes: the rest would be rendered and sent for nothing.
    nlohmann::json outputs = nlohmann::json::array();
    if (!o.trace.json_file.empty()) outputs.push_back("json");
    if (!o.trace.trace_file.empty()) outputs.push_back("trace");
    if (isatty(STDOUT_FILENO)) outputs.push_back("table_color");
    req["outputs"] = std::move(outputs);
    if (!o.trace.probes.empty()) req["probes"] = o.trace.probes;
    return req;
}

// "commdbg: tracing pid N for 10 s (session ...)", with the window commdbgd
// granted, which may be shorter than the one asked for.
void announce_daemon_session(const AttachOptions& o, const nlohmann::json& started, uint64_t id, double window) {
    std::string for_how_long;
    if (started.contains("window_limited_for_uid"))
        for_how_long = " for at most " + limits::format_seconds(window) + " (the longest window commdbgd allows uid " +
                       std::to_string(started.value("window_limited_for_uid", 0u)) + ")";
    else if (window > 0)
        for_how_long = " for " + limits::format_seconds(window);
    std::cerr << "commdbg: tracing " << started.value("target", std::string("pid ") + std::to_string(o.pid))
              << for_how_long << " (session " << id << " in commdbgd, " << started.value("library_files", 0)
              << " library file(s) probed; Ctrl-C to stop)\n";
}

// The session's last reply: its outputs follow as raw bytes, in the order
// "payload" lists.  Returns the exit status, or the error reading them.
Result<int> write_daemon_outputs(const AttachOptions& o, DaemonClient& client, const nlohmann::json& reply,
                                 double window) {
    session::SessionOutput out;
    out.messages = reply.value("messages", std::vector<std::string>{});
    const auto slots = named_outputs(out);
    for (const auto& part : reply.value("payload", nlohmann::json::array())) {
        auto bytes = client.read_bytes(part.value("bytes", size_t{0}));
        if (!bytes) return Result<int>::fail(bytes.error());
        const std::string name = part.value("name", std::string());
        for (const auto& [slot_name, slot] : slots)
            if (name == slot_name) *slot = std::move(*bytes);
    }
    int status = write_outputs(out, o.trace);
    if (o.trace.cost)
        std::cerr << "commdbg: --cost: commdbgd traced this window; the CPU it took is commdbgd's, not this "
                     "command's (run `commdbg attach --no-daemon --cost` to measure it here)\n";
    if (reply.contains("cut_short")) {
        // What it saw is written, but it is not the window asked for.
        std::cerr << "commdbg: attach " << o.pid << ": the window was cut short after "
                  << limits::format_seconds(std::round(reply.value("traced_s", 0.0) * 10) / 10)
                  << (window > 0 ? " of " + limits::format_seconds(window) : std::string()) << ": "
                  << reply.value("cut_short", std::string("commdbgd ended it"))
                  << " — the outputs cover only that part; attach again once commdbgd is back, or use "
                     "--no-daemon\n";
        return status != 0 ? status : 1;
    }
    return status;
}

// The session runs inside commdbgd, which decides from our credentials what
// we may trace; Ctrl-C detaches it and still prints what it saw.
int attach_via_daemon(const AttachOptions& o, DaemonClient& client) {
    auto fail = [&](const std::string& error) {
        std::cerr << "commdbg: attach " << o.pid << ": " << daemon_error_for_user(o.pid, error) << "\n";
        return 1;
    };
    install_stop_handlers();
    auto started = client.call(attach_request(o));
    if (!started) return fail(started.error());
    uint64_t id = started->value("session", 0ull);
    const double window = started->value("duration_s", o.duration);
    announce_daemon_session(o, *started, id, window);
    bool detached = false;
    for (;;) {
        // Until detached, a stop signal ends the wait however it fell.
        auto r = client.receive(detached ? nullptr : &g_stop_signal);
        if (r) {
            auto status = write_daemon_outputs(o, client, *r, window);
            return status ? *status : fail(status.error());
        }
        if (g_stop_signal && !detached) {
            detached = true;
            if (auto second = DaemonClient::connect(socket_path(o.socket)))
                (void)second->call({{"op", "detach"}, {"id", id}});  // best effort: the reply still comes here
            continue;
        }
        if (client.interrupted()) continue;
        return fail(r.error());
    }
}

int run_attach(AttachOptions o) {
    auto tgid = attach_target(o.pid, "attach");
    if (!tgid) return 1;
    o.pid = *tgid;
    if (!check_trace_outputs(o.trace)) return 2;
    if (!o.no_daemon) {
        if (auto client = DaemonClient::connect(socket_path(o.socket))) return attach_via_daemon(o, *client);
    }
    return attach_in_process("attach", o.pid, o.duration, !o.no_follow, o.trace,
                             [&](session::TraceSession& s, std::optional<int>) { return emit_outputs(s, o.trace); });
}

}  // namespace

std::optional<int> attach_target(int pid, std::string_view verb) {
    const std::string who = "commdbg: " + std::string(verb) + " " + std::to_string(pid);
    auto info = host::read_process(pid);
    if (!info) {
        std::cerr << who << ": " << info.error() << "\n";
        return std::nullopt;
    }
    if (info->kernel_thread) {
        std::cerr << who << ": is a kernel thread (" << info->comm
                  << ") — attach to the user process that runs the training job\n";
        return std::nullopt;
    }
    if (info->tgid != pid) {
        // A thread id (from top -H, py-spy, a log line): its process is meant.
        std::cerr << "commdbg: note: " << pid << " is a thread (" << info->comm << ") of "
                  << session::describe_pid(info->tgid) << "; tracing that process\n";
        if (auto p = host::read_process(info->tgid); !p) {
            std::cerr << who << ": " << p.error() << "\n";
            return std::nullopt;
        }
    }
    return info->tgid;
}

int attach_in_process(std::string_view verb, int pid, double duration, bool follow, TraceCliOptions& trace,
                      const FinishWindow& finish) {
    const std::string who = "commdbg: " + std::string(verb) + " " + std::to_string(pid);
    auto info = host::read_process(pid);
    if (!info) {
        std::cerr << who << ": " << info.error() << "\n";
        return 1;
    }
    auto creds = host::read_creds(pid);
    if (geteuid() != 0 && (!creds || !may_read_process(*creds, geteuid(), getegid()))) {
        std::cerr << who << ": permission denied — run as root or as the process owner\n";
        return 1;
    }
    auto opts = session_options(trace);
    opts.attach_to(pid, follow);
    auto session = session::TraceSession::create(opts);
    if (!session) {
        std::cerr << who << ": " << session.error() << "\n";
        return 1;
    }
    session::TraceSession& s = *session.value();
    // No loader stop here: the target's parent may be an interactive shell that
    // would see the stop.  Libraries loaded during the window are attached as
    // soon as the loader event arrives.
    if (auto r = s.add_process(pid, follow, /*dl_stop=*/false); !r) {
        std::cerr << who << ": " << r.error() << "\n";
        return 1;
    }
    print_messages(s);
    std::cerr << "commdbg: tracing " << session::describe_pid(pid);
    if (duration > 0) std::cerr << " for " << limits::format_seconds(duration);
    std::cerr << " (" << s.attached_files().size() << " library file(s) probed; Ctrl-C to stop)\n";

    install_stop_handlers();
    if (run_attach_window(s, pid, duration, [] { return g_stop_signal != 0; }))
        std::cerr << "commdbg: pid " << pid << " exited; report covers its life since attach\n";
    return finish(s, std::nullopt);
}

void register_attach(CLI::App& app) {
    auto opts = std::make_shared<AttachOptions>();
    CLI::App* sub = app.add_subcommand("attach", "Trace one running process for a window, then print what it saw");
    sub->add_option("pid", opts->pid, "Process to trace (a thread id traces its process)")
        ->required()
        ->check(process_id());
    sub->add_option("-d,--duration", opts->duration,
                    "Seconds to trace, at most 30 days (default or 0: until Ctrl-C or the process exits)")
        ->check(duration_seconds());
    sub->add_flag("--no-follow", opts->no_follow,
                  "Do not trace children the process forks during the window (each fork is noted instead); the "
                  "probes are then in this process alone: other processes mapping the same libraries pay no trap");
    add_trace_options(sub, opts->trace);
    sub->add_option("--socket", opts->socket,
                    "commdbgd control socket (default $COMMDBG_SOCKET or /run/commdbg/commdbgd.sock); "
                    "when a daemon answers there the session runs in it");
    sub->add_flag("--no-daemon", opts->no_daemon, "Trace in this process even when commdbgd is running");
    sub->callback([opts] { throw CommandDone(run_attach(*opts)); });
}

}  // namespace commdbg::cli
