// SPDX-License-Identifier: Apache-2.0
// Running a program from a test: argv without a shell, stdout and stderr
// captured, killed (with its process group) after a timeout.  Shared by the
// end-to-end tests and the Perfetto checks.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace commdbg::testproc {

// CI=true: where a missing prerequisite fails a test instead of skipping it.
bool in_ci();

// Unless `cond` holds, skips the test saying `why`; under CI=true fails it.
#define REQUIRE_OR_SKIP(cond, why)                                                 \
    do {                                                                           \
        if (!(cond)) {                                                             \
            if (::commdbg::testproc::in_ci()) FAIL() << "CI=true but " << (why);   \
            GTEST_SKIP() << (why);                                                 \
        }                                                                          \
    } while (0)

// The same for a check that returns "" when the prerequisite is there, else why not.
#define REQUIRE_NO_REASON(reason)                                                  \
    do {                                                                           \
        const std::string reason_ = (reason);                                      \
        REQUIRE_OR_SKIP(reason_.empty(), reason_);                                 \
    } while (0)

struct ProcResult {
    int status = -1;  // exit status (128+sig when killed)
    std::string out;
    std::string err;
    long max_rss_kb = 0;  // the child's peak resident set (getrusage's ru_maxrss)
};

// Runs argv with extra environment, captures stdout/stderr; kills it after timeout_s.
ProcResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
               int timeout_s = 120);

// A child left running; kill()ed in the destructor if still alive.
class Background {
public:
    Background(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
    ~Background();
    int pid() const { return pid_; }
    // Blocks until stdout has a line containing `needle` (or timeout); returns the line.
    std::string wait_for_line(const std::string& needle, int timeout_s = 30);
    // The same for stderr.
    std::string wait_for_err_line(const std::string& needle, int timeout_s = 30);
    ProcResult wait(int timeout_s = 120);

private:
    int pid_ = -1;
    int out_fd_ = -1, err_fd_ = -1;
    std::string out_, err_;
    std::string wait_for_line_in(std::string& buf, const std::string& needle, int timeout_s);
    bool done_ = false;
    ProcResult result_;
};

}  // namespace commdbg::testproc
