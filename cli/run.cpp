// SPDX-License-Identifier: Apache-2.0
// commdbg run -- CMD ARGS...: start CMD traced from its first instruction,
// with every process it forks, until it exits; exit with its status.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"

namespace commdbg::cli {

namespace {

struct RunOptions {
    std::vector<std::string> command;
    TraceCliOptions trace;
};

// PATH lookup as execvp does it, so the loader probe goes on the right interpreter.
std::string resolve_exe(const std::string& cmd) {
    if (cmd.find('/') != std::string::npos) return cmd;
    const char* path = getenv("PATH");
    std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
    size_t start = 0;
    while (start <= p.size()) {
        size_t end = p.find(':', start);
        if (end == std::string::npos) end = p.size();
        std::string cand = (end > start ? p.substr(start, end - start) : ".") + "/" + cmd;
        if (access(cand.c_str(), X_OK) == 0) return cand;
        start = end + 1;
    }
    return cmd;
}

// A forked child that waits on `go` until it is in the filter, then execs;
// `err` (close-on-exec) carries an exec failure back.  Our ends of both pipes.
struct HeldChild {
    pid_t pid = -1;
    int go = -1;   // write one byte: exec
    int err = -1;  // an errno, or EOF once the exec succeeded
};

// The child's side: wait for the go byte, then exec the command.
[[noreturn]] void exec_when_released(const std::vector<std::string>& command, int go, int err) {
    // An ignored SIGPIPE would survive the exec; the command gets ours as it was.
    signal(SIGPIPE, SIG_DFL);
    char c;
    ssize_t got;
    do got = read(go, &c, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1) _exit(127);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    int e = errno;
    (void)!write(err, &e, sizeof(e));
    _exit(127);
}

std::optional<HeldChild> fork_held(const std::vector<std::string>& command, const std::string& who) {
    int go[2], err[2];
    if (pipe2(go, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
        std::cerr << who << ": pipe: " << std::strerror(errno) << "\n";
        return std::nullopt;
    }
    pid_t child = fork();
    if (child < 0) {
        std::cerr << who << ": fork: " << std::strerror(errno) << "\n";
        return std::nullopt;
    }
    if (child == 0) {
        close(go[1]);
        close(err[0]);
        exec_when_released(command, go[0], err[1]);
    }
    close(go[0]);
    close(err[1]);
    return HeldChild{child, go[1], err[0]};
}

// Lets the child exec; 0 once it did, 127 (after reaping it) when it could not.
int release(const HeldChild& child, const std::string& who) {
    (void)!write(child.go, "x", 1);
    close(child.go);
    int exec_errno = 0;
    if (read(child.err, &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno)) {
        waitpid(child.pid, nullptr, 0);
        std::cerr << who << ": cannot execute: " << std::strerror(exec_errno)
                  << (exec_errno == ENOENT ? " — check the command name and PATH" : "") << "\n";
        return 127;
    }
    close(child.err);
    return 0;
}

// Traces until the child ends; returns its wait status.
int trace_until_exit(session::TraceSession& s, pid_t child) {
    // Ctrl-C reaches the child through the terminal; we wait for it to end.
    signal(SIGINT, SIG_IGN);
    int wstatus = 0;
    bool forwarded = false;
    for (;;) {
        s.poll(50);
        if (g_stop_signal && !forwarded) {
            kill(child, g_stop_signal.load());
            forwarded = true;
        }
        pid_t w = waitpid(child, &wstatus, WNOHANG);
        if (w == child) break;
        if (w < 0 && errno != EINTR) break;
    }
    return wstatus;
}

}  // namespace

int exit_status(int wstatus) {
    if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
    return 1;
}

int trace_command(std::string_view verb, const std::vector<std::string>& command, TraceCliOptions& trace,
                  const FinishWindow& finish) {
    const std::string who = "commdbg: " + std::string(verb) + " " + command.front();
    // Before anything runs: a bad output path must not cost a whole job.
    if (!check_trace_outputs(trace)) return 2;
    // Before the fork: a SIGHUP from now on stops the run with outputs written.
    install_stop_handlers();
    auto session = session::TraceSession::create(session_options(trace));
    if (!session) {
        std::cerr << who << ": " << session.error() << "\n";
        return 1;
    }
    session::TraceSession& s = *session.value();
    std::string exe = resolve_exe(command.front());
    if (auto r = s.prepare_exec(exe); !r) std::cerr << "commdbg: note: " << r.error() << "\n";

    auto child = fork_held(command, who);
    if (!child) return 1;
    if (auto r = s.add_process(child->pid, /*follow=*/true, /*dl_stop=*/true); !r) {
        std::cerr << who << ": " << r.error() << "\n";
        kill(child->pid, SIGKILL);
        waitpid(child->pid, nullptr, 0);
        return 1;
    }
    s.mark_from_start(child->pid);
    if (int rc = release(*child, who); rc != 0) return rc;

    int wstatus = trace_until_exit(s, child->pid);
    s.mark_exited(child->pid, wstatus);
    s.drain();
    return finish(s, wstatus);
}

namespace {

int run_command(RunOptions& o) {
    return trace_command("run", o.command, o.trace, [&](session::TraceSession& s, std::optional<int> wstatus) {
        int rc = emit_outputs(s, o.trace);
        int status = exit_status(wstatus.value_or(0));
        return rc && status == 0 ? rc : status;
    });
}

}  // namespace

void register_run(CLI::App& app) {
    auto opts = std::make_shared<RunOptions>();
    CLI::App* sub = app.add_subcommand("run", "Start a command traced from its first instruction (and every process "
                                              "it forks); print what it saw; exit with its status");
    add_trace_options(sub, opts->trace);
    sub->add_option("command", opts->command, "Command and arguments (after --)")->required();
    sub->positionals_at_end();
    sub->callback([opts] { throw CommandDone(run_command(*opts)); });
}

}  // namespace commdbg::cli
