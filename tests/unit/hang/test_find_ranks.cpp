// SPDX-License-Identifier: Apache-2.0
// commdbg hang's ranks under a pid, on a fake /proc tree: the processes that
// load torch or NCCL with no such process below them.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "hang.hpp"

namespace commdbg::hang {
namespace {

namespace fs = std::filesystem;

class FakeJob : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/commdbg_hang_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        proc_ = tmpl;
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(proc_, ec);
    }
    // A process: its stat (state S, its parent) and its maps.
    void process(int pid, int ppid, const std::string& comm, const std::string& lib) {
        fs::create_directories(proc_ + "/" + std::to_string(pid));
        std::ofstream(proc_ + "/" + std::to_string(pid) + "/stat")
            << pid << " (" << comm << ") S " << ppid << " " << pid << " " << pid
            << " 0 -1 4194304 0 0 0 0 5 3 0 0 20 0 1 0 1000 0 0\n";
        std::ofstream maps(proc_ + "/" + std::to_string(pid) + "/maps");
        maps << "55d0a0000000-55d0a0001000 r--p 00000000 08:01 131 /usr/bin/python3.11\n";
        if (!lib.empty()) maps << "7f1000000000-7f1000200000 r-xp 00010000 fd:02 4242 " << lib << "\n";
    }
    std::string proc_;
};

const std::string kTorch = "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.1";
const std::string kNccl = "/opt/nccl/lib/libnccl.so.2.21.5";

// torchrun: the launcher imports torch, its workers too; the resource
// tracker does not; a worker's own helper child does not either.
TEST_F(FakeJob, ALaunchersWorkersAreTheRanksNotTheLauncher) {
    process(100, 1, "torchrun", kTorch);
    process(101, 100, "python3", kTorch);
    process(102, 100, "python3", kNccl);
    process(103, 100, "python3", "");           // resource tracker
    process(104, 101, "pt_data_worker", "");   // a worker's helper
    process(200, 1, "other", kTorch);          // another job
    auto r = find_ranks({100}, proc_);
    ASSERT_TRUE(r) << r.error();
    EXPECT_EQ(*r, (std::vector<int>{101, 102}));
    // A rank given itself is a rank; given twice, once.
    auto same = find_ranks({101, 101, 102}, proc_);
    ASSERT_TRUE(same) << same.error();
    EXPECT_EQ(*same, (std::vector<int>{101, 102}));
}

TEST_F(FakeJob, APidWithoutRanksOrWithoutAProcessIsAnErrorThatSaysWhatToGive) {
    process(300, 1, "bash", "");
    process(301, 300, "sleep", "");
    auto none = find_ranks({300}, proc_);
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error(), "300: neither it nor a process it started loads libtorch_cpu or libnccl — give the pids "
                            "of the job's ranks, or of their launcher");
    auto gone = find_ranks({999}, proc_);
    ASSERT_FALSE(gone);
    EXPECT_NE(gone.error().find("999"), std::string::npos) << gone.error();
}

}  // namespace
}  // namespace commdbg::hang
