// SPDX-License-Identifier: Apache-2.0
#include "test_proc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace commdbg::testproc {

bool in_ci() {
    const char* ci = getenv("CI");
    return ci && std::string(ci) == "true";
}

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int out_w,
            int err_w) {
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(out_w, 1);
        dup2(err_w, 2);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> a;
        for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        execvp(a[0], a.data());
        _exit(127);
    }
    return pid;
}

int to_status(int ws) {
    if (WIFEXITED(ws)) return WEXITSTATUS(ws);
    if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
    return -1;
}

// Reads whatever is available from fds into bufs; returns false when both closed.
bool pump(int fds[2], std::string* bufs[2], int timeout_ms) {
    struct pollfd p[2];
    int n = 0;
    int idx[2];
    for (int i = 0; i < 2; ++i)
        if (fds[i] >= 0) {
            p[n] = {fds[i], POLLIN, 0};
            idx[n++] = i;
        }
    if (n == 0) return false;
    if (::poll(p, n, timeout_ms) <= 0) return true;
    for (int k = 0; k < n; ++k) {
        if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        ssize_t r = read(fds[idx[k]], buf, sizeof(buf));
        if (r > 0) bufs[idx[k]]->append(buf, static_cast<size_t>(r));
        else if (r == 0 || errno != EINTR) {
            close(fds[idx[k]]);
            fds[idx[k]] = -1;
        }
    }
    return true;
}

}  // namespace

ProcResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int timeout_s) {
    Background b(argv, env);
    return b.wait(timeout_s);
}

Background::Background(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    int o[2], e[2];
    if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC)) throw std::runtime_error("pipe");
    pid_ = spawn(argv, env, o[1], e[1]);
    close(o[1]);
    close(e[1]);
    out_fd_ = o[0];
    err_fd_ = e[0];
}

Background::~Background() {
    if (!done_ && pid_ > 0) {
        kill(-pid_, SIGKILL);
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
}

std::string Background::wait_for_line(const std::string& needle, int timeout_s) {
    return wait_for_line_in(out_, needle, timeout_s);
}

std::string Background::wait_for_err_line(const std::string& needle, int timeout_s) {
    return wait_for_line_in(err_, needle, timeout_s);
}

std::string Background::wait_for_line_in(std::string& buf, const std::string& needle, int timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int fds[2] = {out_fd_, err_fd_};
    std::string* bufs[2] = {&out_, &err_};
    while (std::chrono::steady_clock::now() < deadline) {
        size_t pos = buf.find(needle);
        if (pos != std::string::npos) {
            size_t start = buf.rfind('\n', pos);
            start = start == std::string::npos ? 0 : start + 1;
            size_t end = buf.find('\n', pos);
            if (end != std::string::npos) return buf.substr(start, end - start);
        }
        if (!pump(fds, bufs, 50)) break;
        out_fd_ = fds[0];
        err_fd_ = fds[1];
    }
    out_fd_ = fds[0];
    err_fd_ = fds[1];
    return {};
}

ProcResult Background::wait(int timeout_s) {
    if (done_) return result_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int fds[2] = {out_fd_, err_fd_};
    std::string* bufs[2] = {&out_, &err_};
    int ws = 0;
    struct rusage ru {};
    bool reaped = false;
    while (true) {
        bool open = pump(fds, bufs, 50);
        if (!reaped && wait4(pid_, &ws, WNOHANG, &ru) == pid_) reaped = true;
        if (reaped && !open) break;
        if (std::chrono::steady_clock::now() > deadline) {
            kill(-pid_, SIGKILL);
            kill(pid_, SIGKILL);
            if (!reaped) wait4(pid_, &ws, 0, &ru);
            reaped = true;
            err_ += "\n[test: killed after timeout]";
            break;
        }
        if (reaped && open) {
            // Grandchildren may hold the pipes; give them a moment, then stop reading.
            for (int i = 0; i < 20 && pump(fds, bufs, 50);) ++i;
            break;
        }
    }
    out_fd_ = fds[0];
    err_fd_ = fds[1];
    done_ = true;
    result_ = {to_status(ws), out_, err_, ru.ru_maxrss};
    return result_;
}

}  // namespace commdbg::testproc
