// SPDX-License-Identifier: Apache-2.0
#include "procfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_set>
#include <utility>

namespace commdbg::host {
namespace {

std::string pid_dir(const std::string& proc_root, int pid) {
    return proc_root + "/" + std::to_string(pid);
}

// Reads a whole /proc file; on failure returns errno (st_size is 0 there, so read to EOF).
int read_file(const std::string& path, std::string& out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    out.clear();
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            return err;
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return 0;
}

// Message for a failed read of /proc/PID/<what>.
std::string read_error(int pid, const std::string& file, int err) {
    std::string p = "pid " + std::to_string(pid) + ": ";
    // ESRCH: the process exited between open and read.
    if (err == ENOENT || err == ESRCH) return p + "no such process — check the pid";
    if (err == EACCES || err == EPERM)
        return p + "permission denied reading " + file + " — " + access_denied_advice(own_creds());
    return p + "cannot read " + file + ": " + std::strerror(err);
}

std::string_view next_field(std::string_view& s) {
    size_t b = s.find_first_not_of(" \t");
    if (b == std::string_view::npos) {
        s = {};
        return {};
    }
    size_t e = s.find_first_of(" \t", b);
    std::string_view f = s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b);
    s = e == std::string_view::npos ? std::string_view{} : s.substr(e);
    return f;
}

template <typename T>
bool parse_num(std::string_view s, T& v, int base) {
    if (s.empty()) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    return ec == std::errc() && p == s.data() + s.size();
}

bool parse_maps_line(std::string_view line, MapEntry& e) {
    std::string_view rest = line;
    std::string_view range = next_field(rest), perms = next_field(rest), off = next_field(rest),
                     dev = next_field(rest), ino = next_field(rest);
    size_t dash = range.find('-'), colon = dev.find(':');
    if (dash == std::string_view::npos || colon == std::string_view::npos) return false;
    if (!parse_num(range.substr(0, dash), e.start, 16) || !parse_num(range.substr(dash + 1), e.end, 16) ||
        !parse_num(off, e.offset, 16) || !parse_num(dev.substr(0, colon), e.dev_major, 16) ||
        !parse_num(dev.substr(colon + 1), e.dev_minor, 16) || !parse_num(ino, e.inode, 10) ||
        perms.size() != 4) {
        return false;
    }
    e.perms = std::string(perms);
    // The path is everything after the padding and may itself contain spaces.
    size_t b = rest.find_first_not_of(' ');
    std::string_view path = b == std::string_view::npos ? std::string_view{} : rest.substr(b);
    constexpr std::string_view kDeleted = " (deleted)";
    e.deleted = path.size() > kDeleted.size() && path.ends_with(kDeleted);
    if (e.deleted) path.remove_suffix(kDeleted.size());
    e.path = std::string(path);
    return true;
}


}  // namespace

std::string_view basename_of(std::string_view path) {
    size_t slash = path.rfind('/');
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::vector<int> numeric_entries(const std::string& dir) {
    std::vector<int> out;
    DIR* d = opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = readdir(d)) {
        int v = 0;
        if (parse_num(e->d_name, v, 10) && v > 0) out.push_back(v);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

namespace {

// live_thread where the main thread's stat is read already.
std::optional<int> live_thread_of(int pid, const Result<ProcStat>& main, const std::string& proc_root) {
    if (main && main->runs()) return pid;
    const std::string tasks = pid_dir(proc_root, pid) + "/task";
    for (int tid : numeric_entries(tasks))
        if (auto st = read_stat(tid, tasks); tid != pid && st && st->runs()) return tid;
    return std::nullopt;
}

}  // namespace

std::optional<int> live_thread(int pid, const std::string& proc_root) {
    if (pid <= 0) return std::nullopt;
    return live_thread_of(pid, read_stat(pid, proc_root), proc_root);
}

namespace {

std::string memory_dir_of(int pid, std::optional<int> live, const std::string& proc_root) {
    if (!live || *live == pid) return pid_dir(proc_root, pid);
    return pid_dir(proc_root, pid) + "/task/" + std::to_string(*live);
}

}  // namespace

std::string memory_dir(int pid, const std::string& proc_root) {
    return memory_dir_of(pid, live_thread(pid, proc_root), proc_root);
}

Result<std::vector<MapEntry>> read_maps(int pid, const std::string& proc_root) {
    using R = Result<std::vector<MapEntry>>;
    std::string file = pid_dir(proc_root, pid) + "/maps";
    std::string text;
    if (pid <= 0) return R::fail(read_error(pid, file, ENOENT));
    if (int err = read_file(file, text)) return R::fail(read_error(pid, file, err));
    // A live process always maps something: empty maps are a main thread
    // that has exited, or a process gone.  The maps of a live thread, then.
    if (text.empty()) {
        if (std::string dir = memory_dir(pid, proc_root); dir != pid_dir(proc_root, pid)) {
            file = dir + "/maps";
            if (int err = read_file(file, text)) return R::fail(read_error(pid, file, err));
        }
    }
    std::vector<MapEntry> out;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        std::string_view line(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
        pos = nl == std::string::npos ? text.size() : nl + 1;
        ++line_no;
        if (line.empty()) continue;
        MapEntry e;
        if (!parse_maps_line(line, e)) {
            return R::fail(file + ":" + std::to_string(line_no) + ": malformed maps line '" +
                           std::string(line) + "'");
        }
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<MappedFile> mapped_files(const std::vector<MapEntry>& maps, int pid,
                                     const std::function<bool(std::string_view path)>& filter,
                                     const std::string& proc_root) {
    std::vector<MappedFile> out;
    std::set<std::pair<uint64_t, uint64_t>> seen;
    std::unordered_set<std::string> tried;  // a library has several mappings; stat it once
    std::string root = memory_dir(pid, proc_root) + "/root";
    for (const MapEntry& e : maps) {
        if (e.path.empty() || e.path[0] != '/') continue;  // [heap], [vdso], anonymous
        if (!tried.insert(e.path).second) continue;
        if (filter && !filter(e.path)) continue;
        MappedFile f;
        f.path = e.path;
        f.deleted = e.deleted;
        struct stat st {};
        char range[64];
        std::snprintf(range, sizeof range, "/map_files/%llx-%llx", static_cast<unsigned long long>(e.start),
                      static_cast<unsigned long long>(e.end));
        // Through /proc/PID/root first, so a containerised process's files
        // resolve in its own mount namespace; then the path as we see it;
        // then map_files (needs root), which reaches the mapped inode
        // whatever its name: a library unlinked since (a reinstall, whose
        // path names a newer file with other offsets), or one mounted where
        // neither name leads (a bind mount in the job's private namespace
        // under a chroot, which maps show from our root).  The first whose
        // inode is the mapping's wins.
        std::vector<std::string> candidates;
        if (!e.deleted) candidates = {root + e.path, e.path};
        candidates.push_back(pid_dir(proc_root, pid) + range);
        f.open_path.clear();
        for (const std::string& c : candidates) {
            struct stat cst {};
            if (::stat(c.c_str(), &cst) != 0) continue;
            if (f.open_path.empty()) f.open_path = c, st = cst;  // the first that exists, failing a match
            if (cst.st_ino == e.inode) {
                f.open_path = c, st = cst;
                break;
            }
        }
        if (f.open_path.empty()) {
            f.open_path = e.deleted ? candidates.back() : e.path;
            st.st_dev = makedev(e.dev_major, e.dev_minor);
            st.st_ino = e.inode;
        }
        f.dev = st.st_dev;
        f.inode = st.st_ino;
        if (!seen.emplace(f.dev, f.inode).second) continue;  // same file under two names
        out.push_back(std::move(f));
    }
    return out;
}

bool is_libnccl_path(std::string_view path) {
    std::string_view base = basename_of(path);
    if (!base.starts_with("libnccl") || base.find(".so") == std::string_view::npos) return false;
    for (std::string_view plugin : {"libnccl-net", "libnccl-tuner", "libnccl-profiler"}) {
        if (base.starts_with(plugin)) return false;
    }
    return true;
}

namespace {

// The rest of the /proc/PID/status line that starts with `key` ("\nUid:"),
// empty when there is none.
std::string_view status_line(const std::string& status, std::string_view key) {
    size_t at = status.find(key);
    if (at == std::string::npos) return {};
    std::string_view line = std::string_view(status).substr(at + key.size());
    return line.substr(0, line.find('\n'));
}

// The four ids of a "\nUid:" or "\nGid:" line.
bool parse_ids(const std::string& status, std::string_view key, std::array<uint32_t, 4>& ids) {
    std::string_view line = status_line(status, key);
    for (uint32_t& id : ids)
        if (!parse_num(next_field(line), id, 10)) return false;
    return true;
}

std::optional<int> parse_tgid(const std::string& status) {
    std::string_view line = status_line(status, "\nTgid:");
    int tgid = 0;
    if (!parse_num(next_field(line), tgid, 10) || tgid <= 0) return std::nullopt;
    return tgid;
}

Result<std::string> read_status(int pid, const std::string& proc_root) {
    using R = Result<std::string>;
    const std::string dir = pid_dir(proc_root, pid), file = dir + "/status";
    if (pid <= 0) return R::fail(read_error(pid, dir, ENOENT));
    std::string text;
    if (int err = read_file(file, text)) return R::fail(read_error(pid, file, err));
    return text;
}

}  // namespace

Result<ProcStat> read_stat(int pid, const std::string& proc_root) {
    using R = Result<ProcStat>;
    const std::string dir = pid_dir(proc_root, pid), stat_file = dir + "/stat";
    if (pid <= 0) return R::fail(read_error(pid, dir, ENOENT));
    std::string text;
    if (int err = read_file(stat_file, text)) return R::fail(read_error(pid, stat_file, err));
    // comm may hold spaces and ')', so it ends at the last ')'.
    size_t open_paren = text.find('('), close_paren = text.rfind(')');
    if (open_paren == std::string::npos || close_paren == std::string::npos || close_paren < open_paren)
        return R::fail(stat_file + ": malformed (no '(comm)')");
    ProcStat st;
    st.comm = text.substr(open_paren + 1, close_paren - open_paren - 1);
    std::string_view rest = std::string_view(text).substr(close_paren + 1);
    // Fields 3.. : state ppid pgrp session tty_nr tpgid flags ... starttime (22)
    std::string_view fields[20];
    for (auto& f : fields) f = next_field(rest);
    if (fields[0].size() != 1 || !parse_num(fields[1], st.ppid, 10) || !parse_num(fields[6], st.flags, 10))
        return R::fail(stat_file + ": malformed (cannot parse state/ppid/flags)");
    if (!fields[19].empty()) (void)parse_num(fields[19], st.start_time, 10);
    uint64_t utime = 0, stime = 0;
    if (parse_num(fields[11], utime, 10) && parse_num(fields[12], stime, 10)) st.cpu_ticks = utime + stime;
    st.state = fields[0][0];
    return st;
}

Result<int> read_tgid(int pid, const std::string& proc_root) {
    auto status = read_status(pid, proc_root);
    if (!status) return Result<int>::fail(status.error());
    if (auto tgid = parse_tgid(*status)) return *tgid;
    return Result<int>::fail(pid_dir(proc_root, pid) + "/status: malformed (no 'Tgid:' line)");
}

Result<ProcessInfo> read_process(int pid, const std::string& proc_root) {
    using R = Result<ProcessInfo>;
    const std::string dir = pid_dir(proc_root, pid);
    auto st = read_stat(pid, proc_root);
    if (!st) return R::fail(st.error());
    ProcessInfo info;
    info.pid = pid;
    info.comm = std::move(st->comm);
    info.ppid = st->ppid;
    info.start_time = st->start_time;
    info.state = st->state;
    info.kernel_thread = st->kernel_thread();
    // A main thread that has exited while others run on is a zombie; the
    // process is what its live threads are.
    auto live = live_thread_of(pid, st, proc_root);
    info.live_tid = live.value_or(0);
    if (live && *live != pid) {
        auto lst = read_stat(*live, pid_dir(proc_root, pid) + "/task");
        if (lst) info.state = lst->state;
    }

    auto status = read_status(pid, proc_root);
    if (!status) return R::fail(status.error());
    std::string_view uid_line = status_line(*status, "\nUid:");
    if (!parse_num(next_field(uid_line), info.uid, 10)) return R::fail(dir + "/status: malformed (no 'Uid:' line)");
    // A thread id names its thread group's /proc entry too: Tgid says whose.
    info.tgid = parse_tgid(*status).value_or(pid);

    std::string cmd;
    std::string cmd_file = memory_dir_of(pid, live, proc_root) + "/cmdline";
    if (int err = read_file(cmd_file, cmd)) return R::fail(read_error(pid, cmd_file, err));
    while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    for (char& c : cmd) {
        if (c == '\0') c = ' ';
    }
    info.cmdline = std::move(cmd);
    return info;
}

Result<ProcessCreds> read_creds(int pid, const std::string& proc_root) {
    using R = Result<ProcessCreds>;
    const std::string dir = pid_dir(proc_root, pid);
    if (pid <= 0) return R::fail(read_error(pid, dir, ENOENT));
    ProcessCreds c;
    auto status = read_status(pid, proc_root);
    if (!status) return R::fail(status.error());
    if (!parse_ids(*status, "\nUid:", c.uids) || !parse_ids(*status, "\nGid:", c.gids))
        return R::fail(dir + "/status: malformed (no 'Uid:' and 'Gid:' lines of four ids)");
    // Not /proc/PID itself: the kernel keeps the directory's owner the
    // effective uid whatever the dumpability; its files change owner.
    struct stat st {};
    const std::string stat_file = dir + "/stat";
    if (::stat(stat_file.c_str(), &st) != 0) return R::fail(read_error(pid, stat_file, errno));
    c.dumpable = st.st_uid == c.uids[1] && st.st_gid == c.gids[1];
    return c;
}

bool may_read_process(const ProcessCreds& t, uint32_t uid, uint32_t gid) {
    if (uid == 0) return true;
    for (int i = 0; i < 3; ++i)
        if (t.uids[i] != uid || t.gids[i] != gid) return false;
    return t.dumpable;
}

std::map<std::string, std::string> read_environ(int pid, const std::vector<std::string>& keys,
                                                const std::string& proc_root) {
    std::map<std::string, std::string> out;
    std::string text;
    if (pid <= 0 || read_file(memory_dir(pid, proc_root) + "/environ", text) != 0) return out;
    std::unordered_set<std::string_view> wanted(keys.begin(), keys.end());
    for (size_t pos = 0; pos < text.size();) {
        size_t nul = text.find('\0', pos);
        std::string_view entry(text.data() + pos, (nul == std::string::npos ? text.size() : nul) - pos);
        pos = nul == std::string::npos ? text.size() : nul + 1;
        size_t eq = entry.find('=');
        if (eq == std::string_view::npos) continue;
        std::string_view key = entry.substr(0, eq);
        if (wanted.count(key)) out.emplace(std::string(key), std::string(entry.substr(eq + 1)));
    }
    return out;
}

std::string read_thread_name(int pid, int tid, const std::string& proc_root) {
    std::string text;
    if (pid <= 0 || tid <= 0 ||
        read_file(pid_dir(proc_root, pid) + "/task/" + std::to_string(tid) + "/comm", text) != 0)
        return "";
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return text;
}

TracerCreds own_creds(const std::string& proc_root) {
    TracerCreds c;
    c.root = geteuid() == 0;
    auto first_line = [](std::string_view s) { return s.substr(0, s.find('\n')); };
    std::string status, uid_map;
    if (size_t at; read_file(proc_root + "/self/status", status) == 0 &&
                   (at = status.find("\nCapEff:")) != std::string::npos) {
        std::string_view rest = first_line(std::string_view(status).substr(at + 8));
        uint64_t eff = 0;
        if (parse_num(next_field(rest), eff, 16)) c.cap_sys_ptrace = (eff >> 19) & 1;  // CAP_SYS_PTRACE
    }
    // The first user namespace maps all 2^32 - 1 ids onto themselves.
    if (read_file(proc_root + "/self/uid_map", uid_map) == 0) {
        std::string_view rest = first_line(uid_map);
        uint64_t inside = 1, outside = 1, count = 0;
        c.initial_userns = parse_num(next_field(rest), inside, 10) && parse_num(next_field(rest), outside, 10) &&
                           parse_num(next_field(rest), count, 10) && inside == 0 && outside == 0 &&
                           count == 4294967295u;
    }
    return c;
}

std::string access_denied_advice(const TracerCreds& c) {
    if (!c.root && !c.cap_sys_ptrace) return "run as root or as the process's user";
    if (!c.cap_sys_ptrace)
        return "commdbg runs as root without CAP_SYS_PTRACE (its container or service drops it), which reading "
               "another user's process needs — grant it (docker --cap-add SYS_PTRACE; systemd: add it to "
               "CapabilityBoundingSet)";
    if (!c.initial_userns)
        return "commdbg runs in a user namespace (a rootless or user-namespaced container): its root has no "
               "privilege over processes outside it — run commdbg on the host or in the process's container";
    return "the kernel refused it although commdbg has CAP_SYS_PTRACE: a security policy protects this process "
           "(a security module such as AppArmor, SELinux, Landlock or Yama's ptrace_scope, or the sandbox "
           "commdbg runs in) — trace it from where that policy allows ptrace access, or allow it there";
}

}  // namespace commdbg::host
