// SPDX-License-Identifier: Apache-2.0
#include "e2e_util.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace commdbg::e2e {

std::string trixie_root() {
    const char* env = std::getenv("COMMDBG_TRIXIE_ROOT");
    return env && *env ? env : "/var/cache/commdbg/trixie-root";
}

std::string trixie_unavailable_reason(const std::string& root) {
    static std::map<std::string, std::string> checked;
    if (auto it = checked.find(root); it != checked.end()) return it->second;
    std::string why;
    if (geteuid() != 0) {
        why = "needs root (mount, chroot)";
    } else if (!std::filesystem::exists(root + "/.commdbg-trixie-root")) {
        why = "no trixie root at " + root + " (build it: make trixie-root, or " + kRootScript + " " + root + ")";
    } else if (run({kRootScript, "--check", root}, {}, 120).status != 0) {
        why = "the trixie root at " + root + " fails its health check (rebuild: " + kRootScript + " " + root + ")";
    }
    return checked[root] = why;
}

std::string bpf_unavailable_reason() {
    if (geteuid() != 0) return "needs root (BPF uprobes)";
    if (!std::filesystem::exists("/sys/kernel/btf/vmlinux")) return "kernel has no BTF (/sys/kernel/btf/vmlinux)";
    return {};
}

TempDir::TempDir() {
    char tmpl[] = "/tmp/commdbg-e2e-XXXXXX";
    dir_ = mkdtemp(tmpl);
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    return nlohmann::json::parse(in);
}

// COMMDBG_TEST_BIN_DIR runs the suite against another build's binaries (to
// show a test fails on the code before a fix), with this build's workloads.
std::string commdbg_bin() {
    const char* dir = getenv("COMMDBG_TEST_BIN_DIR");
    return dir && *dir ? std::string(dir) + "/commdbg" : std::string(COMMDBG_BIN);
}
std::string testprog(const std::string& name) { return std::string(TESTPROG_DIR) + "/" + name; }

std::map<std::string, std::string> nccl_env(bool real) {
    return {{"LD_LIBRARY_PATH", real ? REAL_NCCL_DIR : STUB_NCCL_DIR}};
}

char proc_state(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    if (!in || !std::getline(in, stat)) return 0;
    size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) return 0;
    return stat[paren + 2];
}

bool wait_proc_state(int pid, char state, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
        if (proc_state(pid) == state) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return proc_state(pid) == state;
}

bool wait_gone_or_zombie(int pid, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        char st = proc_state(pid);
        if (st == 0 || st == 'Z' || st == 'X') return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

int count_links_of_programs(const std::vector<std::string>& names) {
    auto r = run({"bpftool", "-j", "link", "show"});
    if (r.status != 0) return -1;
    auto links = nlohmann::json::parse(r.out, nullptr, false);
    if (!links.is_array()) return -1;
    // Map link -> program name through `bpftool prog show`.
    auto p = run({"bpftool", "-j", "prog", "show"});
    auto progs = nlohmann::json::parse(p.out, nullptr, false);
    std::map<int, std::string> prog_name;
    if (progs.is_array())
        for (const auto& pr : progs)
            if (pr.contains("id") && pr.contains("name")) prog_name[pr["id"].get<int>()] = pr["name"].get<std::string>();
    int n = 0;
    for (const auto& l : links) {
        if (!l.contains("prog_id")) continue;
        auto it = prog_name.find(l["prog_id"].get<int>());
        if (it == prog_name.end()) continue;
        for (const auto& want : names)
            if (it->second == want) ++n;
    }
    return n;
}

int free_loopback_port() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

std::vector<std::pair<int, char>> children_of(int ppid) {
    std::vector<std::pair<int, char>> out;
    DIR* d = opendir("/proc");
    if (!d) return out;
    while (dirent* e = readdir(d)) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
        std::string stat;
        if (!std::getline(in, stat)) continue;
        size_t paren = stat.rfind(')');
        if (paren == std::string::npos) continue;
        std::istringstream rest(stat.substr(paren + 2));
        char state;
        int parent = 0;
        rest >> state >> parent;
        if (parent == ppid) out.emplace_back(pid, state);
    }
    closedir(d);
    return out;
}

std::string pattern_arg(const std::vector<std::pair<std::string, int>>& pattern) {
    std::string s;
    for (const auto& [k, n] : pattern) s += (s.empty() ? "" : ",") + k + "=" + std::to_string(n);
    return s;
}

nlohmann::json workload_report(const std::string& out) {
    size_t at = out.rfind("{\"pid\"");
    if (at == std::string::npos) return nlohmann::json();
    std::string line = out.substr(at);
    return nlohmann::json::parse(line.substr(0, line.find('\n')), nullptr, false);
}

std::vector<nlohmann::json> workload_lines(const std::string& out, const std::string& key) {
    std::vector<nlohmann::json> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] != '{' || line.find("\"" + key + "\"") == std::string::npos) continue;
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded()) v.push_back(std::move(j));
    }
    return v;
}

std::vector<nlohmann::json> processes_of(const nlohmann::json& dump) {
    if (dump.contains("processes")) return dump["processes"].get<std::vector<nlohmann::json>>();
    return {dump};
}

const nlohmann::json* process_by_pid(const std::vector<nlohmann::json>& ps, int pid) {
    for (const auto& p : ps)
        if (p["process"]["pid"].get<int>() == pid) return &p;
    return nullptr;
}

::testing::AssertionResult wait_tracing(Background& dbg, std::string* line, int timeout_s) {
    std::string tracing = dbg.wait_for_err_line("commdbg: tracing", timeout_s);
    if (line) *line = tracing;
    if (!tracing.empty()) return ::testing::AssertionSuccess();
    auto r = dbg.wait(5);
    return ::testing::AssertionFailure() << "commdbg never said it was tracing; status " << r.status
                                         << " stderr: " << r.err;
}

int pid_of_ready(const std::string& line) {
    size_t at = line.find("ready pid=");
    return at == std::string::npos ? -1 : std::stoi(line.substr(at + 10));
}

void touch(const std::string& path) { std::ofstream(path) << "go\n"; }

std::string lib_path(bool real) { return std::string(real ? REAL_NCCL_DIR : STUB_NCCL_DIR) + "/libnccl.so.2"; }

std::string commdbgd_bin() {
    const char* dir = getenv("COMMDBG_TEST_BIN_DIR");
    return dir && *dir ? std::string(dir) + "/commdbgd" : std::string(BUILD_DIR) + "/bin/commdbgd";
}

namespace {

// The first python3 that runs `check` with exit 0.
std::string python_that(const std::string& check, std::string& why_not) {
    for (const char* py : {"python3", "/usr/bin/python3"}) {
        auto r = run({py, "-c", check}, {}, 60);
        if (r.status == 0) return py;
        why_not += std::string("\n  ") + py + ": " +
                   (r.err.empty() ? "exit " + std::to_string(r.status) : r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1));
    }
    return {};
}

}  // namespace

std::string torch_python(std::string& why_not) {
    return python_that("import torch, torch.distributed as d; assert d.is_gloo_available()", why_not);
}

std::string cuda_torch_python(std::string& why_not) {
    return python_that("import torch, torch.distributed as d\n"
                       "assert torch.cuda.is_available(), 'torch sees no CUDA device'\n"
                       "assert d.is_nccl_available(), 'torch has no NCCL'",
                       why_not);
}

}  // namespace commdbg::e2e
