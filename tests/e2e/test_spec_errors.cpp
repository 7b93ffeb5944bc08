// SPDX-License-Identifier: Apache-2.0
// A malformed spec and a spec naming no symbol that exists each get a clear
// message and the run goes on with the others.  (A library without symbol
// tables: ElfSymbols' unit tests pin its message, which the scan reports.)
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(SpecErrors, RunContinuesWithTheOtherSpecs) {
    REQUIRE_BPF();
    TempDir tmp;
    // Malformed: role is not one we know.
    write(tmp.path("bad.json"), R"({"name":"bad","layer":"x","library":"libnccl.so*",
        "symbols":[{"match":"ncclAllReduce","role":"sometimes"}]})");
    // Valid, but names a symbol the library does not have.
    write(tmp.path("nosym.json"), R"({"name":"nosym","layer":"x","library":"libnccl.so*",
        "symbols":[{"match":"ncclNoSuchFunction","role":"op"}]})");
    auto r = run({commdbg_bin(), "run", "--probes", "nccl," + tmp.path("bad.json") + "," + tmp.path("nosym.json"),
                  "--json", tmp.path("out.json"), "--", testprog("nccl_workload"), "--calls", "all_reduce=9,send=4",
                  "--fake-comm"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    // The bad spec is named with its file, field and problem.
    EXPECT_NE(r.err.find(tmp.path("bad.json")), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\"role\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("sometimes"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("continuing with the other specs"), std::string::npos) << r.err;
    // The symbol-less spec says which symbol is missing where.
    EXPECT_NE(r.err.find("ncclNoSuchFunction"), std::string::npos) << r.err;
    // And the nccl spec still counted every call.
    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["comm_counts"]["nccl.all_reduce"].get<int>(), 9);
    EXPECT_EQ(j["comm_counts"]["nccl.send"].get<int>(), 4);
}

TEST(SpecErrors, ProbesCheckNamesFileFieldAndProblem) {
    TempDir tmp;
    write(tmp.path("bad.json"), R"({"name":"bad","layer":"x","library":"l.so","symbols":[{"match":"f","role":"op","args":{"count":9}}]})");
    auto r = run({commdbg_bin(), "probes", "check", tmp.path("bad.json")});
    EXPECT_EQ(r.status, 2) << "an invalid spec is a usage error";
    EXPECT_NE(r.err.find(tmp.path("bad.json")), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("args.count"), std::string::npos) << r.err;
    auto ok = run({commdbg_bin(), "probes", "check", std::string(SOURCE_DIR) + "/specs/nccl.json"});
    EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST(SpecErrors, ProbesCheckRefusesAnOverLongRegexAndAcceptsANestedOne) {
    TempDir tmp;
    write(tmp.path("long.json"), R"({"name":"long","layer":"x","library":"l.so","symbols":[{"regex":")" +
                                     std::string(500000, 'a') + R"(","role":"op"}]})");
    auto r = run({commdbg_bin(), "probes", "check", tmp.path("long.json")});
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find(tmp.path("long.json") + ": symbols[0]: field \"regex\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("-byte limit"), std::string::npos) << r.err;
    EXPECT_LT(r.err.size(), 1000u);
    // Matched without backtracking, so nothing to refuse.
    std::string nested = "^";
    for (int i = 0; i < 12; ++i) nested += "(.*?)*";
    write(tmp.path("nested.json"), R"({"name":"nested","layer":"x","library":"l.so","symbols":[{"regex":")" + nested +
                                       R"(Q$","role":"op"}]})");
    auto ok = run({commdbg_bin(), "probes", "check", tmp.path("nested.json")});
    EXPECT_EQ(ok.status, 0) << ok.err;
}

}  // namespace
}  // namespace commdbg::e2e
