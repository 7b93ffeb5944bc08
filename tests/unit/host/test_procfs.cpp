// SPDX-License-Identifier: Apache-2.0
// procfs readers on a fake /proc tree written here, and on this test's own process.
#include <gtest/gtest.h>
#include <grp.h>
#include <signal.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include "procfs.hpp"

namespace fs = std::filesystem;
using namespace commdbg;
using namespace commdbg::host;
using namespace std::string_literals;

namespace {

void write_file(const fs::path& p, const std::string& data) {
    fs::create_directories(p.parent_path());
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

class FakeProc : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/commdbg_proc_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        root_ = tmpl;
        proc_ = root_ + "/proc";
        files_ = root_ + "/files";
        fs::create_directories(files_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    std::string root_, proc_, files_;
};

constexpr const char* kMaps =
    "55d0a0000000-55d0a0001000 r--p 00000000 08:01 131 /usr/bin/python3.11\n"
    "7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n"
    "7f1000000000-7f1000200000 r-xp 00010000 fd:02 4242                       /opt/my libs/libnccl.so.2\n"
    "7f2000000000-7f2000001000 r-xp 00002000 103:0a 77 /usr/lib/libold.so (deleted)\n"
    "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n";

TEST_F(FakeProc, MapsParsesPathsWithSpacesDeletedAndPseudoEntries) {
    write_file(proc_ + "/100/maps", kMaps);
    auto maps = read_maps(100, proc_);
    ASSERT_TRUE(maps.ok()) << maps.error();
    ASSERT_EQ(maps->size(), 5u);
    const MapEntry& py = (*maps)[0];
    EXPECT_EQ(py.start, 0x55d0a0000000u);
    EXPECT_EQ(py.end, 0x55d0a0001000u);
    EXPECT_EQ(py.perms, "r--p");
    EXPECT_EQ(py.dev_major, 8u);
    EXPECT_EQ(py.dev_minor, 1u);
    EXPECT_EQ(py.inode, 131u);
    EXPECT_EQ(py.path, "/usr/bin/python3.11");
    EXPECT_EQ((*maps)[1].path, "");
    const MapEntry& nccl = (*maps)[2];
    EXPECT_EQ(nccl.path, "/opt/my libs/libnccl.so.2");
    EXPECT_EQ(nccl.offset, 0x10000u);
    EXPECT_EQ(nccl.dev_major, 0xfdu);
    EXPECT_EQ(nccl.dev_minor, 2u);
    EXPECT_FALSE(nccl.deleted);
    const MapEntry& old = (*maps)[3];
    EXPECT_EQ(old.path, "/usr/lib/libold.so");
    EXPECT_TRUE(old.deleted);
    EXPECT_EQ(old.dev_major, 0x103u);
    EXPECT_EQ(old.dev_minor, 0xau);
    EXPECT_EQ((*maps)[4].path, "[stack]");
}

TEST_F(FakeProc, MapsOfMissingPidSaysNoSuchProcess) {
    auto maps = read_maps(4242, proc_);
    ASSERT_FALSE(maps.ok());
    EXPECT_NE(maps.error().find("no such process"), std::string::npos) << maps.error();
    EXPECT_NE(maps.error().find("4242"), std::string::npos) << maps.error();
}

TEST_F(FakeProc, MalformedMapsLineIsAnErrorNamingTheLine) {
    write_file(proc_ + "/100/maps", "7f00-7f01 r-xp 0 08:01 1 /a\nthis is not a maps line\n");
    auto maps = read_maps(100, proc_);
    ASSERT_FALSE(maps.ok());
    EXPECT_NE(maps.error().find(":2:"), std::string::npos) << maps.error();
}

TEST_F(FakeProc, MappedFilesDedupsByInodeFiltersAndFallsBackToPlainPath) {
    std::string a = files_ + "/libnccl.so.2", link = files_ + "/libnccl.so", b = files_ + "/libc.so.6";
    write_file(a, "x");
    write_file(b, "y");
    fs::create_hard_link(a, link);  // same inode, second name
    std::string maps_text = "1000-2000 r--p 00000000 00:00 5 " + a + "\n" +
                            "2000-3000 r-xp 00001000 00:00 5 " + a + "\n" +
                            "3000-4000 r-xp 00000000 00:00 5 " + link + "\n" +
                            "4000-5000 r-xp 00000000 00:00 6 " + b + "\n" +
                            "5000-6000 rw-p 00000000 00:00 0 [heap]\n";
    write_file(proc_ + "/7/maps", maps_text);
    auto maps = read_maps(7, proc_);
    ASSERT_TRUE(maps.ok()) << maps.error();

    auto all = mapped_files(*maps, 7, [](std::string_view) { return true; }, proc_);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].path, a);
    EXPECT_EQ(all[0].open_path, a) << "no <proc>/7/root: falls back to the path itself";
    struct stat st {};
    ASSERT_EQ(stat(a.c_str(), &st), 0);
    EXPECT_EQ(all[0].dev, st.st_dev);
    EXPECT_EQ(all[0].inode, st.st_ino);
    EXPECT_EQ(all[1].path, b);

    auto nccl = mapped_files(*maps, 7, is_libnccl_path, proc_);
    ASSERT_EQ(nccl.size(), 1u);
    EXPECT_EQ(nccl[0].path, a);
}

TEST_F(FakeProc, MappedFilesOpensThroughTheProcessRoot) {
    // <proc>/7/root stands in for another mount namespace: the file exists only there.
    fs::create_directories(proc_ + "/7");
    fs::create_directory_symlink(files_, proc_ + "/7/root");
    write_file(files_ + "/opt/libnccl.so.2", "x");
    write_file(proc_ + "/7/maps", "1000-2000 r-xp 00000000 00:00 5 /opt/libnccl.so.2\n");
    auto maps = read_maps(7, proc_);
    ASSERT_TRUE(maps.ok()) << maps.error();
    auto files = mapped_files(*maps, 7, is_libnccl_path, proc_);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0].path, "/opt/libnccl.so.2");
    EXPECT_EQ(files[0].open_path, proc_ + "/7/root/opt/libnccl.so.2");
}

TEST_F(FakeProc, DeletedMappingIsNotResolvedToANewFileAtTheSamePath) {
    // The library was replaced on disk: the path now names a different file.
    std::string lib = files_ + "/libnccl.so.2";
    write_file(lib, "new");
    write_file(proc_ + "/7/maps", "1000-2000 r-xp 00000000 08:01 99 " + lib + " (deleted)\n");
    auto maps = read_maps(7, proc_);
    ASSERT_TRUE(maps.ok()) << maps.error();
    auto files = mapped_files(*maps, 7, is_libnccl_path, proc_);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_TRUE(files[0].deleted);
    EXPECT_EQ(files[0].open_path, proc_ + "/7/map_files/1000-2000");
    EXPECT_EQ(files[0].inode, 99u);
}

TEST(ProcfsNames, LibncclCoreMatchesButPluginsDoNot) {
    EXPECT_TRUE(is_libnccl_path("/usr/local/cuda/lib64/libnccl.so.2"));
    EXPECT_TRUE(is_libnccl_path("/x/libnccl.so"));
    EXPECT_TRUE(is_libnccl_path("libnccl.so.2.21.5"));
    EXPECT_TRUE(is_libnccl_path("/opt/my dir/libnccl.so.2"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libnccl-net.so"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libnccl-net-ofi.so"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libnccl-tuner.so"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libnccl-profiler-inspector.so"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libnccl_static.a"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libncclx/libc.so.6"));
    EXPECT_FALSE(is_libnccl_path("/usr/lib/libc.so.6"));
    EXPECT_FALSE(is_libnccl_path(""));
}

std::string stat_line(int pid, const std::string& comm, char state, int ppid, unsigned long flags) {
    return std::to_string(pid) + " (" + comm + ") " + state + " " + std::to_string(ppid) + " 0 0 0 -1 " +
           std::to_string(flags) + " 0 0 0 0 0 0 0 0 20 0 1 0 9 0 0\n";
}

TEST_F(FakeProc, ProcessWithSpacesAndParensInComm) {
    write_file(proc_ + "/300/stat", stat_line(300, "py (worker) 1", 'S', 12, 0x400100));
    write_file(proc_ + "/300/status", "Name:\tpy\nState:\tS\nUid:\t1000\t1000\t1000\t1000\nGid:\t5\n");
    write_file(proc_ + "/300/cmdline", "python3\0train.py\0--lr\0001e-3\0"s);
    auto p = read_process(300, proc_);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_EQ(p->pid, 300);
    EXPECT_EQ(p->comm, "py (worker) 1");
    EXPECT_EQ(p->state, 'S');
    EXPECT_EQ(p->ppid, 12);
    EXPECT_EQ(p->uid, 1000u);
    EXPECT_EQ(p->cmdline, "python3 train.py --lr 1e-3");
    EXPECT_FALSE(p->kernel_thread);
}

// pthread_exit in main while others run on: the main thread is a zombie
// without memory (its maps empty, its cmdline and environ unreadable); the
// process is seen through its first thread that is not exiting.
TEST_F(FakeProc, AProcessWhoseMainThreadExitedIsSeenThroughALiveThread) {
    const unsigned long exiting = 0x400104;  // PF_EXITING (0x4)
    write_file(proc_ + "/400/stat", stat_line(400, "job", 'Z', 1, exiting));
    write_file(proc_ + "/400/status", "Name:\tjob\nTgid:\t400\nUid:\t0\t0\t0\t0\n");
    write_file(proc_ + "/400/cmdline", "");
    write_file(proc_ + "/400/maps", "");
    write_file(proc_ + "/400/task/400/stat", stat_line(400, "job", 'Z', 1, exiting));
    write_file(proc_ + "/400/task/401/stat", stat_line(401, "job", 'R', 1, exiting));  // exiting too
    write_file(proc_ + "/400/task/402/stat", stat_line(402, "worker", 'S', 1, 0x400040));
    write_file(proc_ + "/400/task/402/cmdline", "./job\0--go\0"s);
    write_file(proc_ + "/400/task/402/environ", "RANK=3\0"s);
    write_file(proc_ + "/400/task/402/maps",
               "7f1000000000-7f1000200000 r-xp 00010000 fd:02 4242 /opt/libnccl.so.2\n");
    EXPECT_EQ(live_thread(400, proc_), 402);
    EXPECT_EQ(memory_dir(400, proc_), proc_ + "/400/task/402");
    auto maps = read_maps(400, proc_);
    ASSERT_TRUE(maps.ok()) << maps.error();
    ASSERT_EQ(maps->size(), 1u);
    EXPECT_EQ((*maps)[0].path, "/opt/libnccl.so.2");
    auto p = read_process(400, proc_);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_EQ(p->state, 'S') << "its live thread's state, not the main thread's Z";
    EXPECT_EQ(p->live_tid, 402);
    EXPECT_EQ(p->cmdline, "./job --go");
    EXPECT_EQ(read_environ(400, {"RANK"}, proc_).at("RANK"), "3");

    // Every thread exited or exiting: the process is gone, and says Z.
    write_file(proc_ + "/400/task/402/stat", stat_line(402, "worker", 'X', 1, exiting));
    EXPECT_FALSE(live_thread(400, proc_).has_value());
    EXPECT_EQ(memory_dir(400, proc_), proc_ + "/400");
    auto gone = read_process(400, proc_);
    ASSERT_TRUE(gone.ok()) << gone.error();
    EXPECT_EQ(gone->state, 'Z');
    EXPECT_EQ(gone->live_tid, 0);
    auto empty = read_maps(400, proc_);
    ASSERT_TRUE(empty.ok()) << empty.error();
    EXPECT_TRUE(empty->empty());
}

// A process whose main thread runs is its own: its tasks are not looked at.
TEST_F(FakeProc, AProcessWhoseMainThreadRunsIsItsOwnLiveThread) {
    write_file(proc_ + "/410/stat", stat_line(410, "job", 'S', 1, 0x400100));
    write_file(proc_ + "/410/task/411/stat", "garbage");
    EXPECT_EQ(live_thread(410, proc_), 410);
    EXPECT_EQ(memory_dir(410, proc_), proc_ + "/410");
    EXPECT_FALSE(live_thread(0, proc_).has_value());
    EXPECT_FALSE(live_thread(419, proc_).has_value()) << "no such process";
}

TEST(ProcfsNumericEntries, OnlyPositiveNumbersAscending) {
    char tmpl[] = "/tmp/commdbg_num_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    for (const char* n : {"12", "3", "self", "0", "-4", "7x", "100"}) fs::create_directories(fs::path(tmpl) / n);
    EXPECT_EQ(numeric_entries(tmpl), (std::vector<int>{3, 12, 100}));
    EXPECT_TRUE(numeric_entries(std::string(tmpl) + "/absent").empty());
    fs::remove_all(tmpl);
}

TEST_F(FakeProc, KernelThreadIsRecognisedByPfKthreadFlag) {
    write_file(proc_ + "/2/stat", stat_line(2, "kthreadd", 'S', 0, 2129984));
    write_file(proc_ + "/2/status", "Name:\tkthreadd\nUid:\t0\t0\t0\t0\n");
    write_file(proc_ + "/2/cmdline", "");
    auto p = read_process(2, proc_);
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_TRUE(p->kernel_thread);
    EXPECT_EQ(p->cmdline, "");
    // A user process whose cmdline is empty (e.g. exec'd with argv[0] NULL) is not one.
    write_file(proc_ + "/3/stat", stat_line(3, "odd", 'R', 1, 0x400100));
    write_file(proc_ + "/3/status", "Name:\todd\nUid:\t0\t0\t0\t0\n");
    write_file(proc_ + "/3/cmdline", "");
    auto q = read_process(3, proc_);
    ASSERT_TRUE(q.ok()) << q.error();
    EXPECT_FALSE(q->kernel_thread);
}

TEST_F(FakeProc, StatGivesCommStateFlagsAndStartTime) {
    write_file(proc_ + "/301/stat", stat_line(301, "a) (b", 'S', 12, 0x400104));
    auto st = read_stat(301, proc_);
    ASSERT_TRUE(st.ok()) << st.error();
    EXPECT_EQ(st->comm, "a) (b");
    EXPECT_EQ(st->state, 'S');
    EXPECT_EQ(st->ppid, 12);
    EXPECT_EQ(st->start_time, 9u);
    EXPECT_TRUE(st->exiting()) << "PF_EXITING is 0x4";
    EXPECT_FALSE(st->kernel_thread());
    write_file(proc_ + "/302/stat", "302 (x) S\n");
    EXPECT_NE(read_stat(302, proc_).error().find("302/stat: malformed"), std::string::npos);
    EXPECT_NE(read_stat(303, proc_).error().find("no such process"), std::string::npos);
}

TEST_F(FakeProc, ReadTgidOfAThreadIdIsItsProcessAndAStatusWithoutOneFails) {
    write_file(proc_ + "/311/status", "Name:\tpy\nTgid:\t310\nPid:\t311\n");
    auto t = read_tgid(311, proc_);
    ASSERT_TRUE(t.ok()) << t.error();
    EXPECT_EQ(*t, 310);
    write_file(proc_ + "/312/status", "Name:\tpy\nPid:\t312\n");
    EXPECT_NE(read_tgid(312, proc_).error().find("no 'Tgid:' line"), std::string::npos);
    EXPECT_NE(read_tgid(313, proc_).error().find("no such process"), std::string::npos);
}

TEST_F(FakeProc, MissingPidSaysNoSuchProcess) {
    for (int pid : {999999, 0, -5}) {
        auto p = read_process(pid, proc_);
        ASSERT_FALSE(p.ok());
        EXPECT_NE(p.error().find("no such process — check the pid"), std::string::npos) << p.error();
    }
}

// Root reads a mode-000 file, so as root the read runs in a child that has
// dropped to nobody (65534); the directories stay traversable for it.
std::string read_process_error_as_nobody(int pid, const std::string& proc_root) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        std::string msg;
        if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
            setresuid(65534, 65534, 65534) != 0) {
            msg = "could not drop to uid 65534";
        } else {
            auto p = read_process(pid, proc_root);
            msg = p.ok() ? "read succeeded" : p.error();
        }
        (void)!write(fds[1], msg.data(), msg.size());
        _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    close(fds[0]);
    waitpid(child, nullptr, 0);
    return out;
}

TEST_F(FakeProc, UnreadableStatSaysPermissionDenied) {
    write_file(proc_ + "/5/stat", stat_line(5, "x", 'S', 1, 0));
    chmod((proc_ + "/5/stat").c_str(), 0);
    std::string err;
    if (geteuid() == 0) {
        for (const auto& d : {root_, proc_, proc_ + "/5"}) chmod(d.c_str(), 0755);
        err = read_process_error_as_nobody(5, proc_);
    } else {
        auto p = read_process(5, proc_);
        ASSERT_FALSE(p.ok());
        err = p.error();
    }
    EXPECT_NE(err.find("permission denied"), std::string::npos) << err;
}

TEST_F(FakeProc, ThreadNameIsTheTaskCommWithoutItsNewline) {
    write_file(proc_ + "/5/task/7/comm", "pt_autograd_0\n");
    EXPECT_EQ(read_thread_name(5, 7, proc_), "pt_autograd_0");
    EXPECT_EQ(read_thread_name(5, 8, proc_), "");  // gone
    EXPECT_EQ(read_thread_name(0, 7, proc_), "");
}

TEST_F(FakeProc, EnvironKeepsOnlyAllowedKeysFirstDefinitionWins) {
    write_file(proc_ + "/8/environ",
               "NCCL_DEBUG=INFO\0SECRET=x\0RANK=3\0NCCL_DEBUG=WARN\0WEIRD\0EMPTY=\0"s);
    auto env = read_environ(8, {"NCCL_DEBUG", "RANK", "EMPTY", "ABSENT"}, proc_);
    std::map<std::string, std::string> want{{"NCCL_DEBUG", "INFO"}, {"RANK", "3"}, {"EMPTY", ""}};
    EXPECT_EQ(env, want);
    EXPECT_TRUE(read_environ(9, {"RANK"}, proc_).empty());
}

TEST(ProcfsReal, OwnMapsIncludeLibcAndResolveThroughProcRoot) {
    auto maps = read_maps(getpid());
    ASSERT_TRUE(maps.ok()) << maps.error();
    auto is_libc = [](std::string_view p) {
        auto b = p.substr(p.rfind('/') + 1);
        return b.starts_with("libc.so") || b.starts_with("libc-");
    };
    auto libc = mapped_files(*maps, getpid(), is_libc);
    ASSERT_EQ(libc.size(), 1u);
    EXPECT_EQ(libc[0].open_path, "/proc/" + std::to_string(getpid()) + "/root" + libc[0].path);
    struct stat st {};
    ASSERT_EQ(stat(libc[0].path.c_str(), &st), 0);
    EXPECT_EQ(libc[0].inode, st.st_ino);
}

TEST(ProcfsReal, OwnProcessHasOurUidAndIsNotAKernelThread) {
    auto p = read_process(getpid());
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_EQ(p->uid, getuid());
    EXPECT_EQ(p->ppid, getppid());
    EXPECT_FALSE(p->kernel_thread);
    EXPECT_FALSE(p->cmdline.empty());
    EXPECT_EQ(p->state, 'R');
}

TEST(ProcfsReal, KthreaddIsAKernelThread) {
    auto p = read_process(2);
    if (!p.ok() || p->comm != "kthreadd") GTEST_SKIP() << "pid 2 is not kthreadd (pid namespace?)";
    EXPECT_TRUE(p->kernel_thread);
    EXPECT_EQ(p->cmdline, "");
}

// ---- what a refused read says ---------------------------------------------------

TEST(AccessDenied, OnlyAUserWhoIsNotRootIsToldToRunAsRoot) {
    EXPECT_EQ(access_denied_advice({.root = false, .cap_sys_ptrace = false, .initial_userns = true}),
              "run as root or as the process's user");
    for (bool root : {true, false}) {
        std::string as_root = access_denied_advice({.root = true, .cap_sys_ptrace = root, .initial_userns = true});
        EXPECT_EQ(as_root.find("run as root"), std::string::npos) << as_root;
    }
    EXPECT_NE(access_denied_advice({.root = true, .cap_sys_ptrace = false, .initial_userns = true})
                  .find("without CAP_SYS_PTRACE"),
              std::string::npos);
    EXPECT_NE(access_denied_advice({.root = true, .cap_sys_ptrace = true, .initial_userns = false})
                  .find("runs in a user namespace"),
              std::string::npos);
    EXPECT_NE(access_denied_advice({.root = true, .cap_sys_ptrace = true, .initial_userns = true})
                  .find("a security policy protects this process"),
              std::string::npos);
}

TEST(AccessDenied, OwnCredsAreReadFromProc) {
    TracerCreds c = own_creds();
    EXPECT_EQ(c.root, geteuid() == 0);
    std::ifstream in("/proc/self/uid_map");
    std::string inside, outside, count;
    in >> inside >> outside >> count;
    EXPECT_EQ(c.initial_userns, inside == "0" && outside == "0" && count == "4294967295");
}

// Runs `f` in a child whose effective set lacks CAP_SYS_PTRACE (root in a
// container that drops it; also CAP_SYS_ADMIN and CAP_PERFMON, which this
// kernel accepts for reading maps too) and returns what it wrote.
std::string without_cap_sys_ptrace(const std::function<std::string()>& f) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct data[2]{};
        std::string msg;
        if (syscall(SYS_capget, &hdr, data) != 0) msg = "capget failed";
        for (int cap : {CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON}) data[cap / 32].effective &= ~(1u << (cap % 32));
        if (msg.empty() && syscall(SYS_capset, &hdr, data) != 0) msg = "capset failed";
        if (msg.empty()) msg = f();
        (void)!write(fds[1], msg.data(), msg.size());
        _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    close(fds[0]);
    waitpid(child, nullptr, 0);
    return out;
}

TEST(AccessDenied, RootWithoutCapSysPtraceIsToldToGrantItNotToRunAsRoot) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (to start a process of another user)";
    pid_t target = fork();
    if (target == 0) {
        if (setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0) pause();
        _exit(1);
    }
    // Wait until the target runs as nobody: then its maps need CAP_SYS_PTRACE.
    for (int i = 0; i < 500; ++i) {
        auto p = read_process(target);
        if (p && p->uid == 65534) break;
        usleep(10000);
    }
    std::string err = without_cap_sys_ptrace([target] {
        auto m = read_maps(target);
        return m ? std::string("read succeeded") : m.error();
    });
    kill(target, SIGKILL);
    waitpid(target, nullptr, 0);
    EXPECT_NE(err.find("permission denied reading"), std::string::npos) << err;
    EXPECT_NE(err.find("without CAP_SYS_PTRACE"), std::string::npos) << err;
    EXPECT_EQ(err.find("run as root"), std::string::npos) << err;
}

TEST(ProcfsReal, OwnEnvironIsReadable) {
    const char* path = std::getenv("PATH");
    if (!path) GTEST_SKIP() << "PATH unset";
    auto env = read_environ(getpid(), {"PATH"});
    EXPECT_EQ(env["PATH"], path);
}

}  // namespace

TEST_F(FakeProc, CredsHoldAllFourUidsAndGids) {
    write_file(proc_ + "/40/stat", stat_line(40, "passwd", 'S', 1, 0x400100));
    write_file(proc_ + "/40/status", "Name:\tpasswd\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t6\t5\nFDSize:\t64\n");
    auto c = read_creds(40, proc_);
    ASSERT_TRUE(c.ok()) << c.error();
    EXPECT_EQ(c->uids, (std::array<uint32_t, 4>{1000, 0, 0, 0}));
    EXPECT_EQ(c->gids, (std::array<uint32_t, 4>{5, 5, 6, 5}));
    // Three ids are not four: refused rather than read short.
    write_file(proc_ + "/41/stat", stat_line(41, "x", 'S', 1, 0));
    write_file(proc_ + "/41/status", "Uid:\t1000\t1000\t1000\nGid:\t5\t5\t5\t5\n");
    auto bad = read_creds(41, proc_);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("malformed"), std::string::npos) << bad.error();
    EXPECT_NE(read_creds(42, proc_).error().find("no such process"), std::string::npos);
}

TEST(MayReadProcess, TheKernelsRuleRealEffectiveSavedIdsAndDumpable) {
    ProcessCreds own;
    own.uids.fill(1000);
    own.gids.fill(100);
    EXPECT_TRUE(may_read_process(own, 1000, 100));
    EXPECT_FALSE(may_read_process(own, 1001, 100));  // another user's
    EXPECT_FALSE(may_read_process(own, 1000, 101));  // another group's
    EXPECT_TRUE(may_read_process(own, 0, 0));        // root reads all
    for (int i = 0; i < 3; ++i) {
        ProcessCreds c = own;
        c.uids[i] = 0;  // set-uid root, or root that kept one of its ids
        EXPECT_FALSE(may_read_process(c, 1000, 100)) << "uid " << i;
        c = own;
        c.gids[i] = 42;
        EXPECT_FALSE(may_read_process(c, 1000, 100)) << "gid " << i;
    }
    ProcessCreds fs_only = own;
    fs_only.uids[3] = 0;  // the filesystem uid is not the kernel's concern here
    EXPECT_TRUE(may_read_process(fs_only, 1000, 100));
    ProcessCreds undumpable = own;
    undumpable.dumpable = false;
    EXPECT_FALSE(may_read_process(undumpable, 1000, 100));
    EXPECT_TRUE(may_read_process(undumpable, 0, 0));
}

// A child of this test as uid 65534 (when root: a root process looks dumpable
// either way) that sets its dumpability, then waits to be killed.
pid_t child_with_dumpable(int dumpable) {
    int ready[2];
    if (pipe(ready) != 0) return -1;
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                               setresuid(65534, 65534, 65534) != 0))
            _exit(1);
        prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0);  // needs no privilege
        (void)!write(ready[1], "x", 1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char c;
    const bool ok = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    return ok ? child : -1;
}

TEST(ProcfsReal, DumpabilityIsReadFromTheOwnerOfProcPidStat) {
    auto self = read_creds(getpid());
    ASSERT_TRUE(self.ok()) << self.error();
    EXPECT_TRUE(self->dumpable);
    EXPECT_EQ(self->uids[0], getuid());
    EXPECT_EQ(self->gids[1], getegid());
    for (int dumpable : {1, 0}) {
        pid_t child = child_with_dumpable(dumpable);
        ASSERT_GT(child, 0) << "the child did not start";
        auto c = read_creds(child);
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        ASSERT_TRUE(c.ok()) << c.error();
        EXPECT_EQ(c->dumpable, dumpable == 1);
        EXPECT_EQ(may_read_process(*c, c->uids[0], c->gids[0]), dumpable == 1);
    }
}
