// SPDX-License-Identifier: Apache-2.0
#include "output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace commdbg::host {

namespace {

using Kind = OutputTarget::Kind;

// Less than this free at check time: the output would not fit anyway.
constexpr unsigned long long kMinFreeBytes = 64 * 1024;
constexpr int kMaxSymlinkHops = 40;

std::string errno_text(int e = errno) { return std::strerror(e); }

std::string dir_of(const std::string& p) {
    auto slash = p.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : p.substr(0, slash);
}

// The descriptor a path names in our own process: /dev/stdout, /dev/fd/N,
// /proc/self/fd/N, /proc/<our pid>/fd/N.  Writing to the descriptor itself
// shares its offset with our stdout; opening the magic link anew would
// write at offset 0 of a regular file and the table would overwrite it.
std::optional<int> descriptor_of(const std::string& p) {
    if (p == "/dev/stdout") return 1;
    if (p == "/dev/stderr") return 2;
    for (std::string prefix : {std::string("/dev/fd/"), std::string("/proc/self/fd/"),
                               std::string("/proc/thread-self/fd/"), "/proc/" + std::to_string(getpid()) + "/fd/"}) {
        if (p.rfind(prefix, 0) != 0) continue;
        std::string n = p.substr(prefix.size());
        if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
        return std::stoi(n);
    }
    return std::nullopt;
}

Result<OutputTarget> fail(const OutputTarget& t, const std::string& what) {
    return Result<OutputTarget>::fail(t.option + " " + t.path + ": " + what);
}

// The kernel's protected_symlinks / protected_regular / protected_fifos rule
// (fs/namei.c), applied whatever the sysctls say: in a sticky world-writable
// directory (/tmp) a link, file or FIFO another user planted is used only
// when it is ours or the directory owner's.  Root is no exception: it is
// whom a planted link would make overwrite its own files.
std::optional<std::string> sticky_owner_problem(const std::string& p, const struct stat& st) {
    if (!S_ISLNK(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) return std::nullopt;
    const std::string dir = dir_of(p);
    struct stat dst {};
    if (stat(dir.c_str(), &dst) != 0 || (dst.st_mode & (S_ISVTX | S_IWOTH)) != (S_ISVTX | S_IWOTH))
        return std::nullopt;
    if (st.st_uid == geteuid() || st.st_uid == dst.st_uid) return std::nullopt;
    const char* what = S_ISLNK(st.st_mode) ? "follow a symlink" : S_ISFIFO(st.st_mode) ? "write to a FIFO" : "replace a file";
    return std::string("refusing to ") + what + " owned by uid " + std::to_string(st.st_uid) +
           " in the sticky directory " + dir + " — remove it or pick another path";
}

// Follows the symlinks of t.path to what gets the content.
Result<OutputTarget> resolve(OutputTarget t) {
    std::string p = t.path;
    for (int hop = 0; hop < kMaxSymlinkHops; ++hop) {
        if (auto fd = descriptor_of(p)) {
            t.kind = Kind::Descriptor;
            t.fd = *fd;
            t.resolved = p;
            return t;
        }
        struct stat lst {};
        if (lstat(p.c_str(), &lst) != 0) {
            if (errno != ENOENT) return fail(t, errno_text());
            t.kind = Kind::Replace;  // created at write time
            t.resolved = p;
            return t;
        }
        if (auto problem = sticky_owner_problem(p, lst)) return fail(t, *problem);
        if (!S_ISLNK(lst.st_mode)) {
            t.resolved = p;
            if (S_ISDIR(lst.st_mode))
                return fail(t, "is a directory — give a file name, e.g. " + p + "/commdbg.json");
            t.kind = S_ISREG(lst.st_mode) ? Kind::Replace : Kind::WriteThrough;
            return t;
        }
        // A link inside /proc (another process's fd, pipe:[N], socket:[N])
        // means something only to open(): write through it as it is.
        if (p.rfind("/proc/", 0) == 0) {
            t.kind = Kind::WriteThrough;
            t.resolved = p;
            return t;
        }
        char buf[PATH_MAX];
        ssize_t n = readlink(p.c_str(), buf, sizeof(buf) - 1);
        if (n < 0) return fail(t, "cannot read the symlink " + p + ": " + errno_text());
        std::string target(buf, static_cast<size_t>(n));
        p = target.front() == '/' ? target : dir_of(p) + "/" + target;
    }
    return fail(t, "too many levels of symbolic links");
}

Result<OutputTarget> check_resolved(OutputTarget t) {
    if (t.kind == Kind::Descriptor) {
        int fl = fcntl(t.fd, F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY)
            return fail(t, "descriptor " + std::to_string(t.fd) + " is not open for writing");
        return t;
    }
    if (t.kind == Kind::WriteThrough) {
        if (access(t.resolved.c_str(), W_OK) != 0) return fail(t, "cannot write to " + t.resolved + ": " + errno_text());
        return t;
    }
    const std::string dir = dir_of(t.resolved);
    struct stat dst {};
    if (stat(dir.c_str(), &dst) != 0)
        return fail(t, "directory " + dir + " does not exist — create it or choose another path");
    if (!S_ISDIR(dst.st_mode)) return fail(t, dir + " is not a directory");
    if (access(dir.c_str(), W_OK | X_OK) != 0)
        return fail(t, "cannot create files in " + dir + ": " + errno_text() + " — choose a writable directory");
    if (access(t.resolved.c_str(), F_OK) == 0 && access(t.resolved.c_str(), W_OK) != 0)
        return fail(t, "cannot write to " + t.resolved + ": " + errno_text());
    struct statvfs vfs {};
    if (statvfs(dir.c_str(), &vfs) == 0) {
        unsigned long long avail = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
        if (avail < kMinFreeBytes)
            return fail(t, "the filesystem of " + dir + " is full (" + std::to_string(avail / 1024) +
                               " KiB free) — free some space or choose another path");
    }
    return t;
}

// (dev, inode) of what a target writes to, when it is a regular file.
std::optional<std::pair<dev_t, ino_t>> regular_identity(const OutputTarget& t) {
    struct stat st {};
    int rc = t.kind == Kind::Descriptor ? fstat(t.fd, &st) : stat(t.resolved.c_str(), &st);
    if (rc != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return std::make_pair(st.st_dev, st.st_ino);
}

void write_all(int fd, const std::string& content, const std::string& path) {
    const char* data = content.data();
    size_t left = content.size();
    while (left > 0) {
        ssize_t n = write(fd, data, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw CommdbgError("cannot write " + path + ": " + errno_text(n == 0 ? EIO : errno));
        data += n;
        left -= static_cast<size_t>(n);
    }
}

void replace_atomically(const std::string& path, const std::string& content) {
    const std::string dir = dir_of(path);
    struct stat old {};
    // Planted since check_output (the window is long): not replaced either,
    // nor its mode (0666, say) given to our file.
    if (lstat(path.c_str(), &old) == 0)
        if (auto problem = sticky_owner_problem(path, old)) throw CommdbgError("cannot write " + path + ": " + *problem);
    const mode_t mode = stat(path.c_str(), &old) == 0 ? (old.st_mode & 07777) : 0644;
    std::string tmpl = path + ".tmp.XXXXXX";
    int fd = mkstemp(tmpl.data());
    if (fd < 0) throw CommdbgError("cannot create a temporary file next to " + path + ": " + errno_text());
    auto fail_with = [&](const std::string& msg) {
        close(fd);
        unlink(tmpl.c_str());
        throw CommdbgError(msg);
    };
    try {
        write_all(fd, content, path);
    } catch (const CommdbgError& e) {
        fail_with(e.what());
    }
    // mkstemp makes 0600; a replaced file keeps its mode, a new one is 0644.
    if (fchmod(fd, mode) != 0) fail_with("cannot set the mode of " + path + ": " + errno_text());
    if (fsync(fd) != 0) fail_with("cannot fsync " + path + ": " + errno_text());
    if (close(fd) != 0) {
        std::string msg = "cannot close " + path + ": " + errno_text();
        unlink(tmpl.c_str());
        throw CommdbgError(msg);
    }
    if (rename(tmpl.c_str(), path.c_str()) != 0) {
        std::string msg = "cannot rename " + tmpl + " to " + path + ": " + errno_text();
        unlink(tmpl.c_str());
        throw CommdbgError(msg);
    }
    // Make the rename itself durable; failing to open the directory is not fatal.
    int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

}  // namespace

Result<OutputTarget> check_output(const std::string& option, const std::string& path) {
    OutputTarget t;
    t.option = option;
    t.path = path;
    if (path.empty()) return Result<OutputTarget>::fail(option + " needs a file name (it was empty)");
    auto r = resolve(std::move(t));
    if (!r) return r;
    return check_resolved(std::move(r.value()));
}

Result<std::vector<OutputTarget>> check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
    using R = Result<std::vector<OutputTarget>>;
    std::vector<OutputTarget> out;
    for (const auto& [option, path] : outputs) {
        auto t = check_output(option, path);
        if (!t) return R::fail(t.error());
        for (const auto& prev : out) {
            // Devices and FIFOs take the outputs one after the other; a file
            // named twice would keep only the last.
            auto a = regular_identity(prev), b = regular_identity(*t);
            bool same_new_file = prev.kind == Kind::Replace && t->kind == Kind::Replace && prev.resolved == t->resolved;
            if (same_new_file || (a && b && *a == *b))
                return R::fail(prev.option + " and " + t->option + " name the same file (" + t->resolved +
                               ") — give each output its own path");
        }
        out.push_back(std::move(t.value()));
    }
    return R(std::move(out));
}

void write_output(const OutputTarget& t, const std::string& content) {
    switch (t.kind) {
    case Kind::Descriptor:
        write_all(t.fd, content, t.path);
        return;
    case Kind::WriteThrough: {
        struct stat st {};
        bool fifo = stat(t.resolved.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
        // A FIFO nobody reads would block us forever: ENXIO says so at once.
        int fd = open(t.resolved.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | (fifo ? O_NONBLOCK : 0));
        if (fd < 0) {
            if (errno == ENXIO && fifo) throw CommdbgError("cannot write " + t.path + ": no process reads the FIFO");
            throw CommdbgError("cannot open " + t.path + ": " + errno_text());
        }
        if (fifo) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        try {
            write_all(fd, content, t.path);
        } catch (...) {
            close(fd);
            throw;
        }
        if (close(fd) != 0 && errno != EINTR) throw CommdbgError("cannot close " + t.path + ": " + errno_text());
        return;
    }
    case Kind::Replace:
        replace_atomically(t.resolved, content);
        return;
    }
}

void write_file_atomic(const std::string& path, const std::string& content) {
    auto t = check_output("output", path);
    if (!t) throw CommdbgError(t.error());
    write_output(*t, content);
}

Result<std::string> save_fallback(const std::string& stem, const std::string& ext, const std::string& content) {
    const char* tmp = getenv("TMPDIR");
    std::vector<std::string> dirs;
    if (tmp && *tmp) dirs.emplace_back(tmp);
    dirs.emplace_back("/tmp");
    dirs.emplace_back("/var/tmp");
    std::string last_error;
    for (const auto& d : dirs) {
        std::string path = d + "/commdbg-" + std::to_string(getpid()) + "-" + stem + "." + ext;
        try {
            write_file_atomic(path, content);
            return path;
        } catch (const CommdbgError& e) {
            last_error = e.what();
        }
    }
    return Result<std::string>::fail(last_error);
}

}  // namespace commdbg::host
