// SPDX-License-Identifier: Apache-2.0
// FileShares: no user but root can take the kernel's map of probed library
// files (daemon/node/files.hpp), whatever it maps.
#include <gtest/gtest.h>

#include "files.hpp"

namespace commdbg::daemon {
namespace {

FileShares::FileId file(uint64_t n) { return {42, n}; }

TEST(FileShares, AUserOtherThanRootHoldsAtMostItsShare) {
    FileShares s(3, 100);
    EXPECT_EQ(s.room(1000), 3u);
    for (uint64_t i = 0; i < 3; ++i) s.charge(1000, file(i));
    EXPECT_EQ(s.room(1000), 0u);
    EXPECT_TRUE(s.capped(1000));
    // Another user is not held to the first one's share.
    EXPECT_EQ(s.room(1001), 3u);
    EXPECT_FALSE(s.capped(1001));
}

TEST(FileShares, RootIsNeverCapped) {
    FileShares s(1, 2);
    for (uint64_t i = 0; i < 10; ++i) s.charge(0, file(i));
    EXPECT_FALSE(s.capped(0));
    EXPECT_GT(s.room(0), 1000u);
    // Root's files do not count against the others' share.
    EXPECT_EQ(s.room(7), 1u);
    EXPECT_FALSE(s.others_capped());
}

TEST(FileShares, UsersOtherThanRootTogetherLeaveRoomForRoot) {
    FileShares s(4, 6);
    for (uint64_t i = 0; i < 4; ++i) s.charge(1000, file(i));
    EXPECT_EQ(s.room(1001), 2u);  // what is left of the others' share, under its own 4
    s.charge(1001, file(10));
    s.charge(1001, file(11));
    EXPECT_TRUE(s.others_capped());
    EXPECT_EQ(s.room(1002), 0u);
    EXPECT_GT(s.room(0), 0u);
}

TEST(FileShares, AFileIsChargedOnceToTheFirstUserAndFreedWhenItsProbesGo) {
    FileShares s(2, 10);
    s.charge(1000, file(1));
    s.charge(1001, file(1));  // the same file, mapped by another user later
    EXPECT_EQ(s.held(1000), 1u);
    EXPECT_EQ(s.held(1001), 0u);
    s.charge(1000, file(2));
    EXPECT_TRUE(s.capped(1000));
    ASSERT_EQ(s.owner(file(2)), 1000u);
    s.uncharge(file(2));
    EXPECT_FALSE(s.capped(1000));
    EXPECT_EQ(s.room(1000), 1u);
    EXPECT_FALSE(s.owner(file(2)).has_value());
    s.uncharge(file(99));  // never charged: nothing changes
    EXPECT_EQ(s.held(1000), 1u);
}

TEST(FileShares, StatusSaysWhoHoldsWhatAndWhatWasRefused) {
    FileShares s(1, 10);
    s.charge(1000, file(1));
    s.refused(1000, 5);
    auto j = s.to_json();
    EXPECT_EQ(j["held_by_uid"]["1000"], 1);
    EXPECT_EQ(j["refused_by_uid"]["1000"], 5);
    EXPECT_EQ(j["capped_uids"], nlohmann::json::array({1000}));
    EXPECT_EQ(j["per_uid"], 1);
}

}  // namespace
}  // namespace commdbg::daemon
