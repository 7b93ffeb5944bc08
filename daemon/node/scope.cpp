// SPDX-License-Identifier: Apache-2.0
#include "scope.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace commdbg::daemon {

namespace {

// Mount point of the cgroup v2 hierarchy that holds `path`.
std::string cgroup2_mount_for(const std::string& path) {
    std::ifstream in("/proc/self/mountinfo");
    std::string line, best;
    while (std::getline(in, line)) {
        // ... mountpoint ... - fstype source options
        std::istringstream ss(line);
        std::string id, parent, dev, root, mp;
        ss >> id >> parent >> dev >> root >> mp;
        auto dash = line.find(" - ");
        if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
        if (path.rfind(mp, 0) == 0 && mp.size() > best.size()) best = mp;
    }
    return best;
}

}  // namespace

Result<CgroupScope> CgroupScope::open(const std::string& dir) {
    using R = Result<CgroupScope>;
    CgroupScope s;
    s.fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s.fd_ < 0)
        return R::fail("commdbgd: --scope-cgroup " + dir + ": " + std::strerror(errno) +
                       " — give a cgroup v2 directory, e.g. /sys/fs/cgroup/unified/job1");
    std::string mp = cgroup2_mount_for(dir);
    if (mp.empty())
        return R::fail("commdbgd: --scope-cgroup " + dir +
                       ": not inside a cgroup v2 hierarchy — give a directory under the cgroup2 mount");
    s.rel_ = dir.substr(mp.size());
    while (s.rel_.size() > 1 && s.rel_.back() == '/') s.rel_.pop_back();
    if (s.rel_.empty()) s.rel_ = "/";
    return R(std::move(s));
}

CgroupScope& CgroupScope::operator=(CgroupScope&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) close(fd_);
        fd_ = o.fd_;
        rel_ = std::move(o.rel_);
        o.fd_ = -1;
    }
    return *this;
}

CgroupScope::~CgroupScope() {
    if (fd_ >= 0) close(fd_);
}

bool CgroupScope::contains(uint32_t pid) const {
    if (rel_.empty()) return true;
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("0::", 0) != 0) continue;
        std::string rel = line.substr(3);
        if (rel_ == "/") return true;
        return rel == rel_ || rel.rfind(rel_ + "/", 0) == 0;
    }
    return false;
}

}  // namespace commdbg::daemon
