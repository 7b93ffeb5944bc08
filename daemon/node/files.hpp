// SPDX-License-Identifier: Apache-2.0
// Probed library files: which user each was probed for (so that no user but
// root can take the kernel's map of them), and those deleted or replaced (a
// new NCCL installed over the old one), whose probes go once no process maps
// them any more.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>
#include <utility>

#include <nlohmann/json.hpp>

namespace commdbg::capture {
class BpfSession;
class ProbeAttacher;
struct AttachedFile;
}  // namespace commdbg::capture

namespace commdbg::daemon {

// Returns the files detached.
std::vector<capture::AttachedFile> detach_deleted_files(capture::ProbeAttacher& attacher, capture::BpfSession& bpf);

// The kernel stops a process at a libnccl file new to the node until its
// probes are in, and remembers probed files in a fixed-size map: one user
// mapping thousands of copies would fill it, and from then on every new file
// of anyone would be stopped for at every process start.  So a user other
// than root holds at most `per_uid` probed files, and all of them together
// at most `others`: the rest of the map is root's.  Past its share a user's
// new files are neither stopped for nor probed (counted, noted).
class FileShares {
public:
    using FileId = std::pair<uint64_t, uint64_t>;  // (st_dev, inode)
    FileShares(size_t per_uid, size_t others) : per_uid_(per_uid), others_max_(others) {}

    // Files that may still be probed for `uid` now.
    size_t room(uint32_t uid) const;
    void charge(uint32_t uid, FileId f);
    void uncharge(FileId f);  // the file's probes are gone
    std::optional<uint32_t> owner(FileId f) const;
    void refused(uint32_t uid, size_t files) { refused_[uid] += files; }
    // What the kernel is told (BpfSession::set_uid_capped / set_others_capped).
    bool capped(uint32_t uid) const { return uid != 0 && held(uid) >= per_uid_; }
    bool others_capped() const { return others_ >= others_max_; }
    size_t held(uint32_t uid) const;
    nlohmann::json to_json() const;

private:
    size_t per_uid_, others_max_;
    size_t others_ = 0;                   // files held by users other than root
    std::map<FileId, uint32_t> owner_;    // file -> the uid it was probed for
    std::map<uint32_t, size_t> held_;     // uid -> files it holds
    std::map<uint32_t, uint64_t> refused_;  // uid -> files not probed for it
};

}  // namespace commdbg::daemon
