// SPDX-License-Identifier: Apache-2.0
#include "resume_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include <cerrno>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace commdbg {

namespace {

constexpr int32_t kDone = 0;  // sentinel: clean shutdown, resume nothing
constexpr size_t kMaxWatched = 8192;

// Runs in a child forked from a possibly multi-threaded process: only
// async-signal-safe calls here (no malloc, no stdio).
[[noreturn]] void guard_main(int rfd, int map_fd) {
    // Detach from the terminal's signals so Ctrl-C on commdbg does not kill
    // the guard before it could do its job.
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    static pid_t pids[kMaxWatched];
    size_t n = 0;
    int32_t v;
    for (;;) {
        ssize_t r = read(rfd, &v, sizeof(v));
        if (r == sizeof(v)) {
            if (v == kDone) _exit(0);
            if (v < 0) {  // unwatch: the last entry moves into its place
                for (size_t i = 0; i < n; ++i)
                    if (pids[i] == -v) {
                        pids[i] = pids[--n];
                        break;
                    }
            } else if (n < kMaxWatched) {
                pids[n++] = v;
            }
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        break;  // EOF: commdbg is gone without saying done
    }
    for (size_t i = 0; i < n; ++i) kill(pids[i], SIGCONT);
    if (map_fd >= 0) resume_all_in_map(map_fd);
    _exit(0);
}

// Closes every descriptor from 3 up except the two kept: BPF links held open
// by a guard would outlive commdbg.
void close_all_but(int a, int b) {
    int lo = std::min(a, b), hi = std::max(a, b);
    if (lo < 0) lo = hi;
    if (lo > 3) syscall(SYS_close_range, 3u, static_cast<unsigned>(lo - 1), 0u);
    if (hi > lo + 1) syscall(SYS_close_range, static_cast<unsigned>(lo + 1), static_cast<unsigned>(hi - 1), 0u);
    syscall(SYS_close_range, static_cast<unsigned>(hi + 1), ~0u, 0u);
}

}  // namespace

void resume_all_in_map(int stopped_map_fd) {
    uint32_t key = 0, next = 0;
    const uint32_t* prev = nullptr;
    while (bpf_map_get_next_key(stopped_map_fd, prev, &next) == 0) {
        kill(static_cast<pid_t>(next), SIGCONT);
        key = next;
        prev = &key;
    }
}

bool ResumeGuard::start() { return start_impl(-1); }

bool ResumeGuard::start_with_map(int stopped_map_fd) { return start_impl(stopped_map_fd); }

bool ResumeGuard::start_impl(int keep_fd) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) {
        close_all_but(p[0], keep_fd);
        guard_main(p[0], keep_fd);
    }
    close(p[0]);
    fd_ = p[1];
    guard_ = pid;
    return true;
}

void ResumeGuard::watch(pid_t pid) {
    if (fd_ < 0) return;
    int32_t v = pid;
    (void)!write(fd_, &v, sizeof(v));
}

void ResumeGuard::unwatch(pid_t pid) {
    if (fd_ < 0 || pid <= 0) return;
    int32_t v = -pid;
    (void)!write(fd_, &v, sizeof(v));
}

ResumeGuard::~ResumeGuard() {
    if (fd_ < 0) return;
    int32_t v = kDone;
    (void)!write(fd_, &v, sizeof(v));
    close(fd_);
    waitpid(guard_, nullptr, 0);
}

}  // namespace commdbg
