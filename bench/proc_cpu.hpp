// SPDX-License-Identifier: Apache-2.0
// Another process's CPU time, for the benchmarks that run commdbgd beside a
// job (bench_fsdp_watch, bench_tp): what the daemon spent over a span is the
// difference of two reads.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace commdbg::bench {

// utime + stime of `pid` (all its threads), in seconds; 0 once it is gone.
inline double cpu_seconds(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(in, line) || line.rfind(')') == std::string::npos) return 0;
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string f;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i)
        if (i >= 14) ticks += std::stod(f);
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace commdbg::bench
