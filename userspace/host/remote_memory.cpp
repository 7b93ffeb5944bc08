// SPDX-License-Identifier: Apache-2.0
#include "remote_memory.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "arch.hpp"

namespace commdbg::host {

bool RemoteMemory::failed(int err, uint64_t addr) {
    last_error_ = err;
    failed_at_ = addr;
    return false;
}

bool RemoteMemory::read(uint64_t addr, void* out, size_t n) {
    if (!arch::is_user_address(addr) || n == 0 || n > kMaxRead) return failed(EFAULT, addr);
    if (int err = fetch(addr, out, n)) return failed(err, addr);
    return true;
}

bool RemoteMemory::read2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) {
    if (!arch::is_user_address(a) || na > kMaxRead) return failed(EFAULT, a);
    if (!arch::is_user_address(b) || nb > kMaxRead) return failed(EFAULT, b);
    if (int err = fetch2(a, oa, na, b, ob, nb)) return failed(err, a);
    return true;
}

int RemoteMemory::fetch2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) {
    if (int err = fetch(a, oa, na)) return err;
    return fetch(b, ob, nb);
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

int ProcessMemory::fetch(uint64_t addr, void* out, size_t n) {
    iovec local{out, n};
    iovec remote{reinterpret_cast<void*>(addr), n};
    return vm_readv(pid_, &local, &remote, 1, n);
}

int ProcessMemory::fetch2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) {
    iovec local[2] = {{oa, na}, {ob, nb}};
    iovec remote[2] = {{reinterpret_cast<void*>(a), na}, {reinterpret_cast<void*>(b), nb}};
    return vm_readv(pid_, local, remote, 2, na + nb);
}

}  // namespace commdbg::host
