// SPDX-License-Identifier: Apache-2.0
// What commdbgd knows of one counted process: who it is (a pid and its start
// time, so a recycled pid is another process) and what labels its series.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tensor_layout.hpp"

namespace commdbg::daemon {

// Environment variables that label a process's series (lower-cased).
extern const std::vector<std::string> kLabelEnv;

struct CountedProcess {
    uint32_t pid = 0;
    uint64_t start_time = 0;  // /proc/PID/stat field 22: tells a recycled pid apart
    uint32_t uid = 0;
    std::string command;
    std::map<std::string, std::string> env;  // RANK, LOCAL_RANK, ... as found
    std::string c10d_job;  // what its c10d groups' ids name the job by (snapshot::c10d_job)
    std::optional<torch::TensorLayout> tensors;  // how the kernel reads its tensors, once it does
};

// /proc/PID/stat field 22 (start time, clock ticks after boot); 0 if unreadable.
uint64_t process_start_time(uint32_t pid);
// Its uid, command and label environment as /proc shows them now.
CountedProcess read_counted_process(uint32_t pid, uint64_t start_time);
// Every process id in /proc but our own.
std::vector<uint32_t> other_pids();

}  // namespace commdbg::daemon
