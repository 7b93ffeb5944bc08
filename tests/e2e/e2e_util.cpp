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

bool in_ci() {
    const char* ci = getenv("CI");
    return ci && std::string(ci) == "true";
}

std::string bpf_unavailable_reason() {
    if (geteuid() != 0) return "needs root (BPF uprobes)";
    if (!std::filesystem::exists("/sys/kernel/btf/vmlinux")) return "kernel has no BTF (/sys/kernel/btf/vmlinux)";
    return {};
}

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int out_w,
            int err_w) {
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(out_w, 1);
        dup2(err_w, 2);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> a;
        for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        execvp(a[0], a.data());
        _exit(127);
    }
    return pid;
}

int to_status(int ws) {
    if (WIFEXITED(ws)) return WEXITSTATUS(ws);
    if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
    return -1;
}

// Reads whatever is available from fds into bufs; returns false when both closed.
bool pump(int fds[2], std::string* bufs[2], int timeout_ms) {
    struct pollfd p[2];
    int n = 0;
    int idx[2];
    for (int i = 0; i < 2; ++i)
        if (fds[i] >= 0) {
            p[n] = {fds[i], POLLIN, 0};
            idx[n++] = i;
        }
    if (n == 0) return false;
    if (::poll(p, n, timeout_ms) <= 0) return true;
    for (int k = 0; k < n; ++k) {
        if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        ssize_t r = read(fds[idx[k]], buf, sizeof(buf));
        if (r > 0) bufs[idx[k]]->append(buf, static_cast<size_t>(r));
        else if (r == 0 || errno != EINTR) {
            close(fds[idx[k]]);
            fds[idx[k]] = -1;
        }
    }
    return true;
}

}  // namespace

ProcResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int timeout_s) {
    Background b(argv, env);
    return b.wait(timeout_s);
}

Background::Background(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    int o[2], e[2];
    if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC)) throw std::runtime_error("pipe");
    pid_ = spawn(argv, env, o[1], e[1]);
    close(o[1]);
    close(e[1]);
    out_fd_ = o[0];
    err_fd_ = e[0];
}

Background::~Background() {
    if (!done_ && pid_ > 0) {
        kill(-pid_, SIGKILL);
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
}

std::string Background::wait_for_line(const std::string& needle, int timeout_s) {
    return wait_for_line_in(out_, needle, timeout_s);
}

std::string Background::wait_for_err_line(const std::string& needle, int timeout_s) {
    return wait_for_line_in(err_, needle, timeout_s);
}

std::string Background::wait_for_line_in(std::string& buf, const std::string& needle, int timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int fds[2] = {out_fd_, err_fd_};
    std::string* bufs[2] = {&out_, &err_};
    while (std::chrono::steady_clock::now() < deadline) {
        size_t pos = buf.find(needle);
        if (pos != std::string::npos) {
            size_t start = buf.rfind('\n', pos);
            start = start == std::string::npos ? 0 : start + 1;
            size_t end = buf.find('\n', pos);
            if (end != std::string::npos) return buf.substr(start, end - start);
        }
        if (!pump(fds, bufs, 50)) break;
        out_fd_ = fds[0];
        err_fd_ = fds[1];
    }
    out_fd_ = fds[0];
    err_fd_ = fds[1];
    return {};
}

ProcResult Background::wait(int timeout_s) {
    if (done_) return result_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int fds[2] = {out_fd_, err_fd_};
    std::string* bufs[2] = {&out_, &err_};
    int ws = 0;
    bool reaped = false;
    while (true) {
        bool open = pump(fds, bufs, 50);
        if (!reaped && waitpid(pid_, &ws, WNOHANG) == pid_) reaped = true;
        if (reaped && !open) break;
        if (std::chrono::steady_clock::now() > deadline) {
            kill(-pid_, SIGKILL);
            kill(pid_, SIGKILL);
            if (!reaped) waitpid(pid_, &ws, 0);
            reaped = true;
            err_ += "\n[e2e: killed after timeout]";
            break;
        }
        if (reaped && open) {
            // Grandchildren may hold the pipes; give them a moment, then stop reading.
            for (int i = 0; i < 20 && pump(fds, bufs, 50);) ++i;
            break;
        }
    }
    out_fd_ = fds[0];
    err_fd_ = fds[1];
    done_ = true;
    result_ = {to_status(ws), out_, err_};
    return result_;
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

std::string commdbg_bin() { return COMMDBG_BIN; }
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

int pid_of_ready(const std::string& line) {
    size_t at = line.find("ready pid=");
    return at == std::string::npos ? -1 : std::stoi(line.substr(at + 10));
}

void touch(const std::string& path) { std::ofstream(path) << "go\n"; }

std::string lib_path(bool real) { return std::string(real ? REAL_NCCL_DIR : STUB_NCCL_DIR) + "/libnccl.so.2"; }

std::string commdbgd_bin() { return std::string(BUILD_DIR) + "/bin/commdbgd"; }

}  // namespace commdbg::e2e
