// SPDX-License-Identifier: Apache-2.0
// The Debian package (`make deb`, which `make test` runs first: debhelper,
// lintian clean) installed into a clean bookworm root (tests/debian_root.sh
// bookworm, cached like the trixie root) by tests/deb_install_check.sh: its
// programs run there, it ships what it says (unit enabled, man pages,
// completion, specs and profiles, Prometheus rules, the Python module), and
// a purge leaves no file behind.
#include <gtest/gtest.h>

#include <glob.h>
#include <unistd.h>

#include <map>
#include <regex>
#include <sstream>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

std::string built_deb() {
    glob_t g{};
    std::string out;
    if (glob((std::string(BUILD_DIR) + "/deb/commdbg_*_amd64.deb").c_str(), 0, nullptr, &g) == 0 && g.gl_pathc == 1)
        out = g.gl_pathv[0];
    globfree(&g);
    return out;
}

std::string bookworm_root() {
    const char* e = getenv("COMMDBG_BOOKWORM_ROOT");
    return e && *e ? e : "/var/cache/commdbg/bookworm-root";
}

// "== STEP" sections of the check's output, by step.
std::map<std::string, std::string> sections(const std::string& out) {
    std::map<std::string, std::string> s;
    std::string step, line;
    std::istringstream in(out);
    while (std::getline(in, line)) {
        if (line.rfind("== ", 0) == 0)
            s[step = line.substr(3)];
        else if (!step.empty())
            s[step] += line + "\n";
    }
    return s;
}

TEST(DebianPackage, InstallsIntoACleanBookwormRootRunsThereAndPurgesToNothing) {
    REQUIRE_OR_SKIP(geteuid() == 0, "needs root (chroot, mounts)");
    const std::string deb = built_deb();
    REQUIRE_OR_SKIP(!deb.empty(), "no " + std::string(BUILD_DIR) + "/deb/commdbg_*_amd64.deb: run `make deb`");
    auto health = run({std::string(SOURCE_DIR) + "/tests/debian_root.sh", "--check", "bookworm", bookworm_root()});
    REQUIRE_OR_SKIP(health.status == 0, "no healthy bookworm root at " + bookworm_root() +
                                            ": tests/debian_root.sh bookworm (make test builds it)");
    auto r = run({std::string(SOURCE_DIR) + "/tests/deb_install_check.sh", bookworm_root(), deb}, {}, 280);
    ASSERT_EQ(r.status, 0) << r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0) << r.err;
    auto s = sections(r.out);
    ASSERT_TRUE(s.count("end")) << r.out;
    // The programs run in the clean root: --version with the revision it was built from.
    auto head = run({"git", "-C", SOURCE_DIR, "rev-parse", "--short=12", "HEAD"});
    EXPECT_TRUE(std::regex_search(s["commdbg --version"], std::regex(R"(^commdbg \d+\.\d+\.\d+ \([0-9a-f]+)")))
        << s["commdbg --version"];
    if (head.status == 0) EXPECT_NE(s["commdbg --version"].find(head.out.substr(0, 12)), std::string::npos);
    for (const std::string spec : {"nccl", "torch-c10d", "torch-scopes", "torch-modules"})
        EXPECT_NE(s["commdbg probes list"].find("\n" + spec + "\t"), std::string::npos) << spec;
    EXPECT_NE(s["commdbgd --help"].find("--metrics-listen"), std::string::npos) << s["commdbgd --help"];
    // What it ships.
    const std::string& files = s["dpkg -L commdbg"];
    for (const std::string f : {"/usr/bin/commdbg", "/usr/bin/commdbgd", "\n/lib/systemd/system/commdbgd.service",
                                "/usr/share/man/man1/commdbg.1.gz", "/usr/share/man/man8/commdbgd.8.gz",
                                "/usr/share/bash-completion/completions/commdbg",
                                "/usr/share/commdbg/specs/nccl.json", "/usr/share/commdbg/prometheus/commdbg.rules.yml",
                                "/usr/lib/python3/dist-packages/commdbg/__init__.py"})
        EXPECT_NE(("\n" + files).find(f + "\n"), std::string::npos) << f << " not in the package:\n" << files;
    EXPECT_NE(files.find("/usr/share/commdbg/specs/lifecycle/"), std::string::npos) << files;
    EXPECT_NE(s["enabled units"].find("commdbgd.service"), std::string::npos) << "dh_installsystemd did not enable it";
    // Purged: not one file of it, nor of its scripts, is left.
    EXPECT_EQ(s["left after purge"], "") << "purge left:\n" << s["left after purge"];
}

}  // namespace
}  // namespace commdbg::e2e
