// SPDX-License-Identifier: Apache-2.0
// The loader probe may stop a traced process (SIGSTOP) until its new
// libraries are attached.  If commdbg dies in that window the process must
// not stay stopped: a tiny forked guard holds the read end of a pipe, learns
// each pid that may be stopped, and sends SIGCONT to all of them when the pipe
// closes without a clean "done".
#pragma once

#include <sys/types.h>

namespace commdbg {

class ResumeGuard {
public:
    ResumeGuard() = default;
    ~ResumeGuard();  // clean shutdown: the guard exits without signalling
    ResumeGuard(const ResumeGuard&) = delete;
    ResumeGuard& operator=(const ResumeGuard&) = delete;

    bool start();          // forks the guard; false if it could not
    void watch(pid_t pid); // pid may be stopped by us from now on
    bool running() const { return fd_ >= 0; }

private:
    int fd_ = -1;
    pid_t guard_ = -1;
};

}  // namespace commdbg
