// SPDX-License-Identifier: Apache-2.0
// RemoteMemory::read_prefix on a live process (this one): many ranges in
// few system calls, and where a range fails, exactly which were read.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <span>
#include <vector>

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
