// SPDX-License-Identifier: Apache-2.0
#include "process.hpp"

#include <unistd.h>

#include <cstdlib>

#include "comm_registry.hpp"
#include "procfs.hpp"

namespace commdbg::daemon {

const std::vector<std::string> kLabelEnv = {"RANK",         "LOCAL_RANK",         "WORLD_SIZE", "GROUP_RANK",
                                            "MASTER_ADDR", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"};

uint64_t process_start_time(uint32_t pid) {
    auto stat = host::read_stat(static_cast<int>(pid));
    return stat ? stat->start_time : 0;
}

CountedProcess read_counted_process(uint32_t pid, uint64_t start_time) {
    CountedProcess p;
    p.pid = pid;
    p.start_time = start_time;
    if (auto info = host::read_process(static_cast<int>(pid))) {
        p.uid = info->uid;
        p.command = info->cmdline.empty() ? info->comm : info->cmdline;
    }
    // MASTER_PORT with MASTER_ADDR names a job's rendezvous: what tells its
    // c10d groups from another job's of the same name (c10d_comm_id).
    static const std::vector<std::string> kRead = [] {
        std::vector<std::string> keys = kLabelEnv;
        keys.push_back("MASTER_PORT");
        return keys;
    }();
    p.env = host::read_environ(static_cast<int>(pid), kRead);
    auto stat = host::read_stat(static_cast<int>(pid));
    const int ppid = stat ? stat->ppid : 0;
    p.c10d_job = snapshot::c10d_job(p.env, ppid, ppid > 1 ? process_start_time(static_cast<uint32_t>(ppid)) : 0);
    return p;
}

std::vector<uint32_t> other_pids() {
    std::vector<uint32_t> pids;
    for (int pid : host::numeric_entries("/proc"))
        if (pid != getpid()) pids.push_back(static_cast<uint32_t>(pid));
    return pids;
}

}  // namespace commdbg::daemon
