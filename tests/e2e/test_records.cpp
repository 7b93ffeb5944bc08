// SPDX-License-Identifier: Apache-2.0
// Acceptance: per-record elements and bytes for every NCCL datatype; exact
// kernel counters and reported drops under a deliberately small ring buffer.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

// NCCL's datatypes and their sizes, written out here independently of
// userspace/capture/nccl.cpp so a wrong table there fails this test.
const std::map<std::string, int> kDtypeBytes = {
    {"int8", 1},    {"uint8", 1},   {"int32", 4},   {"uint32", 4},    {"int64", 8},   {"uint64", 8},
    {"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2},  {"fp8e4m3", 1}, {"fp8e5m2", 1},
};

TEST(Records, ElementsAndBytesAreRightForEveryDatatype) {
    REQUIRE_BPF();
    TempDir tmp;
    const int count = 1000, rounds = 2;
    const int calls = static_cast<int>(kDtypeBytes.size()) * rounds;
    for (const std::string kind : {"all_reduce", "all_gather", "reduce_scatter"}) {
        auto r = run({commdbg_bin(), "run", "--json", tmp.path(kind + ".json"), "--", testprog("nccl_workload"),
                      "--calls", kind + "=" + std::to_string(calls), "--dtype", "all", "--count",
                      std::to_string(count), "--init-seed", "9", "--nranks", "4", "--rank", "2"},
                     nccl_env(false));
        ASSERT_EQ(r.status, 0) << r.err;
        auto j = read_json(tmp.path(kind + ".json"));
        std::map<std::string, int> seen;
        for (const auto& rec : j["records"]) {
            if (rec.value("collective", "") != kind) continue;
            std::string dt = rec.at("dtype").get<std::string>();
            ASSERT_TRUE(kDtypeBytes.count(dt)) << "unknown dtype " << dt;
            ++seen[dt];
            EXPECT_EQ(rec.at("bytes").get<long>(), static_cast<long>(count) * kDtypeBytes.at(dt)) << kind << " " << dt;
            // count is per rank for all_gather (send) and reduce_scatter (recv).
            long in = rec.at("input_elements").get<long>(), out = rec.at("output_elements").get<long>();
            if (kind == "all_gather") {
                EXPECT_EQ(in, count);
                EXPECT_EQ(out, count * 4L);
            } else if (kind == "reduce_scatter") {
                EXPECT_EQ(in, count * 4L);
                EXPECT_EQ(out, count);
            } else {
                EXPECT_EQ(in, count);
                EXPECT_EQ(out, count);
            }
        }
        EXPECT_EQ(seen.size(), kDtypeBytes.size()) << kind;
        for (const auto& [dt, n] : seen) EXPECT_EQ(n, rounds) << kind << " " << dt;
        // The exact kernel counters agree, per datatype.
        std::map<std::string, int> counted;
        for (const auto& c : j["counters"]) {
            if (c.value("collective", "") != kind) continue;
            std::string dt = c.at("dtype").get<std::string>();
            ++counted[dt];
            EXPECT_EQ(c.at("calls").get<long>(), rounds) << kind << " " << dt;
            EXPECT_EQ(c.at("elements").get<long>(), static_cast<long>(rounds) * count) << kind << " " << dt;
            EXPECT_EQ(c.at("bytes").get<long>(), static_cast<long>(rounds) * count * kDtypeBytes.at(dt)) << kind << " " << dt;
        }
        EXPECT_EQ(counted.size(), kDtypeBytes.size()) << kind;
    }
}

TEST(Records, FiveMillionCallsWithTinyRingBufferKeepExactCountsAndReportDrops) {
    REQUIRE_BPF();
    TempDir tmp;
    const long n = 5'000'000;
    auto r = run({commdbg_bin(), "run", "--ringbuf-kb", "16", "--noise-level", "0", "--json", tmp.path("out.json"),
                  "--table", tmp.path("out.txt"), "--", testprog("nccl_workload"), "--calls",
                  "all_reduce=" + std::to_string(n), "--fake-comm"},
                 nccl_env(false), 600);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 2000);
    auto j = read_json(tmp.path("out.json"));
    EXPECT_EQ(j["comm_counts"]["nccl.all_reduce"].get<long>(), n);
    EXPECT_EQ(j["total_counts"].get<long>(), n);
    ASSERT_TRUE(j.contains("dropped_records")) << "drops must be reported, never silent";
    long dropped = j["dropped_records"].get<long>();
    EXPECT_GT(dropped, 0);
    EXPECT_GT(j["kernel_drops"]["ringbuf_full"].get<long>(), 0);
    // Every call is either a retained record or a counted drop.
    long retained = 0;
    for (const auto& rec : j["records"])
        if (rec.value("name", "") == "ncclAllReduce") ++retained;
    EXPECT_EQ(retained + dropped, n);
    EXPECT_NE(r.err.find("kernel-side losses"), std::string::npos) << "the user is told on stderr";
}

}  // namespace
}  // namespace commdbg::e2e

namespace commdbg::e2e {
namespace {

TEST(Records, MaxRecordsBudgetRetainsExactlyTheBudgetAndCountsTheRest) {
    REQUIRE_BPF();
    TempDir tmp;
    const int budget = 1000, calls = 5000;
    auto r = run({commdbg_bin(), "run", "--max-records", std::to_string(budget), "--json", tmp.path("out.json"),
                  "--table", tmp.path("table.txt"), "--", testprog("nccl_workload"), "--calls",
                  "all_reduce=2000,all_gather=2000,broadcast=1000", "--threads", "2", "--fake-comm"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    auto j = read_json(tmp.path("out.json"));
    size_t retained = 0;
    std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& recs) {
        for (const auto& rec : recs) {
            ++retained;
            walk(rec["children"]);
        }
    };
    walk(j["records"]);
    EXPECT_EQ(retained, static_cast<size_t>(budget));
    EXPECT_EQ(j["dropped_records"].get<int>(), calls - budget);
    EXPECT_EQ(j["comm_counts"]["nccl.all_reduce"].get<int>(), 2000);
    EXPECT_EQ(j["comm_counts"]["nccl.all_gather"].get<int>(), 2000);
    EXPECT_EQ(j["comm_counts"]["nccl.broadcast"].get<int>(), 1000);
    EXPECT_EQ(j["total_counts"].get<int>(), calls);
    // The table file is plain text, and says the tree is incomplete.
    std::ifstream in(tmp.path("table.txt"));
    std::string table((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(table.find('\x1b'), std::string::npos);
    EXPECT_NE(table.find("incomplete"), std::string::npos) << table.substr(0, 1500);
}

}  // namespace
}  // namespace commdbg::e2e
