// SPDX-License-Identifier: Apache-2.0
// What a newcomer types first: `--version` names the source revision it was
// built from, and `commdbg --help` lists every subcommand with one line that
// is the subcommand's own, each one documented in the README.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

std::string trimmed(std::string s) {
    s.erase(s.find_last_not_of(" \n") + 1);
    return s;
}

TEST(CliSurface, VersionNamesTheGitRevisionItWasBuiltFrom) {
    auto head = run({"git", "-C", SOURCE_DIR, "rev-parse", "--short=12", "HEAD"});
    if (head.status != 0) GTEST_SKIP() << SOURCE_DIR << " is not a git checkout: no revision to compare";
    const std::string rev = trimmed(head.out);
    for (const std::string& bin : {commdbg_bin(), commdbgd_bin()}) {
        auto v = run({bin, "--version"});
        ASSERT_EQ(v.status, 0) << v.err;
        const std::string name = bin.substr(bin.rfind('/') + 1);
        // "commdbg 0.1.0 (<rev>)", "-dirty" after it when the tree had changes.
        std::smatch m;
        const std::string out = trimmed(v.out);
        ASSERT_TRUE(std::regex_match(out, m, std::regex(name + R"( \d+\.\d+\.\d+ \(([0-9a-f]+)(-dirty)?\))"))) << out;
        EXPECT_EQ(m[1], rev) << out;
    }
}

TEST(CliSurface, HelpListsEverySubcommandOnOneLineItsOwnAndTheReadmeHasEach) {
    auto h = run({commdbg_bin(), "--help"});
    ASSERT_EQ(h.status, 0) << h.err;
    const size_t at = h.out.find("\nSubcommands:\n");
    ASSERT_NE(at, std::string::npos) << h.out;
    std::istringstream in(h.out.substr(at + 14));
    std::ifstream rf(std::string(SOURCE_DIR) + "/README.md");
    const std::string readme((std::istreambuf_iterator<char>(rf)), std::istreambuf_iterator<char>());
    std::string line;
    std::vector<std::string> names;
    while (std::getline(in, line) && !line.empty()) {
        std::smatch m;
        ASSERT_TRUE(std::regex_match(line, m, std::regex(R"(  ([a-z]+) +(\S.*))"))) << "not one line: '" << line << "'";
        const std::string name = m[1], what = m[2];
        names.push_back(name);
        auto sub = run({commdbg_bin(), name, "--help"});
        EXPECT_EQ(sub.status, 0) << name << ": " << sub.err;
        EXPECT_EQ(sub.out.find(what), 0u) << name << "'s own help does not open with its line '" << what << "':\n"
                                          << sub.out.substr(0, 300);
        EXPECT_NE(readme.find("commdbg " + name), std::string::npos) << "README.md never shows `commdbg " << name << "`";
    }
    EXPECT_GE(names.size(), 9u) << h.out;
}

}  // namespace
}  // namespace commdbg::e2e
