// SPDX-License-Identifier: Apache-2.0
// A wait status (from waitpid or the kernel's task->exit_code) as a person
// reads it: the exit status of exit(N), or the signal that killed it.
#pragma once

#include <optional>
#include <string>

namespace commdbg::host {

struct ExitInfo {
    std::optional<int> code;    // exited normally: its status, 0..255
    std::optional<int> signal;  // killed by this signal
    bool core_dumped = false;
};
ExitInfo decode_exit(int wait_status);
// "exited with status 3", "killed by SIGKILL (signal 9)".
std::string describe_exit(const ExitInfo& e);

}  // namespace commdbg::host
