// SPDX-License-Identifier: Apache-2.0
#include "remote_memory.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "arch.hpp"
#include "procfs.hpp"

namespace commdbg::host {

bool RemoteMemory::failed(int err, uint64_t addr) {
    last_error_ = err;
    failed_at_ = addr;
    return false;
}

bool RemoteMemory::acceptable(uint64_t addr, size_t n) {
    return arch::is_user_address(addr) && n != 0 && n <= kMaxRead;
}

bool RemoteMemory::read(uint64_t addr, void* out, size_t n) {
    if (!acceptable(addr, n)) return failed(EFAULT, addr);
    if (int err = fetch(addr, out, n)) return failed(err, addr);
    return true;
}

bool RemoteMemory::read2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) {
    const Range both[2] = {{a, oa, na}, {b, ob, nb}};
    return read_prefix(both) == 2;
}

size_t RemoteMemory::read_prefix(std::span<const Range> ranges) {
    size_t done = 0;
    while (done < ranges.size()) {
        auto part = ranges.subspan(done, std::min(kMaxRanges, ranges.size() - done));
        size_t valid = 0;  // the leading ranges read() would accept
        while (valid < part.size() && acceptable(part[valid].addr, part[valid].n)) ++valid;
        int err = 0;
        size_t got = valid ? fetch_prefix(part.first(valid), err) : 0;
        done += got;
        if (got < part.size()) {
            failed(got < valid ? err : EFAULT, ranges[done].addr);
            return done;
        }
    }
    return done;
}

size_t RemoteMemory::fetch_prefix(std::span<const Range> ranges, int& err) {
    for (size_t i = 0; i < ranges.size(); ++i)
        if ((err = fetch(ranges[i].addr, ranges[i].out, ranges[i].n)) != 0) return i;
    return ranges.size();
}

bool RemoteMemory::c_string(uint64_t addr, std::string& out, size_t max) {
    std::array<char, 128> buf{};
    max = std::min(max, buf.size() - 1);
    out.clear();
    if (read(addr, buf.data(), max)) {
        out.assign(buf.data(), strnlen(buf.data(), max));
        return true;
    }
    for (size_t i = 0; i < max; ++i) {
        char c = 0;
        if (!get(addr + i, c)) return false;
        if (c == '\0') return true;
        out.push_back(c);
    }
    return true;
}

namespace {

// A short read is a range that ends in an unmapped page.
int vm_readv(int pid, const iovec* local, const iovec* remote, unsigned long n, size_t want) {
    ssize_t got = process_vm_readv(pid, local, n, remote, n, 0);
    if (got == static_cast<ssize_t>(want)) return 0;
    return got < 0 ? errno : EFAULT;
}

}  // namespace

bool ProcessMemory::switch_thread() {
    auto live = live_thread(pid_);
    if (!live || *live == via_) return false;
    via_ = *live;
    return true;
}

int ProcessMemory::fetch(uint64_t addr, void* out, size_t n) {
    iovec local{out, n};
    iovec remote{reinterpret_cast<void*>(addr), n};
    int err = vm_readv(via_, &local, &remote, 1, n);
    if (err == ESRCH && switch_thread()) err = vm_readv(via_, &local, &remote, 1, n);
    return err;
}

size_t ProcessMemory::fetch_prefix(std::span<const Range> ranges, int& err) {
    std::vector<iovec> local, remote;
    local.reserve(ranges.size()), remote.reserve(ranges.size());
    for (const Range& r : ranges) {
        local.push_back({r.out, r.n});
        remote.push_back({reinterpret_cast<void*>(r.addr), r.n});
    }
    ssize_t got = process_vm_readv(via_, local.data(), ranges.size(), remote.data(), ranges.size(), 0);
    int why = got < 0 ? errno : 0;
    if (why == ESRCH && switch_thread()) {
        got = process_vm_readv(via_, local.data(), ranges.size(), remote.data(), ranges.size(), 0);
        why = got < 0 ? errno : 0;
    }
    if (got < 0) {
        err = why;
        return 0;
    }
    // The kernel stops at the first range it cannot read (a short count);
    // those before it are whole.
    size_t whole = 0;
    for (size_t left = static_cast<size_t>(got); whole < ranges.size() && ranges[whole].n <= left; ++whole)
        left -= ranges[whole].n;
    err = EFAULT;
    return whole;
}

}  // namespace commdbg::host
