// SPDX-License-Identifier: Apache-2.0
#include "resume_guard.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace commdbg {

namespace {

constexpr int32_t kDone = 0;  // sentinel: clean shutdown, resume nothing

[[noreturn]] void guard_main(int rfd, int map_fd) {
    // Detach from the terminal's signals so Ctrl-C on commdbg does not kill
    // the guard before it could do its job.
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    std::vector<pid_t> pids;
    int32_t v;
    for (;;) {
        ssize_t n = read(rfd, &v, sizeof(v));
        if (n == sizeof(v)) {
            if (v == kDone) _exit(0);
            pids.push_back(v);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        break;  // EOF: commdbg is gone without saying done
    }
    for (pid_t p : pids) kill(p, SIGCONT);
    if (map_fd >= 0) {
        uint32_t key = 0, next = 0;
        const uint32_t* prev = nullptr;
        while (bpf_map_get_next_key(map_fd, prev, &next) == 0) {
            kill(static_cast<pid_t>(next), SIGCONT);
            key = next;
            prev = &key;
        }
    }
    _exit(0);
}

}  // namespace

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
        // Close everything but the read end: BPF links held open by a guard
        // would outlive commdbg.
        if (DIR* d = opendir("/proc/self/fd")) {
            std::vector<int> fds;
            while (dirent* e = readdir(d)) {
                int fd = atoi(e->d_name);
                if (fd > 2 && fd != p[0] && fd != keep_fd && fd != dirfd(d)) fds.push_back(fd);
            }
            closedir(d);
            for (int fd : fds) close(fd);
        }
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

ResumeGuard::~ResumeGuard() {
    if (fd_ < 0) return;
    int32_t v = kDone;
    (void)!write(fd_, &v, sizeof(v));
    close(fd_);
    waitpid(guard_, nullptr, 0);
}

}  // namespace commdbg
