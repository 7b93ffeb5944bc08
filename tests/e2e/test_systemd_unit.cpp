// SPDX-License-Identifier: Apache-2.0
// systemd/commdbgd.service: `systemd-analyze verify` finds nothing to say
// about it, and it keeps the readiness protocol and sandbox the issue asks for.
// Verify runs offline: no systemd as PID 1 is needed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

const std::string kUnit = std::string(SOURCE_DIR) + "/systemd/commdbgd.service";
const std::string kInstalledBin = "/usr/local/bin/commdbgd";

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) out.push_back(line);
    return out;
}

std::string find_in_path(const std::string& prog) {
    const char* path = getenv("PATH");
    std::istringstream dirs(path ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        std::string p = dir + "/" + prog;
        if (access(p.c_str(), X_OK) == 0) return p;
    }
    return {};
}

// The unit with ExecStart pointing at a binary that exists here, so verify
// does not complain that /usr/local/bin/commdbgd is not installed.  Written
// as DIR/commdbgd.service: verify takes the unit's name from the file name.
std::string runnable_copy(const TempDir& dir, const std::string& text) {
    std::string copy = text;
    size_t at = copy.find("ExecStart=" + kInstalledBin);
    EXPECT_NE(at, std::string::npos) << "no ExecStart=" << kInstalledBin << " in " << kUnit;
    if (at != std::string::npos) copy.replace(at + 10, kInstalledBin.size(), commdbg_bin());
    std::string path = dir.path("commdbgd.service");
    std::ofstream(path) << copy;
    return path;
}

// Lines of verify's output that are about our unit.
std::vector<std::string> complaints(const ProcResult& r) {
    std::vector<std::string> out;
    for (const auto& l : lines_of(r.out + r.err)) {
        if (l.find("commdbgd.service") != std::string::npos) out.push_back(l);
    }
    return out;
}

#define REQUIRE_SYSTEMD_ANALYZE(var)                                                    \
    std::string var = find_in_path("systemd-analyze");                                  \
    if (var.empty()) {                                                                  \
        if (in_ci()) FAIL() << "CI=true but systemd-analyze is missing (package systemd)"; \
        GTEST_SKIP() << "systemd-analyze not installed (package systemd)";              \
    }

TEST(SystemdUnit, SystemdAnalyzeVerifyIsClean) {
    REQUIRE_SYSTEMD_ANALYZE(analyze);
    std::string text = read_text(kUnit);
    ASSERT_FALSE(text.empty()) << "cannot read " << kUnit;
    TempDir dir;
    std::string unit = runnable_copy(dir, text);
    ProcResult r = run({analyze, "verify", "--man=no", unit}, {}, 60);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    std::vector<std::string> c = complaints(r);
    EXPECT_TRUE(c.empty()) << "systemd-analyze verify:\n" << r.out << r.err;
}

// Guards the test above: verify must actually read the copy and report a bad
// key on a line naming it, or a clean result would mean nothing.
TEST(SystemdUnit, SystemdAnalyzeVerifyReportsABrokenCopy) {
    REQUIRE_SYSTEMD_ANALYZE(analyze);
    std::string text = read_text(kUnit);
    size_t at = text.find("LockPersonality=yes");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 19, "LockPersonaliti=yes");
    TempDir dir;
    std::string unit = runnable_copy(dir, text);
    ProcResult r = run({analyze, "verify", "--man=no", unit}, {}, 60);
    EXPECT_FALSE(complaints(r).empty()) << "systemd-analyze verify said nothing:\n" << r.out << r.err;
}

TEST(SystemdUnit, DeclaresNotifyReadinessAndStrictSandbox) {
    std::vector<std::string> lines = lines_of(read_text(kUnit));
    ASSERT_FALSE(lines.empty()) << "cannot read " << kUnit;
    std::set<std::string> have(lines.begin(), lines.end());
    for (const char* want : {"Type=notify", "ProtectSystem=strict", "NoNewPrivileges=yes", "PrivateTmp=yes",
                             "ProtectHome=read-only", "Restart=on-failure", "RuntimeDirectory=commdbg",
                             "MemoryMax=512M", "WantedBy=multi-user.target"}) {
        EXPECT_TRUE(have.count(want)) << kUnit << " lacks the line " << want;
    }
}

TEST(SystemdUnit, CapabilitiesAreExactlyTheTracingSet) {
    const std::set<std::string> want = {"CAP_BPF",        "CAP_PERFMON",         "CAP_SYS_ADMIN",
                                        "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_KILL"};
    std::vector<std::string> lines = lines_of(read_text(kUnit));
    for (const std::string key : {"CapabilityBoundingSet=", "AmbientCapabilities="}) {
        std::set<std::string> got;
        int seen = 0;
        for (const auto& l : lines) {
            if (l.rfind(key, 0) != 0) continue;
            ++seen;
            std::istringstream caps(l.substr(key.size()));
            std::string cap;
            while (caps >> cap) got.insert(cap);
        }
        EXPECT_EQ(seen, 1) << key;
        EXPECT_EQ(got, want) << key;
    }
}

}  // namespace
}  // namespace commdbg::e2e
