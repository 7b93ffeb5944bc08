// SPDX-License-Identifier: Apache-2.0
// Readers over /proc.  Every function takes the proc root so tests can point
// them at a fake tree.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "result.hpp"

namespace commdbg::host {

// One line of /proc/PID/maps.
struct MapEntry {
    uint64_t start = 0;
    uint64_t end = 0;
    std::string perms;  // "r-xp"
    uint64_t offset = 0;
    uint32_t dev_major = 0;
    uint32_t dev_minor = 0;
    uint64_t inode = 0;
    std::string path;  // may be empty, "[heap]", or contain spaces; " (deleted)" removed
    bool deleted = false;
};

// The numbered entries of a directory (/proc's pids, /proc/PID/task's
// tids), ascending; empty when it cannot be read.
std::vector<int> numeric_entries(const std::string& dir);

// A thread of process `pid` through which the kernel still reaches its
// memory: `pid` itself, unless its main thread has exited while others run
// on (pthread_exit in main).  The kernel then keeps the main thread a zombie
// without memory: /proc/PID/maps reads empty, /proc/PID/{mem,root,exe,
// environ,cmdline} and process_vm_readv(PID) fail, and /proc/PID/stat says
// Z.  Then the first other thread not exiting; nullopt when there is none
// (the process has exited, or is exiting).
std::optional<int> live_thread(int pid, const std::string& proc_root = "/proc");

// The /proc directory through which process `pid`'s memory and files are
// seen: <proc_root>/PID, or <proc_root>/PID/task/TID of live_thread where
// that is another thread.
std::string memory_dir(int pid, const std::string& proc_root = "/proc");

// Its mappings; through a live thread where the main thread has exited.
Result<std::vector<MapEntry>> read_maps(int pid, const std::string& proc_root = "/proc");

// A file mapped into a process, and where this process can open it.
struct MappedFile {
    std::string path;       // as the target process sees it
    // <memory_dir>/root<path> when that exists, else path; for a deleted
    // file <proc_root>/<pid>/map_files/<start>-<end> (opening it needs root).
    std::string open_path;
    uint64_t dev = 0;       // st_dev of open_path (maps' device when stat fails)
    uint64_t inode = 0;
    bool deleted = false;   // unlinked since mapping; open_path may not open
};

// Distinct files (by dev+inode, first mapping first) whose path passes `filter`.
// Pseudo-mappings ([heap], anonymous) are never passed to the filter.
std::vector<MappedFile> mapped_files(const std::vector<MapEntry>& maps, int pid,
                                     const std::function<bool(std::string_view path)>& filter,
                                     const std::string& proc_root = "/proc");

// The file name of a path: what follows its last '/'.
std::string_view basename_of(std::string_view path);

// True for the NCCL core library (libnccl.so, libnccl.so.2.21.5, ...), false for
// its net/tuner/profiler plugins, which export no ncclX API.
bool is_libnccl_path(std::string_view path);

// What commdbg's own credentials say about a read of another process the
// kernel refused (its ptrace access check: /proc/PID/maps, process memory).
struct TracerCreds {
    bool root = false;            // effective uid 0
    bool cap_sys_ptrace = false;  // CAP_SYS_PTRACE in the effective set
    bool initial_userns = true;   // in the machine's first user namespace
};
TracerCreds own_creds(const std::string& proc_root = "/proc");
// The cause and the way out for such a refusal, as those credentials allow
// it: "run as root" only when commdbg is not root.
std::string access_denied_advice(const TracerCreds& c);

// What commdbg reads of /proc/PID/stat.
struct ProcStat {
    std::string comm;         // may hold spaces and ')'
    char state = '?';         // R, S, D, Z, ...
    int ppid = 0;
    uint64_t flags = 0;       // the kernel's PF_* flags (field 9)
    uint64_t start_time = 0;  // clock ticks after boot (field 22); 0 when the line is cut short
    uint64_t cpu_ticks = 0;   // user + system time in clock ticks (fields 14, 15): of the thread for /proc/TID
    bool kernel_thread() const { return (flags & 0x00200000) != 0; }  // PF_KTHREAD
    bool exiting() const { return (flags & 0x4) != 0; }               // PF_EXITING: past the start of do_exit
    bool runs() const { return state != 'Z' && state != 'X' && !exiting(); }  // neither exited nor exiting
};

// Fails with "no such process" or "permission denied" messages a user can
// act on, or names the file when it is malformed.
Result<ProcStat> read_stat(int pid, const std::string& proc_root = "/proc");

// The thread group of a task id (a process's pid is its own), from
// /proc/PID/status's Tgid line; fails as read_stat does, or when there is no
// such line.
Result<int> read_tgid(int pid, const std::string& proc_root = "/proc");

struct ProcessInfo {
    int pid = 0;
    int ppid = 0;
    uint32_t uid = 0;         // real uid
    std::string comm;
    std::string cmdline;      // arguments joined by spaces; empty for kernel threads
    bool kernel_thread = false;
    // R, S, D, Z, ...: of live_tid where the main thread has exited and
    // others run on, so Z means the process is gone.
    char state = '?';
    int live_tid = 0;         // live_thread: pid, another thread, or 0 for none
    int tgid = 0;             // == pid for a process; its process's pid for a thread id
    uint64_t start_time = 0;  // clock ticks after boot (stat field 22): (pid, start_time) names one process
};

// Fails with "no such process" or "permission denied" messages a user can act on.
Result<ProcessInfo> read_process(int pid, const std::string& proc_root = "/proc");

// Who a process is to the kernel's ptrace rule: its ids and dumpability.
struct ProcessCreds {
    std::array<uint32_t, 4> uids{};  // real, effective, saved, filesystem (status "Uid:")
    std::array<uint32_t, 4> gids{};  // the same for "Gid:"
    // False after exec of a set-uid/set-gid program or prctl(PR_SET_DUMPABLE, 0):
    // the kernel then gives /proc/PID/stat to root instead of the effective uid.
    // Always true when the effective uid is root's: only root may read it anyway.
    bool dumpable = true;
};

Result<ProcessCreds> read_creds(int pid, const std::string& proc_root = "/proc");

// The kernel's rule for reading another process's memory (ptrace_may_access,
// PTRACE_MODE_READ / ATTACH with real creds, as process_vm_readv checks it):
// root, or a caller whose uid is the target's real, effective and saved uid,
// whose gid is its real, effective and saved gid, and a dumpable target.
bool may_read_process(const ProcessCreds& target, uint32_t uid, uint32_t gid);

// The environment of `pid`, restricted to `keys` (first definition wins).
// Empty when it cannot be read: environ needs the same uid or root.
std::map<std::string, std::string> read_environ(int pid, const std::vector<std::string>& keys,
                                                const std::string& proc_root = "/proc");

// A thread's name (/proc/PID/task/TID/comm, as pthread_setname_np sets it);
// empty when it cannot be read (the thread is gone).
std::string read_thread_name(int pid, int tid, const std::string& proc_root = "/proc");

}  // namespace commdbg::host
