// SPDX-License-Identifier: Apache-2.0
// Module calls told apart exactly: tests/testprogs/module_calls.py calls two
// sibling modules of one class, a module twice in a row and the model twice
// in a row, each issuing its collectives with no other record between, so
// each call's frame sits where the last one's did.  Each call must be its
// own module record: per rank, the module records per path equal the calls
// the job counted with its own forward hooks, and each collective sits under
// the module chain the job saw when it issued it.  torch 1.13 (host) and 2.6
// (trixie root).
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

using nlohmann::json;

const std::string kJob = "module_calls.py";

struct Seen {
    std::map<std::string, int> module_records;           // per path
    std::vector<std::vector<std::string>> collectives;   // each c10d collective's module chain
};

void walk(const json& records, std::vector<std::string>& chain, Seen& seen) {
    for (const auto& r : records) {
        const bool module = r["type"] == "module";
        if (module) {
            ++seen.module_records[r["module_fqn"].get<std::string>()];
            chain.push_back(r["module_fqn"].get<std::string>());
        }
        if (r["type"] == "collective" && r["layer"] == "c10d") seen.collectives.push_back(chain);
        else walk(r["children"], chain, seen);
        if (module) chain.pop_back();
    }
}

void expect_each_call_its_own_record(const std::vector<std::string>& job, const std::map<std::string, std::string>& env) {
    TempDir tmp;
    std::vector<std::string> argv = {commdbg_bin(), "run", "--probes", "torch-c10d,torch-scopes,torch-modules",
                                     "--noise-level", "2",
                                     "--json", tmp.path("out.json"), "--"};
    argv.insert(argv.end(), job.begin(), job.end());
    auto r = run(argv, env, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto ranks = workload_lines(r.out, "rank");
    ASSERT_EQ(ranks.size(), 2u) << r.out.substr(0, 2000);
    for_each_rank_process(processes_of(read_json(tmp.path("out.json"))), ranks, [&](const json& rank, const json& p) {
        Seen seen;
        std::vector<std::string> chain;
        walk(p["records"], chain, seen);
        std::map<std::string, int> calls = rank["module_calls"].get<std::map<std::string, int>>();
        // The plan, pinned so a changed job cannot pass by itself: lone is called twice per model call.
        ASSERT_EQ(calls.at("lone"), 2 * calls.at("<root>"));
        EXPECT_EQ(seen.module_records, calls);
        EXPECT_EQ(seen.collectives, rank["collectives"].get<std::vector<std::vector<std::string>>>());
    });
}

TEST(ModuleCalls, Torch113SiblingsAndRepeatedCallsAreEachTheirOwnRecord) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    expect_each_call_its_own_record({py, kTestprogs + "/" + kJob}, {});
}

TEST(ModuleCalls, Torch26SiblingsAndRepeatedCallsAreEachTheirOwnRecord) {
    REQUIRE_BPF();
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    expect_each_call_its_own_record(
        {kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/" + kJob}, kRootJobEnv);
}

}  // namespace
}  // namespace commdbg::e2e
