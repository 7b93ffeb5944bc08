// SPDX-License-Identifier: Apache-2.0
// RemoteMemory::read_prefix on a live process (this one): many ranges in
// few system calls, and where a range fails, exactly which were read; and
// reads of a process whose main thread has exited while others run on.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include "procfs.hpp"
#include "remote_memory.hpp"

using namespace commdbg;
using Range = host::RemoteMemory::Range;

namespace {

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A page that was mapped and is not any more: every read of it fails.
uint64_t unmapped_page() {
    const long page = sysconf(_SC_PAGESIZE);
    void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
    munmap(p, page);
    return addr_of(p);
}

}  // namespace

TEST(RemoteMemory, ReadPrefixReadsEveryRangeAcrossTheKernelsIovecLimit) {
    // More ranges than one process_vm_readv takes (IOV_MAX, 1024).
    std::vector<uint64_t> words(2500);
    for (size_t i = 0; i < words.size(); ++i) words[i] = 0x5eed0000 + i * 7;
    std::vector<uint64_t> out(words.size(), 0);
    std::vector<Range> ranges;
    for (size_t i = 0; i < words.size(); ++i) ranges.push_back({addr_of(&words[i]), &out[i], sizeof out[i]});
    host::ProcessMemory mem(getpid());
    EXPECT_EQ(mem.read_prefix(ranges), words.size());
    EXPECT_EQ(out, words);
}

TEST(RemoteMemory, ReadPrefixStopsAtTheFirstRangeThatFailsAndSaysWhere) {
    const uint64_t gone = unmapped_page();
    ASSERT_NE(gone, 0u);
    uint64_t a = 11, b = 22, c = 33, oa = 0, ob = 0, oc = 0, og = 0;
    host::ProcessMemory mem(getpid());
    std::vector<Range> ranges = {{addr_of(&a), &oa, 8}, {addr_of(&b), &ob, 8}, {gone, &og, 8}, {addr_of(&c), &oc, 8}};
    EXPECT_EQ(mem.read_prefix(ranges), 2u);
    EXPECT_EQ(oa, 11u);
    EXPECT_EQ(ob, 22u);
    EXPECT_EQ(oc, 0u) << "nothing past the failed range is read";
    EXPECT_EQ(mem.failed_at(), gone);
    EXPECT_EQ(mem.last_error(), EFAULT);
    // Asked again past it, the rest reads.
    EXPECT_EQ(mem.read_prefix(std::span(ranges).subspan(3)), 1u);
    EXPECT_EQ(oc, 33u);
}

TEST(RemoteMemory, ReadPrefixRefusesWhatReadRefusesWithoutAsking) {
    uint64_t a = 1, oa = 0, ok = 0;
    char big = 0;
    host::ProcessMemory mem(getpid());
    // A kernel address, then a length past kMaxRead: refused as read() refuses them.
    std::vector<Range> kernel = {{addr_of(&a), &oa, 8}, {0xffff800000000000ull, &ok, 8}};
    EXPECT_EQ(mem.read_prefix(kernel), 1u);
    EXPECT_EQ(mem.failed_at(), 0xffff800000000000ull);
    EXPECT_EQ(mem.last_error(), EFAULT);
    std::vector<Range> huge = {{addr_of(&a), &big, host::RemoteMemory::kMaxRead + 1}};
    EXPECT_EQ(mem.read_prefix(huge), 0u);
    EXPECT_EQ(mem.read_prefix({}), 0u);
}

TEST(RemoteMemory, ReadPrefixOfAnExitedProcessSaysItIsGone) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    uint64_t a = 5, oa = 0;
    host::ProcessMemory mem(child);
    std::vector<Range> ranges = {{addr_of(&a), &oa, 8}};
    EXPECT_EQ(mem.read_prefix(ranges), 0u);
    EXPECT_TRUE(mem.gone()) << mem.last_error();
}

namespace {

volatile uint64_t g_marker = 1;

void* sleep_on(void*) {
    for (;;) pause();
}

char task_state(int pid, int tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!std::getline(in, line)) return 0;
    size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : 0;
}

}  // namespace

// pthread_exit in main while another thread runs: the kernel finds no memory
// through the pid (process_vm_readv(PID) fails with ESRCH, as for a process
// gone), yet the process runs.  Reads go through a live thread instead.
TEST(RemoteMemory, AProcessWhoseMainThreadExitedIsReadThroughALiveThread) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        g_marker = 0xfeedfacecafef00dull;
        pthread_t t;
        if (pthread_create(&t, nullptr, sleep_on, nullptr)) _exit(1);
        // The main thread alone, without unwinding through the test's
        // frames (pthread_exit would, and gtest's catch would abort it).
        syscall(SYS_exit, 0);
    }
    struct Reap {
        pid_t pid;
        ~Reap() {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    } reap{child};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (task_state(child, child) != 'Z' && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(task_state(child, child), 'Z') << "the child's main thread never exited";
    auto live = host::live_thread(child);
    ASSERT_TRUE(live.has_value()) << "its other thread runs";
    EXPECT_NE(*live, child);

    host::ProcessMemory mem(child);
    uint64_t v = 0;
    ASSERT_TRUE(mem.get(addr_of(const_cast<uint64_t*>(&g_marker)), v)) << "errno " << mem.last_error();
    EXPECT_EQ(v, 0xfeedfacecafef00dull);
    uint64_t w = 0;
    host::ProcessMemory batch(child);
    std::vector<Range> ranges = {{addr_of(const_cast<uint64_t*>(&g_marker)), &w, 8}};
    EXPECT_EQ(batch.read_prefix(ranges), 1u) << "errno " << batch.last_error();
    EXPECT_EQ(w, 0xfeedfacecafef00dull);
    auto info = host::read_process(child);
    ASSERT_TRUE(info.ok()) << info.error();
    EXPECT_NE(info->state, 'Z') << "the process runs: its state is its live thread's";
    EXPECT_EQ(info->live_tid, *live);
    auto maps = host::read_maps(child);
    ASSERT_TRUE(maps.ok()) << maps.error();
    EXPECT_FALSE(maps->empty()) << "a live thread's maps, not the main thread's empty ones";
}
