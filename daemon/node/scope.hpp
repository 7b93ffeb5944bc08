// SPDX-License-Identifier: Apache-2.0
// commdbgd --scope-cgroup: which processes the node counter may count.
#pragma once

#include <cstdint>
#include <string>

#include "result.hpp"

namespace commdbg::daemon {

class CgroupScope {
public:
    // The whole node.
    CgroupScope() = default;
    // `dir`: a cgroup v2 directory; its fd goes to the BPF program, its path
    // relative to the cgroup2 mount is compared with /proc/PID/cgroup.
    static Result<CgroupScope> open(const std::string& dir);
    CgroupScope(CgroupScope&& o) noexcept : fd_(o.fd_), rel_(std::move(o.rel_)) { o.fd_ = -1; }
    CgroupScope& operator=(CgroupScope&& o) noexcept;
    CgroupScope(const CgroupScope&) = delete;
    CgroupScope& operator=(const CgroupScope&) = delete;
    ~CgroupScope();

    bool contains(uint32_t pid) const;
    int fd() const { return fd_; }  // -1: the whole node

private:
    int fd_ = -1;
    std::string rel_;  // as it appears in /proc/PID/cgroup ("0::<rel>"); empty: the whole node
};

}  // namespace commdbg::daemon
