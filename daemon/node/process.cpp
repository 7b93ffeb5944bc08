// SPDX-License-Identifier: Apache-2.0
#include "process.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>

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
    p.env = host::read_environ(static_cast<int>(pid), kLabelEnv);
    return p;
}

std::vector<uint32_t> other_pids() {
    std::vector<uint32_t> pids;
    DIR* d = opendir("/proc");
    if (!d) return pids;
    while (dirent* e = readdir(d)) {
        char* end = nullptr;
        unsigned long pid = strtoul(e->d_name, &end, 10);
        if (end && *end == '\0' && pid > 0 && pid != static_cast<unsigned long>(getpid())) pids.push_back(pid);
    }
    closedir(d);
    return pids;
}

}  // namespace commdbg::daemon
