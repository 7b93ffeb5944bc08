// SPDX-License-Identifier: Apache-2.0
// Where outputs go (userspace/host/output_file.hpp) and how an exit is told:
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
#include "render.hpp"
#include "text.hpp"
#include "wait_status.hpp"
#include "test_proc.hpp"

using namespace commdbg;
using namespace commdbg::host;

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

// ---- another user's links and files in a sticky directory (/tmp) -------------
// Planting one as uid 65534 needs lchown: root only.

class StickyDirTest : public OutputFileTest {
protected:
    void SetUp() override {
        OutputFileTest::SetUp();
        REQUIRE_OR_SKIP(geteuid() == 0, "lchown to uid 65534 needs root");
        ASSERT_EQ(mkdir(path("pub").c_str(), 0777), 0);
        ASSERT_EQ(chmod(path("pub").c_str(), 01777), 0);  // as /tmp: sticky, world-writable, root's
        { std::ofstream(path("target")) << "secret"; }
        chmod(path("target").c_str(), 0600);
    }
    // pub/NAME -> target, owned by `uid`.
    std::string plant_link(const std::string& name, uid_t uid) {
        std::string link = path("pub/" + name);
        EXPECT_EQ(symlink(path("target").c_str(), link.c_str()), 0);
        EXPECT_EQ(lchown(link.c_str(), uid, uid), 0);
        return link;
    }
};

TEST_F(StickyDirTest, AnotherUsersSymlinkIsNotFollowedAndItsTargetIsUntouched) {
    const std::string link = plant_link("out.json", 65534);
    auto t = check_output("--json", link);
    ASSERT_FALSE(t) << "followed to " << t->resolved;
    EXPECT_EQ(t.error(), "--json " + link + ": refusing to follow a symlink owned by uid 65534 in the sticky directory " +
                             path("pub") + " — remove it or pick another path");
    EXPECT_EQ(slurp(path("target")), "secret");
    struct stat st {};
    ASSERT_EQ(lstat(link.c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    // A second hop through such a link is refused too.
    ASSERT_EQ(symlink(link.c_str(), path("mine").c_str()), 0);
    EXPECT_FALSE(check_output("--json", path("mine")));
}

// The kernel's rule, not "never follow": the caller's own links, and the
// directory owner's, are followed.
TEST_F(StickyDirTest, OwnLinksAndTheDirectoryOwnersAreFollowed) {
    const std::string own = plant_link("own.json", 0);
    auto t = check_output("--json", own);
    ASSERT_TRUE(t) << t.error();
    write_output(*t, "dump");
    EXPECT_EQ(slurp(path("target")), "dump");
    ASSERT_EQ(chown(path("pub").c_str(), 65534, 65534), 0);
    const std::string owners = plant_link("dir-owner.json", 65534);
    EXPECT_TRUE(check_output("--json", owners));
}

TEST_F(StickyDirTest, AnotherUsersFileIsNotReplacedNorItsModeTaken) {
    const std::string f = path("pub/out.json");
    { std::ofstream(f) << "theirs"; }
    chown(f.c_str(), 65534, 65534);
    chmod(f.c_str(), 0666);
    auto t = check_output("--json", f);
    ASSERT_FALSE(t);
    EXPECT_NE(t.error().find("refusing to replace a file owned by uid 65534 in the sticky directory"), std::string::npos)
        << t.error();
    // Planted after the check, during the window: refused at the write.
    const std::string later = path("pub/later.json");
    auto ok = check_output("--json", later);
    ASSERT_TRUE(ok) << ok.error();
    { std::ofstream(later) << "theirs"; }
    chown(later.c_str(), 65534, 65534);
    chmod(later.c_str(), 0666);
    EXPECT_THROW(write_output(*ok, "dump"), CommdbgError);
    EXPECT_EQ(slurp(later), "theirs");
}

}  // namespace
