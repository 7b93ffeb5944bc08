// SPDX-License-Identifier: Apache-2.0
// Another process's memory, read in place: the one reader of it.  Every read
// is checked first (an address in user space, a bounded size), so a pointer
// or a length read from the target cannot make a read of any size or send a
// system call to a garbage address.  ProcessMemory reads a live process; a
// test or fuzz target (tests/fuzz/fuzz_py_objects.cpp) implements fetch()
// over an image in memory instead.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace commdbg::host {

class RemoteMemory {
public:
    // The largest single read: more is a length gone wrong (the largest real
    // one, a dict's entries at the Python resolver's bound, is ~400 KiB).
    static constexpr size_t kMaxRead = 1u << 20;

    virtual ~RemoteMemory() = default;
    // All `n` bytes at `addr`, or false.
    bool read(uint64_t addr, void* out, size_t n);
    template <typename T>
    bool get(uint64_t addr, T& out) {
        return read(addr, &out, sizeof out);
    }
    // Two ranges at once (read_prefix: one system call for a live
    // process), both whole or false: a re-validation of fields far apart.
    bool read2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb);
    // Many ranges at once (a live process: one system call per IOV_MAX of
    // them), each checked as read() checks one: how many, from the first,
    // were read whole.  The first that fails ends it; those after it are
    // not read (a caller that wants them asks again past it).
    struct Range {
        uint64_t addr;
        void* out;
        size_t n;
    };
    size_t read_prefix(std::span<const Range> ranges);
    // A NUL-terminated string of at most `max` bytes (127 at most): false when
    // a byte before its end cannot be read.  Read whole first, byte by byte
    // when that fails: the string may end just before an unmapped page.
    bool c_string(uint64_t addr, std::string& out, size_t max);

    // Why the last failed read failed, as an errno: EFAULT for an address or
    // size refused, a part not mapped or a short read; ESRCH when the
    // process has no memory any more (exited, or a zombie); EPERM when the
    // kernel refused it (ptrace access).
    int last_error() const { return last_error_; }
    // Where that read began.
    uint64_t failed_at() const { return failed_at_; }
    // The last failed read failed because the process has no memory any more.
    bool gone() const { return last_error_ == ESRCH; }

protected:
    // Reads all `n` bytes at `addr` (checked already): 0, or why not as an errno.
    virtual int fetch(uint64_t addr, void* out, size_t n) = 0;
    // The ranges (checked already, at most kMaxRanges): how many, from the
    // first, were read whole, and why the next one was not (an errno).
    virtual size_t fetch_prefix(std::span<const Range> ranges, int& err);
    static constexpr size_t kMaxRanges = 1024;  // IOV_MAX

private:
    // What read() reads: an address in user space, 1 to kMaxRead bytes.
    static bool acceptable(uint64_t addr, size_t n);
    bool failed(int err, uint64_t addr);
    int last_error_ = 0;
    uint64_t failed_at_ = 0;
};

// A live process's memory, with process_vm_readv: root, or the same uid with
// ptrace access (procfs.hpp's may_read_process).  Where its main thread has
// exited while others run on, the kernel finds no memory through the pid:
// reads then go through a live thread's id (procfs.hpp, live_thread).
class ProcessMemory final : public RemoteMemory {
public:
    explicit ProcessMemory(int pid) : pid_(pid), via_(pid) {}
    int pid() const { return pid_; }

protected:
    int fetch(uint64_t addr, void* out, size_t n) override;
    size_t fetch_prefix(std::span<const Range> ranges, int& err) override;

private:
    // After ESRCH through via_: whether another live thread was found.
    bool switch_thread();
    int pid_;
    int via_;  // the task id reads name
};

}  // namespace commdbg::host
