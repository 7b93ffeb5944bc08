// SPDX-License-Identifier: Apache-2.0
#include "files.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "bpf_session.hpp"
#include "probe_attach.hpp"
#include "procfs.hpp"

namespace commdbg::daemon {

namespace {

// Inodes that any process maps now.  By inode alone: the device in
// /proc/PID/maps can differ from st_dev (overlayfs), and keeping a file
// attached too long is the safe mistake.
std::set<uint64_t> mapped_inodes() {
    std::set<uint64_t> mapped;
    for (int pid : host::numeric_entries("/proc")) {
        auto maps = host::read_maps(pid);
        if (!maps) continue;
        for (const auto& m : *maps)
            if (m.inode) mapped.insert(m.inode);
    }
    return mapped;
}

}  // namespace

std::vector<capture::AttachedFile> detach_deleted_files(capture::ProbeAttacher& attacher, capture::BpfSession& bpf) {
    // Cheap test first: is each probed file still there under its path?
    auto replaced = [](const capture::AttachedFile& f) {
        struct stat st {};
        return ::stat(f.path.c_str(), &st) != 0 || st.st_ino != f.inode || st.st_dev != f.dev;
    };
    bool any = false;
    for (const auto& f : attacher.files()) any = any || replaced(f);
    if (!any) return {};
    // Only then the costly one: which files does any process still map?
    const std::set<uint64_t> mapped = mapped_inodes();
    auto gone =
        attacher.detach_files([&](const capture::AttachedFile& f) { return replaced(f) && !mapped.count(f.inode); });
    for (const auto& f : gone) bpf.forget_known_file(f.dev, f.inode);
    return gone;
}

std::optional<uint32_t> FileShares::owner(FileId f) const {
    auto it = owner_.find(f);
    if (it == owner_.end()) return std::nullopt;
    return it->second;
}

size_t FileShares::held(uint32_t uid) const {
    auto it = held_.find(uid);
    return it == held_.end() ? 0 : it->second;
}

size_t FileShares::room(uint32_t uid) const {
    if (uid == 0) return SIZE_MAX;  // bounded by the kernel's map alone
    const size_t mine = held(uid);
    const size_t left_mine = mine >= per_uid_ ? 0 : per_uid_ - mine;
    const size_t left_others = others_ >= others_max_ ? 0 : others_max_ - others_;
    return std::min(left_mine, left_others);
}

void FileShares::charge(uint32_t uid, FileId f) {
    if (!owner_.emplace(f, uid).second) return;  // charged once, to the first user
    ++held_[uid];
    if (uid != 0) ++others_;
}

void FileShares::uncharge(FileId f) {
    auto it = owner_.find(f);
    if (it == owner_.end()) return;
    const uint32_t uid = it->second;
    owner_.erase(it);
    if (--held_[uid] == 0) held_.erase(uid);
    if (uid != 0) --others_;
}

nlohmann::json FileShares::to_json() const {
    nlohmann::json held = nlohmann::json::object(), refused = nlohmann::json::object();
    nlohmann::json capped_uids = nlohmann::json::array();
    for (const auto& [uid, n] : held_) {
        held[std::to_string(uid)] = n;
        if (capped(uid)) capped_uids.push_back(uid);
    }
    for (const auto& [uid, n] : refused_) refused[std::to_string(uid)] = n;
    return {{"per_uid", per_uid_}, {"others", others_max_}, {"held_by_others", others_}, {"held_by_uid", held},
            {"capped_uids", capped_uids}, {"others_capped", others_capped()}, {"refused_by_uid", refused}};
}

}  // namespace commdbg::daemon
