// SPDX-License-Identifier: Apache-2.0
// Acceptance: `make demo` prints a table whose counts equal the demo
// workload's pattern (DEMO_CALLS in the Makefile, read from there).
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

TEST(Demo, MakeDemoTableCountsEqualTheDemoPattern) {
    REQUIRE_BPF();
    auto pattern = demo_pattern();
    ASSERT_FALSE(pattern.empty()) << "DEMO_CALLS not found in the Makefile";
    auto r = run({"make", "-s", "-C", SOURCE_DIR, "demo", std::string("BUILD=") + BUILD_DIR}, {}, 600);
    ASSERT_EQ(r.status, 0) << r.err;
    // Summary lines look like "  nccl.all_reduce   calls=8   bytes=32768".
    std::regex row(R"(nccl\.(\w+)\s+calls=(\d+))");
    std::map<std::string, long> printed;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), row), end; it != end; ++it)
        printed[(*it)[1]] = std::stol((*it)[2]);
    EXPECT_EQ(printed, pattern) << r.out.substr(0, 2000);
}

}  // namespace
}  // namespace commdbg::e2e
