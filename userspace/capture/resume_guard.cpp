// SPDX-License-Identifier: Apache-2.0
#include "resume_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace commdbg::capture {

namespace {

constexpr int32_t kDone = 0;  // sentinel: clean shutdown, resume nothing
constexpr size_t kMaxWatched = 8192;

// /proc/<pid>/stat's state is 'T' (stopped), or it cannot be read (then a
// SIGCONT is the safe side).  Async-signal-safe.
bool maybe_stopped(pid_t pid) {
    char path[32] = "/proc/", digits[12];
    int nd = 0;
    for (unsigned v = static_cast<unsigned>(pid); nd == 0 || v != 0; v /= 10)
        digits[nd++] = static_cast<char>('0' + v % 10);
    size_t at = 6;
    while (nd > 0) path[at++] = digits[--nd];
    for (const char* t = "/stat"; *t; ++t) path[at++] = *t;
    path[at] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno != ENOENT;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    for (ssize_t i = n - 1; i > 0; --i)  // the state follows the last ')': comm may hold one
        if (buf[i] == ')') return i + 2 < n && buf[i + 2] == 'T';
    return false;
}

// Resumes what is stopped (state T) among the watched pids and the BPF
// side's stopped_pids; a running one gets no signal, so a process with a
// SIGCONT handler is not interrupted at every sweep.  Async-signal-safe.
void resume_stopped(const pid_t* pids, size_t n, int map_fd) {
    for (size_t i = 0; i < n; ++i)
        if (maybe_stopped(pids[i])) kill(pids[i], SIGCONT);
    uint32_t key = 0, next = 0;
    const uint32_t* prev = nullptr;
    while (map_fd >= 0 && bpf_map_get_next_key(map_fd, prev, &next) == 0) {
        if (maybe_stopped(static_cast<pid_t>(next))) kill(static_cast<pid_t>(next), SIGCONT);
        key = next;
        prev = &key;
    }
}

// Until the process that forked the guard is reaped, resuming every 10 ms
// what its BPF programs stop meanwhile: closing its links takes as long as
// it takes (~50 ms a uprobe link), so the wait is bounded only generously
// (5 minutes) and nobody stays stopped during it.
void resume_until_parent_gone(pid_t parent, const pid_t* pids, size_t n, int map_fd) {
    const timespec step = {0, 10 * 1000 * 1000};
    // Reparented is not gone: when the thread that forked the guard exits,
    // the guard goes to init while another thread may still be closing the
    // links.  Gone is reaped, which waits for every thread.
    for (int i = 0; i < 30000 && (getppid() == parent || kill(parent, 0) == 0 || errno != ESRCH); ++i) {
        nanosleep(&step, nullptr);
        resume_stopped(pids, n, map_fd);
    }
}

// Reaped is not unlinked either: an exiting process's files are released
// by a kernel worker after it is gone, ~50 ms a uprobe link, so a daemon
// with hundreds of probed files keeps stopping processes for seconds after.
// Every stop it makes lands in stopped_pids: sweep until nothing was
// stopped for 3 s (5 minutes at most).
void resume_until_quiet(const pid_t* pids, size_t n, int map_fd) {
    const timespec step = {0, 10 * 1000 * 1000};
    for (int i = 0, quiet = 0; i < 30000 && quiet < 300; ++i) {
        resume_stopped(pids, n, -1);
        quiet = map_fd >= 0 && resume_and_clear_map(map_fd) > 0 ? 0 : quiet + 1;
        nanosleep(&step, nullptr);
    }
}

// Runs in a child forked from a possibly multi-threaded process: only
// async-signal-safe calls here (no malloc, no stdio).
[[noreturn]] void guard_main(int rfd, int map_fd, pid_t parent) {
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
    // The pipe closes as commdbg starts to exit, before its BPF links do: a
    // process resumed now may reach the loader probe again (dlopen calls it
    // twice) and be stopped by it once more: resume what is stopped again
    // until commdbg is gone and its links have stopped stopping anyone.
    resume_until_parent_gone(parent, pids, n, map_fd);
    resume_until_quiet(pids, n, map_fd);
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

int resume_and_clear_map(int stopped_map_fd) {
    // A hash map's first key again after each delete; bounded however the
    // map changes meanwhile.  Out of the map before the SIGCONT: once
    // resumed, the process may be stopped again at once (its next new file)
    // and put back; a delete after the SIGCONT would erase that later stop,
    // and nobody would resume it.
    uint32_t key = 0;
    int i = 0;
    for (; i < 1 << 16 && bpf_map_get_next_key(stopped_map_fd, nullptr, &key) == 0; ++i) {
        bpf_map_delete_elem(stopped_map_fd, &key);
        kill(static_cast<pid_t>(key), SIGCONT);
    }
    return i;
}

bool ResumeGuard::start() { return start_impl(-1); }

bool ResumeGuard::start_with_map(int stopped_map_fd) { return start_impl(stopped_map_fd); }

bool ResumeGuard::start_impl(int keep_fd) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return false;
    const pid_t self = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) {
        close_all_but(p[0], keep_fd);
        guard_main(p[0], keep_fd, self);
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

void ResumeGuard::release() {
    if (fd_ < 0) return;
    close(fd_);  // EOF without "done": the guard resumes, waits for us to be gone, resumes again
    fd_ = -1;
}

ResumeGuard::~ResumeGuard() {
    if (fd_ < 0) return;
    int32_t v = kDone;
    (void)!write(fd_, &v, sizeof(v));
    close(fd_);
    waitpid(guard_, nullptr, 0);
}

}  // namespace commdbg::capture
