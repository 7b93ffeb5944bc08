// SPDX-License-Identifier: Apache-2.0
#include "node_files.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>
#include <set>

#include "bpf_session.hpp"
#include "probe_attach.hpp"
#include "procfs.hpp"

namespace commdbg {

namespace {

// Inodes that any process maps now.  By inode alone: the device in
// /proc/PID/maps can differ from st_dev (overlayfs), and keeping a file
// attached too long is the safe mistake.
std::set<uint64_t> mapped_inodes() {
    std::set<uint64_t> mapped;
    DIR* d = opendir("/proc");
    if (!d) return mapped;
    while (dirent* e = readdir(d)) {
        char* end = nullptr;
        long pid = strtol(e->d_name, &end, 10);
        if (!end || *end || pid <= 0) continue;
        auto maps = read_maps(static_cast<int>(pid));
        if (!maps) continue;
        for (const auto& m : *maps)
            if (m.inode) mapped.insert(m.inode);
    }
    closedir(d);
    return mapped;
}

}  // namespace

void detach_deleted_files(ProbeAttacher& attacher, BpfSession& bpf) {
    // Cheap test first: is each probed file still there under its path?
    auto replaced = [](const AttachedFile& f) {
        struct stat st {};
        return ::stat(f.path.c_str(), &st) != 0 || st.st_ino != f.inode || st.st_dev != f.dev;
    };
    bool any = false;
    for (const auto& f : attacher.files()) any = any || replaced(f);
    if (!any) return;
    // Only then the costly one: which files does any process still map?
    const std::set<uint64_t> mapped = mapped_inodes();
    auto gone = attacher.detach_files([&](const AttachedFile& f) { return replaced(f) && !mapped.count(f.inode); });
    for (const auto& f : gone) bpf.forget_known_file(f.dev, f.inode);
}

}  // namespace commdbg
