// SPDX-License-Identifier: Apache-2.0
// The loader probe may stop a traced process (SIGSTOP) until its new
// libraries are attached.  If commdbg dies in that window the process must
// not stay stopped: a tiny forked guard holds the read end of a pipe, learns
// each pid that may be stopped, and sends SIGCONT to all of them when the pipe
// closes without a clean "done" — and once more to those stopped again when
// commdbg is gone: the pipe closes before the probes do.
#pragma once

#include <sys/types.h>

namespace commdbg::capture {

// SIGCONT every tgid held in a BPF hash map of stopped processes (keys u32).
// Async-signal-safe: the guard calls it in a forked child.
void resume_all_in_map(int stopped_map_fd);
// The same, taking each tgid out of the map once resumed (commdbgd's own
// shutdown, and the guard's sweeps after it is gone); async-signal-safe.
int resume_and_clear_map(int stopped_map_fd);  // how many were resumed

class ResumeGuard {
public:
    ResumeGuard() = default;
    ~ResumeGuard();  // clean shutdown: the guard exits without signalling
    ResumeGuard(const ResumeGuard&) = delete;
    ResumeGuard& operator=(const ResumeGuard&) = delete;

    bool start();          // forks the guard; false if it could not
    // Variant for commdbgd: the guard also keeps `stopped_map_fd` (a BPF hash
    // of stopped tgids) and resumes every tgid in it when the daemon dies.
    bool start_with_map(int stopped_map_fd);
    void watch(pid_t pid); // pid may be stopped by us from now on
    void unwatch(pid_t pid);  // it may not after all (its trace failed)
    // Clean shutdown of a process that may have stopped others until its
    // last BPF link is gone (commdbgd): the guard is not told "done" but
    // left to resume, once this process is wholly gone, what is stopped
    // again; not waited for.  The destructor then does nothing.
    void release();
    bool running() const { return fd_ >= 0; }

private:
    bool start_impl(int keep_fd);
    int fd_ = -1;
    pid_t guard_ = -1;
};

}  // namespace commdbg::capture
