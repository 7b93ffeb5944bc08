// SPDX-License-Identifier: Apache-2.0
// commdbgd stops a process that maps a libnccl file new to the node until
// the file is probed.  Nobody may be left stopped by it, nor be made to
// wait on another user: a shutdown resumes every process it stopped however
// many new files one user maps, and one user cannot take the kernel's map
// of probed files (daemon/node/files.hpp, FileShares).
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace daemon_tests {
namespace {

using namespace daemon_util;
namespace fs = std::filesystem;

// `n` distinct copies of the stub libnccl (each a file new to the node)
// under dir/prefix*, readable by anyone.
std::vector<std::string> library_copies(const SharedDir& dir, const std::string& prefix, int n) {
    const fs::path from = fs::canonical(lib_path(false));
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
        out.push_back(dir.path(prefix + "/libnccl.so.2." + std::to_string(i)));
        fs::create_directories(fs::path(out.back()).parent_path());
        fs::copy_file(from, out.back());
        chmod(out.back().c_str(), 0755);
    }
    chmod(dir.path(prefix).c_str(), 0755);
    return out;
}

// lib_mapper where uid 65534 can run it (a CI checkout may be closed to it).
std::string mapper_for_nobody(const SharedDir& dir) {
    const std::string bin = testprog("lib_mapper");
    if (run(concat(kAsNobody, {"/bin/sh", "-c", "test -x \"$0\"", bin})).status == 0) return bin;
    const std::string copy = dir.path("lib_mapper");
    fs::copy_file(bin, copy);
    chmod(copy.c_str(), 0755);
    return copy;
}

std::vector<std::string> mapper_argv(const std::string& bin, const std::vector<std::string>& files, bool as_nobody,
                                     int hold_ms = 0, const std::vector<std::string>& as = kAsNobody) {
    std::vector<std::string> argv = as_nobody ? as : std::vector<std::string>{};
    argv.push_back(bin);
    argv.insert(argv.end(), {"--hold", std::to_string(hold_ms)});
    argv.insert(argv.end(), files.begin(), files.end());
    return argv;
}

// Maps `files` and waits for it to finish; false if it did not within 60 s.
bool map_all(const std::vector<std::string>& argv) {
    auto r = run(argv, {}, 60);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0;
}

// Until the mapper printed "done": it is stopped nowhere.  Empty, or why not
// (its state when it did not).
std::string finishes(Background& mapper, int timeout_s) {
    if (!mapper.wait_for_line("done", timeout_s).empty()) return {};
    // What the next one needs to find who stopped it: its signal state and
    // which commdbgd (or guard) is still about.
    std::string status, line;
    std::ifstream in("/proc/" + std::to_string(mapper.pid()) + "/status");
    while (std::getline(in, line))
        if (line.rfind("Sig", 0) == 0 || line.rfind("ShdPnd", 0) == 0) status += " " + line;
    auto ps = run({"sh", "-c", "ps -eo pid,ppid,stat,etime,comm | grep -E 'commdbgd|lib_mapper' || true"});
    return std::string("never finished mapping: state ") + proc_state(mapper.pid()) + ";" + status + "\n" + ps.out;
}

// The reproduction: uid 65534 maps hundreds of files new to the node
// while the daemon stops (each stops it until probed), and root maps a fresh
// copy just after the SIGTERM.  The shutdown does not wait on the files one
// user maps, and neither process is left stopped.
TEST(DaemonStops, ShutdownWhileAUserMapsHundredsOfNewFilesLeavesNobodyStopped) {
    REQUIRE_BPF();
    SharedDir tmp;
    const auto files = library_copies(tmp, "many", 300);
    const auto fresh = library_copies(tmp, "fresh", 1);
    // The whole map for one user, so every file stops it (the default share
    // would stop it only 64 times).
    START_DAEMON(d, tmp, {"--max-files-per-uid", "3072"});
    Background nobody(mapper_argv(mapper_for_nobody(tmp), files, true, 30000));
    ASSERT_FALSE(nobody.wait_for_line("mapped 5", 60).empty()) << "the mapper never got going";
    double shutdown_s = 0;
    std::thread root_maps([&] {
        sleep_ms(200);
        Background root(mapper_argv(testprog("lib_mapper"), fresh, false, 0));
        std::string why = finishes(root, 20);
        EXPECT_TRUE(why.empty()) << "root's process mapping a fresh copy during the shutdown " << why;
    });
    auto r = d.stop(SIGTERM, 60, &shutdown_s);
    root_maps.join();
    EXPECT_EQ(r.status, 0) << r.err;
    // Bounded whatever one user maps (here 300 files, ~60 ms of probing each).
    EXPECT_LT(shutdown_s, 10.0) << "SIGTERM took " << shutdown_s << " s";
    std::string why = finishes(nobody, 20);
    EXPECT_TRUE(why.empty()) << "uid 65534's mapper, " << shutdown_s << " s after SIGTERM: " << why;
}

// Nothing the daemon stopped stays stopped when it is killed with SIGKILL
// either: the guard resumes it once the daemon is gone.
TEST(DaemonStops, SigkillWhileAUserMapsNewFilesLeavesNobodyStopped) {
    REQUIRE_BPF();
    SharedDir tmp;
    const auto files = library_copies(tmp, "many", 120);
    START_DAEMON(d, tmp, {"--max-files-per-uid", "3072"});
    Background nobody(mapper_argv(mapper_for_nobody(tmp), files, true, 30000));
    ASSERT_FALSE(nobody.wait_for_line("mapped 5", 60).empty()) << "the mapper never got going";
    d.stop(SIGKILL, 30);
    std::string why = finishes(nobody, 20);
    EXPECT_TRUE(why.empty()) << "uid 65534's mapper after the daemon's SIGKILL: " << why;
}

// What status shows of the files is published at the daemon's next refresh
// (every 0.5 s): wait for two.
void settle() { sleep_ms(1200); }

long resumed(const Daemon& d) {
    return cli_json({"status", "--socket", d.socket()}).value("resumed_after_new_library", -1L);
}

size_t attached_under(const Daemon& d, const std::string& dir) {
    size_t n = 0;
    for (const auto& f : cli_json({"status", "--socket", d.socket()}).value("library_files", json::array()))
        n += f.value("path", "").rfind(dir, 0) == 0;
    return n;
}

// One user mapping many copies holds its share of probed files and no more:
// past it its files are neither probed nor stopped for, also when mapped
// again, while another user's new file is still probed once and its process
// stopped once.
TEST(DaemonStops, AUserPastItsShareOfFilesIsNotStoppedAndAnotherUsersNewFileIsProbedOnce) {
    REQUIRE_BPF();
    SharedDir tmp;
    const auto files = library_copies(tmp, "many", 12);
    const auto other = library_copies(tmp, "other", 1);
    START_DAEMON(d, tmp, {"--max-files-per-uid", "4"});
    const std::string bin = mapper_for_nobody(tmp);
    ASSERT_TRUE(map_all(mapper_argv(bin, files, true)));
    settle();
    EXPECT_EQ(resumed(d), 4) << "stops for uid 65534's 12 new files, with a share of 4";
    EXPECT_EQ(attached_under(d, tmp.path("many")), 4u);
    auto st = cli_json({"status", "--socket", d.socket()});
    const json shares = st.value("library_file_shares", json::object());
    EXPECT_EQ(shares.value("held_by_uid", json::object()).value("65534", 0), 4) << shares.dump();
    EXPECT_EQ(shares.value("capped_uids", json::array()), json::array({kNobody})) << shares.dump();
    EXPECT_GE(st.value("drops", json::object()).value("file_share_per_uid", 0), 8) << st.dump();
    // The same files again: known or refused, none stopped for.
    ASSERT_TRUE(map_all(mapper_argv(bin, files, true)));
    EXPECT_EQ(resumed(d), 4) << "a second pass over the same files stopped the process again";
    // Another user's new file: probed once, its first process stopped once,
    // the second one not at all.
    const std::vector<std::string> as_other = {"setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"};
    ASSERT_TRUE(map_all(mapper_argv(bin, other, true, 0, as_other)));
    ASSERT_TRUE(map_all(mapper_argv(bin, other, true, 0, as_other)));
    settle();
    EXPECT_EQ(resumed(d), 5) << "uid 65533's new file, mapped by two processes";
    EXPECT_EQ(attached_under(d, tmp.path("other")), 1u);
}

}  // namespace
}  // namespace daemon_tests
}  // namespace commdbg::e2e
