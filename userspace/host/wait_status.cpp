// SPDX-License-Identifier: Apache-2.0
#include "wait_status.hpp"

#include <sys/wait.h>

#include <csignal>
#include <cstring>

namespace commdbg::host {

ExitInfo decode_exit(int ws) {
    ExitInfo e;
    if (WIFEXITED(ws)) e.code = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws)) {
        e.signal = WTERMSIG(ws);
        e.core_dumped = WCOREDUMP(ws);
    }
    return e;
}

std::string describe_exit(const ExitInfo& e) {
    if (e.code) return "exited with status " + std::to_string(*e.code);
    if (e.signal) {
        const char* abbrev = sigabbrev_np(*e.signal);
        return std::string("killed by ") + (abbrev ? std::string("SIG") + abbrev : "a signal") + " (signal " +
               std::to_string(*e.signal) + ")" + (e.core_dumped ? ", core dumped" : "");
    }
    return "ended";
}

}  // namespace commdbg::host
