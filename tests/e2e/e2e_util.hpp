// SPDX-License-Identifier: Apache-2.0
// Helpers for tests that run commdbg for real: root, BPF, real uprobes.
// Without them the tests skip with the reason, except under CI=true, where a
// missing capability is a failure: CI runs as root and must exercise BPF.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "test_proc.hpp"

namespace commdbg::e2e {

// Empty when BPF tracing can run here, else why not.
std::string bpf_unavailable_reason();
using testproc::in_ci;

#define REQUIRE_BPF() REQUIRE_NO_REASON(::commdbg::e2e::bpf_unavailable_reason())

// Real NCCL present?  Under CI a missing real library is a failure too:
// the acceptance tests name it.
#define REQUIRE_REAL_NCCL()                                                        \
    REQUIRE_OR_SKIP(std::filesystem::exists(REAL_NCCL_DIR "/libnccl.so.2"),        \
                    "no real NCCL at " REAL_NCCL_DIR "/libnccl.so.2")

// ---- the trixie root: Debian trixie's python 3.13 and torch 2.6 in another root
// (tests/trixie_root.sh, `make trixie-root`), jobs run chrooted through
// tests/trixie_run.sh as a containerised job runs, the profiler on the host.
inline const std::string kRootScript = std::string(SOURCE_DIR) + "/tests/trixie_root.sh";
inline const std::string kRunScript = std::string(SOURCE_DIR) + "/tests/trixie_run.sh";
// The workload directory, bound read-only into the root at kInRoot: the
// shared cached root is never written to by a test.
inline const std::string kTestprogs = std::string(SOURCE_DIR) + "/tests/testprogs";
inline const std::string kInRoot = "/opt/commdbg-testprogs";
// What the root needs of a gloo job: Debian's torch 2.6 is built without
// libuv (the TCP store's default there), and the root has no /etc/hosts
// entry for the host name gloo would resolve.
inline const std::map<std::string, std::string> kRootJobEnv = {{"USE_LIBUV", "0"}, {"GLOO_SOCKET_IFNAME", "lo"}};
// $COMMDBG_TRIXIE_ROOT, else the default of tests/trixie_root.sh and the Makefile.
std::string trixie_root();
// Empty when jobs can run in `root`, else why not (its health check runs
// once per root and test binary: it takes seconds).
std::string trixie_unavailable_reason(const std::string& root);
#define REQUIRE_TRIXIE_ROOT(root) REQUIRE_NO_REASON(::commdbg::e2e::trixie_unavailable_reason(root))

// A python3 that imports torch with gloo: PATH's first python3 may be another
// one (pyenv) than the Debian interpreter python3-torch installs into.  Empty
// when none does, `why_not` then says what each printed.
std::string torch_python(std::string& why_not);
#define REQUIRE_TORCH(py)                                                                         \
    std::string py;                                                                               \
    do {                                                                                          \
        std::string why_;                                                                         \
        py = ::commdbg::e2e::torch_python(why_);                                                  \
        REQUIRE_OR_SKIP(!py.empty(), "no python3 imports torch with gloo (apt install python3-torch):" + why_); \
    } while (0)

// A python3 whose torch sees a CUDA device and has NCCL (the device machine's
// image).  Empty when none does, `why_not` then says what each printed.
std::string cuda_torch_python(std::string& why_not);
// No GPU is a skip even under CI=true: CI machines have none, and these
// tests are run on a GPU machine by hand (docs/hang.md says how).
#define REQUIRE_CUDA_TORCH(py)                                                              \
    std::string py;                                                                         \
    do {                                                                                    \
        std::string why_;                                                                   \
        py = ::commdbg::e2e::cuda_torch_python(why_);                                       \
        if (py.empty()) GTEST_SKIP() << "no GPU: no python3 here runs torch on CUDA with NCCL:" << why_; \
    } while (0)

using testproc::Background;
using testproc::ProcResult;
using testproc::run;

class TempDir {
public:
    TempDir();
    ~TempDir();
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

private:
    std::filesystem::path dir_;
};

nlohmann::json read_json(const std::string& path);

std::string commdbg_bin();
std::string testprog(const std::string& name);
// LD_LIBRARY_PATH for the stub or the real libnccl.so.2.
std::map<std::string, std::string> nccl_env(bool real);

// /proc/PID/stat state letter ('R', 'S', 'T', 'Z', ...), or 0 when the pid is gone.
char proc_state(int pid);
// Polls until PID is gone or a zombie (works for processes that are not our
// children); false after timeout_ms.
bool wait_gone_or_zombie(int pid, int timeout_ms);
// Polls until proc_state(pid) == state; false after timeout_ms.
bool wait_proc_state(int pid, char state, int timeout_ms);

// BPF links of ours still present (bpftool link show), by program name.
int count_links_of_programs(const std::vector<std::string>& names);

// A loopback TCP port nobody listens on now (the kernel's pick for port 0).
int free_loopback_port();

// Pids whose parent is `ppid` (scan of /proc/*/stat), with their state.
std::vector<std::pair<int, char>> children_of(int ppid);

// The workload's --calls argument for a pattern: "all_reduce=13,broadcast=7".
std::string pattern_arg(const std::vector<std::pair<std::string, int>>& pattern);
// nccl_workload's final line: {"pid":..,"calls":{..},"errors":..,"rounds":..}; null if none.
nlohmann::json workload_report(const std::string& out);
// The JSON lines of a workload's stdout that hold `key` (a torch workload's
// plan and per-rank lines), in order; other lines are skipped.
std::vector<nlohmann::json> workload_lines(const std::string& out, const std::string& key);
// The per-process objects of a dump: {"processes": [...]} or the one object.
std::vector<nlohmann::json> processes_of(const nlohmann::json& dump);
const nlohmann::json* process_by_pid(const std::vector<nlohmann::json>& ps, int pid);
// The torch tests' per-rank preamble: for each rank line a workload printed
// (with "rank" and "pid"), `check(rank, process)` on that rank's process in
// the dump, under a SCOPED_TRACE naming rank and pid.  A rank the dump lacks
// fails the test ("rank not followed") and the others are still checked.
template <typename Check>
void for_each_rank_process(const std::vector<nlohmann::json>& ps, const std::vector<nlohmann::json>& ranks,
                           Check&& check) {
    for (const auto& rank : ranks) {
        const int pid = rank["pid"].get<int>();
        SCOPED_TRACE("rank " + rank["rank"].dump() + " pid " + std::to_string(pid));
        const nlohmann::json* p = process_by_pid(ps, pid);
        if (!p) {
            ADD_FAILURE() << "rank not followed: pid " << pid << " is not in the dump";
            continue;
        }
        check(rank, *p);
    }
}
// The pid in nccl_workload's "ready pid=N" line, or -1.
int pid_of_ready(const std::string& line);
// Waits up to timeout_s for a session's "commdbg: tracing" line (into
// `line`); a failure with commdbg's exit status and stderr when it never came.
::testing::AssertionResult wait_tracing(Background& dbg, std::string* line = nullptr, int timeout_s = 60);
// Creates `path` (the workload's --wait-file).
void touch(const std::string& path);
// The stub's or the real libnccl.so.2.
std::string lib_path(bool real);
std::string commdbgd_bin();

}  // namespace commdbg::e2e
