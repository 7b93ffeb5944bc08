// SPDX-License-Identifier: Apache-2.0
// Acceptance: two processes initialising with the same unique id report the
// same communicator id, equal to NCCL's commHash for that id, with the right
// rank and nranks; a split child gets the same derived id in both.
// Stub NCCL: the real library cannot init without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <regex>

#include "e2e_util.hpp"

namespace commdbg::e2e {
namespace {

constexpr int kSeed = 5;
constexpr int kNranks = 2;
constexpr int kColor = 3;

struct RankRun {
    std::string id_hash;  // the workload's own commHash of its unique id, "0x..."
    nlohmann::json comms; // commdbg's "communicators"
    nlohmann::json dump;
};

// commdbg run of one rank: init from seed, split once with `color`, 3 all_reduces.
RankRun run_rank(int seed, int rank, int color) {
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--json", tmp.path("out.json"), "--", testprog("nccl_workload"), "--calls",
                  "all_reduce=3", "--init-seed", std::to_string(seed), "--nranks", std::to_string(kNranks), "--rank",
                  std::to_string(rank), "--split", std::to_string(color), "--print-id-hash"},
                 nccl_env(false));
    EXPECT_EQ(r.status, 0) << r.err << r.out;
    RankRun rr;
    std::smatch m;
    static const std::regex re("id_hash=(0x[0-9a-fA-F]+)");
    if (std::regex_search(r.out, m, re)) rr.id_hash = m[1];
    EXPECT_FALSE(rr.id_hash.empty()) << "workload printed no id_hash: " << r.out;
    rr.dump = read_json(tmp.path("out.json"));
    rr.comms = rr.dump.value("communicators", nlohmann::json::array());
    return rr;
}

std::optional<nlohmann::json> find_origin(const nlohmann::json& comms, const std::string& origin) {
    std::optional<nlohmann::json> found;
    for (const auto& c : comms)
        if (c.value("origin", "") == origin) {
            EXPECT_FALSE(found.has_value()) << "more than one " << origin << " communicator: " << comms.dump(2);
            found = c;
        }
    return found;
}

uint64_t hex(const nlohmann::json& v) {
    if (!v.is_string()) return 0;
    return std::strtoull(v.get<std::string>().c_str(), nullptr, 16);
}

// Checks one rank's dump; returns {init comm, split comm}.
std::pair<nlohmann::json, nlohmann::json> check_rank(const RankRun& rr, int rank) {
    auto init = find_origin(rr.comms, "init_rank");
    auto split = find_origin(rr.comms, "split");
    EXPECT_TRUE(init.has_value()) << rr.comms.dump(2);
    EXPECT_TRUE(split.has_value()) << rr.comms.dump(2);
    if (!init || !split) return {};
    EXPECT_EQ(rr.comms.size(), 2u) << rr.comms.dump(2);
    // Compare numerically: the id is NCCL's commHash, not its spelling.
    EXPECT_NE(hex((*init)["id"]), 0u) << init->dump();
    EXPECT_EQ(hex((*init)["id"]), hex(rr.id_hash)) << "init comm id vs workload's commHash " << rr.id_hash;
    EXPECT_EQ((*init)["nranks"], kNranks);
    EXPECT_EQ((*init)["rank"], rank);
    EXPECT_TRUE((*init)["parent_ptr"].is_null());
    EXPECT_EQ((*init)["destroyed"], true);
    // The split child hangs off the parent and has its own id.
    EXPECT_EQ((*split)["parent_ptr"], (*init)["ptr"]);
    EXPECT_NE((*split)["ptr"], (*init)["ptr"]);
    EXPECT_NE(hex((*split)["id"]), 0u) << split->dump();
    EXPECT_NE(hex((*split)["id"]), hex((*init)["id"]));
    EXPECT_EQ((*split)["destroyed"], true);
    return {*init, *split};
}

TEST(Communicators, SameUniqueIdGivesSameIdOnBothRanksAndSplitChildIdMatches) {
    REQUIRE_BPF();
    auto r0 = run_rank(kSeed, 0, kColor);
    auto r1 = run_rank(kSeed, 1, kColor);
    ASSERT_FALSE(HasFailure());
    auto [init0, split0] = check_rank(r0, 0);
    auto [init1, split1] = check_rank(r1, 1);
    ASSERT_FALSE(HasFailure());
    // The two processes computed the same hash independently, and commdbg agrees.
    EXPECT_EQ(r0.id_hash, r1.id_hash);
    EXPECT_EQ(init0["id"], init1["id"]);
    // Same parent, same color, first split: same derived child id on both ranks.
    EXPECT_EQ(split0["id"], split1["id"]);
    // The all_reduces ran on the child: counted once each.
    EXPECT_EQ(r0.dump["comm_counts"]["nccl.all_reduce"], 3);
    EXPECT_EQ(r1.dump["comm_counts"]["nccl.all_reduce"], 3);
}

TEST(Communicators, DifferentUniqueIdGivesDifferentIds) {
    REQUIRE_BPF();
    auto a = run_rank(kSeed, 0, kColor);
    auto b = run_rank(kSeed + 1, 0, kColor);
    ASSERT_FALSE(HasFailure());
    auto [init_a, split_a] = check_rank(a, 0);
    auto [init_b, split_b] = check_rank(b, 0);
    ASSERT_FALSE(HasFailure());
    EXPECT_NE(a.id_hash, b.id_hash) << "the workload's seeds should give different unique ids";
    EXPECT_NE(hex(init_a["id"]), hex(init_b["id"]));
    // The child id derives from the parent's: a different parent, a different child.
    EXPECT_NE(hex(split_a["id"]), hex(split_b["id"]));
}

TEST(Communicators, SplitColorChangesChildIdButNotParentId) {
    REQUIRE_BPF();
    auto a = run_rank(kSeed, 0, kColor);
    auto b = run_rank(kSeed, 1, kColor + 1);
    ASSERT_FALSE(HasFailure());
    auto [init_a, split_a] = check_rank(a, 0);
    auto [init_b, split_b] = check_rank(b, 1);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(hex(init_a["id"]), hex(init_b["id"]));
    EXPECT_NE(hex(split_a["id"]), hex(split_b["id"])) << "different colors form different child communicators";
}

}  // namespace
}  // namespace commdbg::e2e
