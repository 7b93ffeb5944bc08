// SPDX-License-Identifier: Apache-2.0
// Where outputs go (userspace/output_file.hpp) and how an exit is told:
// no privileges, no BPF.  Paths live in a fresh temp dir; the only device
// used is a FIFO made there.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "output_file.hpp"
#include "report.hpp"

using namespace commdbg;

namespace {

class OutputFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/commdbg-unit-out-XXXXXX";
        dir_ = mkdtemp(tmpl);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::string path(const std::string& n) const { return dir_ + "/" + n; }
    static std::string slurp(const std::string& p) {
        std::ifstream in(p);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    std::string dir_;
};

TEST_F(OutputFileTest, RegularFileIsReplacedAndKeepsItsMode) {
    { std::ofstream(path("a.json")) << "old"; }
    chmod(path("a.json").c_str(), 0600);
    auto t = check_output("--json", path("a.json"));
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->kind, OutputTarget::Kind::Replace);
    write_output(*t, "new");
    EXPECT_EQ(slurp(path("a.json")), "new");
    struct stat st {};
    stat(path("a.json").c_str(), &st);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(OutputFileTest, SymlinkChainResolvesToTheFinalFileAndTheLinksStay) {
    { std::ofstream(path("real.json")) << "old"; }
    ASSERT_EQ(symlink("real.json", path("l1").c_str()), 0);
    ASSERT_EQ(symlink(path("l1").c_str(), path("l2").c_str()), 0);
    auto t = check_output("--json", path("l2"));
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->resolved, path("real.json"));
    write_output(*t, "new");
    EXPECT_EQ(slurp(path("real.json")), "new");
    struct stat st {};
    lstat(path("l1").c_str(), &st);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    lstat(path("l2").c_str(), &st);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
}

TEST_F(OutputFileTest, DanglingSymlinkCreatesItsTarget) {
    ASSERT_EQ(symlink("later.json", path("link").c_str()), 0);
    auto t = check_output("--json", path("link"));
    ASSERT_TRUE(t) << t.error();
    write_output(*t, "x");
    EXPECT_EQ(slurp(path("later.json")), "x");
}

TEST_F(OutputFileTest, FifoIsWrittenThroughAndOneWithoutReaderFailsAtOnce) {
    ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
    auto t = check_output("--json", path("fifo"));
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->kind, OutputTarget::Kind::WriteThrough);
    try {
        write_output(*t, "nobody reads this");
        FAIL() << "a FIFO without a reader must fail, not block";
    } catch (const CommdbgError& e) {
        EXPECT_NE(std::string(e.what()).find("no process reads the FIFO"), std::string::npos) << e.what();
    }
    std::string got;
    std::thread reader([&] {
        int fd = open(path("fifo").c_str(), O_RDONLY);
        char buf[256];
        for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
        close(fd);
    });
    // The reader opens first; a writer that came too early is retried.
    for (int i = 0;; ++i) {
        try {
            write_output(*t, "dump");
            break;
        } catch (const CommdbgError&) {
            ASSERT_LT(i, 500);
            usleep(2000);
        }
    }
    reader.join();
    EXPECT_EQ(got, "dump");
    struct stat st {};
    lstat(path("fifo").c_str(), &st);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(OutputFileTest, StdoutNamesOurDescriptor) {
    for (const std::string p : {"/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"}) {
        auto t = check_output("--table", p);
        ASSERT_TRUE(t) << p << ": " << t.error();
        EXPECT_EQ(t->kind, OutputTarget::Kind::Descriptor) << p;
        EXPECT_EQ(t->fd, 1) << p;
    }
}

TEST_F(OutputFileTest, ProblemsAreFoundUpFrontAndNameTheOption) {
    auto empty = check_output("--json", "");
    ASSERT_FALSE(empty);
    EXPECT_NE(empty.error().find("--json"), std::string::npos);
    auto missing = check_output("--trace", path("no/such/dir/x.json"));
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().find("does not exist"), std::string::npos) << missing.error();
    EXPECT_NE(missing.error().find("--trace"), std::string::npos);
    auto dir = check_output("--json", dir_);
    ASSERT_FALSE(dir);
    EXPECT_NE(dir.error().find("is a directory"), std::string::npos) << dir.error();
}

TEST_F(OutputFileTest, TwoOutputsOnOneFileAreRefusedDevicesAreNot) {
    auto same = check_outputs({{"--json", path("x")}, {"--trace", path("x")}});
    ASSERT_FALSE(same);
    EXPECT_NE(same.error().find("--json and --trace name the same file"), std::string::npos) << same.error();
    { std::ofstream(path("y")) << ""; }
    ASSERT_EQ(symlink("y", path("y-link").c_str()), 0);
    auto via_link = check_outputs({{"--json", path("y")}, {"--table", path("y-link")}});
    ASSERT_FALSE(via_link) << "a link to the same file is the same file";
    ASSERT_EQ(mkfifo(path("f").c_str(), 0600), 0);
    auto fifo_twice = check_outputs({{"--json", path("f")}, {"--table", path("f")}});
    EXPECT_TRUE(fifo_twice) << "a FIFO takes outputs one after the other: " << fifo_twice.error();
}

TEST_F(OutputFileTest, FallbackGoesToTmpdir) {
    setenv("TMPDIR", dir_.c_str(), 1);
    auto saved = save_fallback("dump", "json", "{}");
    unsetenv("TMPDIR");
    ASSERT_TRUE(saved) << saved.error();
    EXPECT_EQ(saved->rfind(dir_ + "/commdbg-", 0), 0u) << *saved;
    EXPECT_EQ(slurp(*saved), "{}");
}

TEST(ExitStatus, ExitAndSignalAreToldApart) {
    using report_detail::decode_exit;
    using report_detail::describe_exit;
    auto e = decode_exit(3 << 8);  // exit(3)
    EXPECT_EQ(e.code, 3);
    EXPECT_FALSE(e.signal);
    EXPECT_EQ(describe_exit(e), "exited with status 3");
    auto k = decode_exit(SIGKILL);  // killed by SIGKILL
    EXPECT_FALSE(k.code);
    EXPECT_EQ(k.signal, SIGKILL);
    EXPECT_EQ(describe_exit(k), "killed by SIGKILL (signal 9)");
    auto nine = decode_exit(9 << 8);  // exit(9): not the same as SIGKILL
    EXPECT_EQ(nine.code, 9);
    EXPECT_FALSE(nine.signal);
    auto core = decode_exit(SIGSEGV | 0x80);
    EXPECT_EQ(core.signal, SIGSEGV);
    EXPECT_TRUE(core.core_dumped);
}

}  // namespace
