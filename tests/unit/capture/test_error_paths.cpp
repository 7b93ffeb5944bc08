// SPDX-License-Identifier: Apache-2.0
// Failures that must stay values: a full symbol table, an exception that
// would cross a C callback, a guard told a pid will not be stopped after all.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "fixtures.hpp"
#include "resume_guard.hpp"
#include "result.hpp"
#include "symbol_table.hpp"

using namespace commdbg;
using namespace commdbg::capture;

namespace {

SymbolInfo nccl_symbol(const std::string& name) {
    return test::symbol(name, "nccl", CD_ROLE_COLLECTIVE);
}

// /proc/PID/stat state letter ('T': stopped), '?' when unreadable.
char state_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(in, line)) return '?';
    auto paren = line.rfind(')');
    return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

bool wait_for_state(pid_t pid, char want, int ms) {
    for (int i = 0; i < ms / 10; ++i) {
        if (state_of(pid) == want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return state_of(pid) == want;
}

// A sleeper that counts the SIGCONTs it gets in `*conts` (shared memory):
// a resume is seen however briefly the process was stopped.
volatile int* g_conts = nullptr;
void count_cont(int) { *g_conts = *g_conts + 1; }

pid_t counting_sleeper(volatile int* conts) {
    pid_t p = fork();
    if (p == 0) {
        g_conts = conts;
        signal(SIGCONT, count_cont);
        for (;;) pause();
    }
    return p;
}

pid_t stopped_sleeper() {
    pid_t p = fork();
    if (p == 0) {
        for (;;) pause();
    }
    kill(p, SIGSTOP);
    return p;
}

}  // namespace

TEST(SymbolTableFull, TryInternFailsWithAMessageInsteadOfThrowing) {
    SymbolTable t(2);
    ASSERT_TRUE(t.try_intern(nccl_symbol("ncclAllReduce")));
    ASSERT_TRUE(t.try_intern(nccl_symbol("ncclBroadcast")));
    auto third = t.try_intern(nccl_symbol("ncclSend"));
    ASSERT_FALSE(third);
    EXPECT_NE(third.error().find("symbol table full"), std::string::npos) << third.error();
    EXPECT_EQ(t.size(), 2u);
    // A symbol already there is found in a full table.
    auto again = t.try_intern(nccl_symbol("ncclBroadcast"));
    ASSERT_TRUE(again);
    EXPECT_EQ(*again, 1u);
}

TEST(SymbolTableFull, InternThrowsTheFatalErrorForSetupCode) {
    SymbolTable t(1);
    (void)t.intern(nccl_symbol("ncclAllReduce"));
    EXPECT_THROW((void)t.intern(nccl_symbol("ncclSend")), CommdbgError);
}

TEST(CallbackBoundary, AThrowFromInsideBecomesAMessage) {
    SymbolTable t(1);
    (void)t.intern(nccl_symbol("ncclAllReduce"));
    // What a ring-buffer handler that attaches a new library reaches.
    auto failed = run_without_throwing([&] { (void)t.intern(nccl_symbol("ncclSend")); });
    ASSERT_TRUE(failed);
    EXPECT_NE(failed->find("symbol table full"), std::string::npos) << *failed;
    auto other = run_without_throwing([] { throw 42; });
    ASSERT_TRUE(other);
    EXPECT_FALSE(run_without_throwing([] {}));
}

// commdbg's files close in order as it dies: the guard's pipe before the
// BPF links, so a process resumed at the pipe's close can be stopped again
// by the loader probe (dlopen calls it twice) while commdbg is still going,
// for many seconds where it had many links to close.  The guard resumes it
// again while commdbg lingers, not only once it is gone.
TEST(ResumeGuardDeath, APidStoppedAgainBeforeCommdbgIsGoneIsResumedAgain) {
    auto* conts = static_cast<volatile int*>(
        mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(conts, MAP_FAILED);
    *conts = 0;
    pid_t target = counting_sleeper(conts);
    kill(target, SIGSTOP);
    ASSERT_TRUE(wait_for_state(target, 'T', 2000));
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    pid_t dying = fork();
    if (dying == 0) {  // a stand-in for commdbg: its pipe closes, then it lingers
        ResumeGuard g;
        if (!g.start()) _exit(1);
        g.watch(target);
        for (int fd = 3; fd < 1024; ++fd)
            if (fd != go[0]) close(fd);
        char c;
        (void)!read(go[0], &c, 1);  // lives until the test has stopped the target again
        _exit(0);
    }
    close(go[0]);
    EXPECT_TRUE(wait_for_state(target, 'S', 5000)) << "not resumed at the pipe's close: state " << state_of(target);
    const int resumed_once = *conts;
    kill(target, SIGSTOP);  // the probe, still attached, stops it again
    for (int i = 0; i < 200 && *conts == resumed_once; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GT(*conts, resumed_once) << "left stopped while commdbg lingers: state " << state_of(target);
    ASSERT_EQ(waitpid(dying, nullptr, WNOHANG), 0) << "the stand-in for commdbg did not linger";
    close(go[1]);
    int st = 0;
    ASSERT_EQ(waitpid(dying, &st, 0), dying);
    EXPECT_TRUE(wait_for_state(target, 'S', 5000)) << "left stopped after commdbg was gone: state " << state_of(target);
    kill(target, SIGKILL);
    waitpid(target, nullptr, 0);
    munmap(const_cast<int*>(conts), sizeof(int));
}

TEST(ResumeGuardUnwatch, AnUnwatchedPidIsNotResumedWhenCommdbgDies) {
    pid_t kept = stopped_sleeper(), dropped = stopped_sleeper();
    ASSERT_TRUE(wait_for_state(kept, 'T', 2000));
    ASSERT_TRUE(wait_for_state(dropped, 'T', 2000));
    // A stand-in for commdbg that dies without a clean shutdown.
    pid_t dying = fork();
    if (dying == 0) {
        ResumeGuard g;
        if (!g.start()) _exit(1);
        g.watch(kept);
        g.watch(dropped);
        g.unwatch(dropped);
        _exit(0);  // no destructor: the guard sees the pipe close
    }
    int st = 0;
    ASSERT_EQ(waitpid(dying, &st, 0), dying);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    // The watched one is resumed: by then the guard has acted on both.
    EXPECT_TRUE(wait_for_state(kept, 'S', 5000)) << "state " << state_of(kept);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a SIGCONT right after it would land by now
    EXPECT_EQ(state_of(dropped), 'T');
    for (pid_t p : {kept, dropped}) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
    }
}
