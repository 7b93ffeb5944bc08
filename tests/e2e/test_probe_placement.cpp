// SPDX-License-Identifier: Apache-2.0
// Where an entry probe goes.  Past a leading endbr64, when the instruction
// after it is one the kernel emulates, a probe traps once instead of twice
// (arch::single_trap_entry); torch 2.x's functions all begin with endbr64.
// On tests/testprogs/cet_entries, a real uprobe: the traced process's own
// code shows the int3 past endbr64 of `cet_push` and at the entry of
// `cet_mov` (its next instruction is single-stepped either way) and of
// `plain` (no endbr64); every call is still counted once and its return seen.
#include <gtest/gtest.h>

#include <fstream>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

constexpr uint8_t kInt3 = 0xcc;

TEST(EntryPlacement, PastEndbr64WhereTheKernelEmulatesTheNextInstruction) {
    REQUIRE_BPF();
    TempDir tmp;
    std::ofstream(tmp.path("cet.json")) << R"({"name": "cet", "layer": "test", "library": ["cet_entries"],
        "return_probes": true, "symbols": [{"match": "cet_push", "role": "op"}, {"match": "cet_mov", "role": "op"},
        {"match": "plain", "role": "op"}]})";
    constexpr long kCalls = 500;
    auto r = run({commdbg_bin(), "run", "--probes", tmp.path("cet.json"), "--noise-level", "3", "--json",
                  tmp.path("out.json"), "--", testprog("cet_entries"), std::to_string(kCalls)},
                 {}, 120);
    ASSERT_EQ(r.status, 0) << r.err;
    auto lines = workload_lines(r.out, "cet_entries");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    const auto& code = lines[0]["cet_entries"];
    const std::vector<uint8_t> endbr64 = {0xf3, 0x0f, 0x1e, 0xfa};
    auto first = [&](const char* fn, size_t n) {
        auto b = code[fn].get<std::vector<uint8_t>>();
        return std::vector<uint8_t>(b.begin(), b.begin() + n);
    };
    EXPECT_EQ(first("cet_push", 4), endbr64) << "the entry itself is not patched";
    EXPECT_EQ(code["cet_push"][4].get<int>(), kInt3) << "the probe sits on the push after endbr64";
    EXPECT_EQ(code["cet_mov"][0].get<int>(), kInt3) << "a mov after endbr64 is single-stepped anyway: entry";
    EXPECT_EQ(code["plain"][0].get<int>(), kInt3);

    // Each function returns its argument plus 1..3, never 0: a return the
    // kernel saw counts as an "error" (a non-zero status), so errors == calls
    // says every return probe fired, past endbr64 as at an entry.
    std::map<std::string, long> calls, returned, closed;
    for (const auto& p : processes_of(read_json(tmp.path("out.json")))) {
        for (const auto& k : p.value("counters", nlohmann::json::array())) {
            calls[k.value("name", "")] += k.value("calls", 0L);
            returned[k.value("name", "")] += k.value("errors", 0L);
        }
        for (const auto& rec : p.value("records", nlohmann::json::array()))
            if (rec.contains("end_ns") && !rec.value("end_inferred", false)) ++closed[rec.value("name", "")];
    }
    for (const char* fn : {"cet_push", "cet_mov", "plain"}) {
        EXPECT_EQ(calls[fn], kCalls) << fn;
        EXPECT_EQ(returned[fn], kCalls) << fn << ": each call's return seen";
        EXPECT_EQ(closed[fn], kCalls) << fn << ": each record closed by its return";
    }
}

}  // namespace
}  // namespace commdbg::e2e
