// SPDX-License-Identifier: Apache-2.0
// Acceptance: `make demo` (demo/demo.sh) shows what commdbg is for, and each
// number it prints is checked against its job's own account: the torch job's
// table has its scopes, modules and the Python line of each collective, and
// commdbg's per-module counts equal what each rank counted itself; the FSDP
// check names the bypassed unit (with the trixie root); the stub-NCCL counts
// equal DEMO_CALLS (read from the Makefile); the demo says how long it took.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

std::map<std::string, long> demo_pattern() {
    std::ifstream in(std::string(SOURCE_DIR) + "/Makefile");
    std::string line;
    std::map<std::string, long> out;
    while (std::getline(in, line)) {
        if (line.rfind("DEMO_CALLS = ", 0) != 0) continue;
        std::stringstream ss(line.substr(13));
        std::string item;
        while (std::getline(ss, item, ',')) {
            auto eq = item.find('=');
            out[item.substr(0, eq)] = std::stol(item.substr(eq + 1));
        }
    }
    return out;
}

// "<path> <side> <kind>=<n>; ..." as {"<path> <side> <kind>": n}.
std::map<std::string, long> account_of(const std::string& text) {
    std::map<std::string, long> out;
    std::regex item(R"(([^;=]+)=(\d+))");
    for (std::sregex_iterator it(text.begin(), text.end(), item), end; it != end; ++it) {
        std::string key = (*it)[1];
        key.erase(0, key.find_first_not_of(' '));
        out[key] = std::stol((*it)[2]);
    }
    return out;
}

// The line of demo/train.py that issues the blocks' all-reduce.
int all_reduce_line() {
    std::ifstream in(std::string(SOURCE_DIR) + "/demo/train.py");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
        if (line.find("dist.all_reduce(h)") != std::string::npos) return n;
    return 0;
}

TEST(Demo, MakeDemoShowsARealTorchJobTheFsdpCheckAndExactNcclCounts) {
    REQUIRE_BPF();
    auto pattern = demo_pattern();
    ASSERT_FALSE(pattern.empty()) << "DEMO_CALLS not found in the Makefile";
    auto r = run({"make", "-s", "-C", SOURCE_DIR, "demo", std::string("BUILD=") + BUILD_DIR,
                  "TRIXIE_ROOT=" + trixie_root()},
                 {}, 600);
    ASSERT_EQ(r.status, 0) << r.err << r.out.substr(0, 3000);
    const std::string& out = r.out;
    // 1. The torch job: each rank's own account, and commdbg's of the same pid.
    std::smatch m;
    std::map<std::string, std::string> job, seen;  // pid -> account
    std::regex job_line(R"(rank \d+ \(pid (\d+)\) issued: ([^\n]*))"), commdbg_line(R"(commdbg: pid (\d+): ([^\n]*))");
    for (std::sregex_iterator it(out.begin(), out.end(), job_line), end; it != end; ++it) job[(*it)[1]] = (*it)[2];
    for (std::sregex_iterator it(out.begin(), out.end(), commdbg_line), end; it != end; ++it) seen[(*it)[1]] = (*it)[2];
    ASSERT_EQ(job.size(), 2u) << out.substr(0, 3000);
    for (const auto& [pid, account] : job) {
        ASSERT_TRUE(seen.count(pid)) << "no per-module counts of pid " << pid;
        EXPECT_EQ(account_of(seen[pid]), account_of(account)) << "pid " << pid;
        EXPECT_FALSE(account_of(account).empty());
    }
    for (const std::string want : {"scope train_step", "scope grad_sync", "module <root> (Net) forward",
                                   "module blocks.1 (Block) forward"})
        EXPECT_NE(out.find(want), std::string::npos) << want;
    const int line = all_reduce_line();
    ASSERT_GT(line, 0);
    EXPECT_TRUE(std::regex_search(out, std::regex(R"(c10d::ProcessGroupGloo::allreduce .*at \S*demo/train\.py:)" +
                                                  std::to_string(line) + " Block.forward")))
        << "no all-reduce at demo/train.py:" << line;
    // 2. The FSDP check, where the trixie root is.
    if (trixie_unavailable_reason(trixie_root()).empty()) {
        EXPECT_NE(out.find("bypassed_child  step 1 backward: layers.1 had no forward in step 1"), std::string::npos);
        EXPECT_NE(out.find("commdbg check exited 3"), std::string::npos);
    } else {
        EXPECT_NE(out.find("make trixie-root"), std::string::npos);
    }
    // 3. Summary lines look like "  nccl.all_reduce   calls=8   bytes=32768".
    std::regex row(R"(nccl\.(\w+)\s+calls=(\d+))");
    std::map<std::string, long> printed;
    for (std::sregex_iterator it(out.begin(), out.end(), row), end; it != end; ++it)
        printed[(*it)[1]] = std::stol((*it)[2]);
    EXPECT_EQ(printed, pattern) << out.substr(0, 2000);
    // Its own time, build included.
    EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(demo: done in (\d+) s \(build (\d+) s\))"))) << out;
    std::cerr << "make demo (built already): " << m[0] << "\n";
}

}  // namespace
}  // namespace commdbg::e2e
