// SPDX-License-Identifier: Apache-2.0
// The Python stack of a record, captured in BPF and resolved from the
// target's memory (issue 11, points 2 and 3): tests/testprogs/
// py_stack_workload.py calls the stub's ncclAllReduce through ctypes from
// known places and reports, per call, the stack as the interpreter itself
// sees it; `commdbg attach` must give each ncclAllReduce record exactly that
// stack (qualnames, files, lines), innermost first.  On Debian's non-PIE
// /usr/bin/python3.11, trixie's python3.13 in another root (tests/
// trixie_root.sh) and the image's pyenv builds (libpython3.X.so; skipped
// with a note where absent, also under CI).  A recursion deeper than
// --py-depth gives that many frames, flagged truncated; a thread that never
// ran Python gives "py_stack": [].
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "e2e_util.hpp"
#include "events.h"

namespace commdbg::e2e {
namespace {

const std::string kWorkloadName = "py_stack_workload.py";
constexpr int kRecursion = 200;  // frames of recurse() at the deepest call
constexpr int kPyDepth = 40;     // the --py-depth the tests ask for
constexpr int kDefaultPyDepth = 64;
constexpr int kMaxPyDepth = CD_MAX_PY_FRAMES;  // the deepest --py-depth
// The root-side paths the trixie job sees (bound read-only by trixie_run.sh).
const std::string kInRootProgs = "/opt/commdbg-testprogs";
const std::string kInRootStub = "/opt/commdbg-stub";
const std::string kInRootWait = "/opt/commdbg-wait";

// The same default as tests/trixie_root.sh (and test_torch26.cpp).
std::string trixie_root() {
    const char* env = std::getenv("COMMDBG_TRIXIE_ROOT");
    return env && *env ? env : "/var/cache/commdbg/trixie-root";
}

// An interpreter to run the workload in, and how it sees our files.
struct Interp {
    std::string name;  // test parameter name
    std::string exe;   // on the host; for the trixie root, inside it
    bool trixie = false;
    bool optional = false;  // pyenv builds: a note, not a failure, when absent
};

// gtest names a parameter by this in its output.
void PrintTo(const Interp& v, std::ostream* os) { *os << v.name; }

std::string trixie_unavailable_reason() {
    const std::string root = trixie_root();
    if (geteuid() != 0) return "needs root (mount, chroot)";
    if (!std::filesystem::exists(root + "/.commdbg-trixie-root"))
        return "no trixie root at " + root + " (build it: make trixie-root)";
    if (!std::filesystem::exists(root + "/usr/bin/python3.13")) return "no python3.13 in the trixie root " + root;
    return {};
}

struct Paths {
    std::vector<std::string> argv;  // the command up to and including the script
    std::string lib, wait_file;     // as the target sees them
};

// In the root the job loads the host's stub through /proc/<this test>/root
// (the host's root, seen from the root's own /proc), so the mapping is the
// host file.  `lib_on_bind` instead binds the stub's directory into the root,
// a mount of the job's private namespace, as a container's volume is.
Paths paths_for(const Interp& in, const TempDir& tmp, bool lib_on_bind = false) {
    const std::string wait_dir = tmp.path("");
    if (!in.trixie)
        return {{in.exe, std::string(SOURCE_DIR) + "/tests/testprogs/" + kWorkloadName},
                std::string(STUB_NCCL_DIR) + "/libnccl.so.2", tmp.path("go")};
    Paths p{{std::string(SOURCE_DIR) + "/tests/trixie_run.sh", "--bind",
             std::string(SOURCE_DIR) + "/tests/testprogs:" + kInRootProgs, "--bind", wait_dir + ":" + kInRootWait},
            "/proc/" + std::to_string(getpid()) + "/root" + STUB_NCCL_DIR + "/libnccl.so.2",
            kInRootWait + "/go"};
    if (lib_on_bind) {
        p.argv.insert(p.argv.end(), {"--bind", std::string(STUB_NCCL_DIR) + ":" + kInRootStub});
        p.lib = kInRootStub + "/libnccl.so.2";
    }
    p.argv.insert(p.argv.end(), {trixie_root(), in.exe, kInRootProgs + "/" + kWorkloadName});
    return p;
}

// One record of a call site (ncclAllReduce; the thread without Python
// calls ncclCommDestroy): where and what stack it carries.
struct NcclRecord {
    int tid = 0;
    uint64_t start_ns = 0;
    const nlohmann::json* rec = nullptr;
};

void collect_allreduce(const nlohmann::json& records, std::vector<NcclRecord>& out) {
    for (const auto& r : records) {
        const std::string name = r.value("name", "");
        if (name == "ncclAllReduce" || name == "ncclCommDestroy")
            out.push_back({r["tid"].get<int>(), r["start_ns"].get<uint64_t>(), &r});
        if (r.contains("children")) collect_allreduce(r["children"], out);
    }
}

// A finished traced run of the workload's "sites" mode.
struct SitesRun {
    std::string skip;  // set: did not run, and why
    ProcResult work, dbg;
    nlohmann::json dump, report;
    std::vector<nlohmann::json> procs;  // of the dump: `records` point into them
    std::vector<nlohmann::json> plan, calls;
    std::vector<NcclRecord> records;  // sorted by (tid, start_ns)
};

// Starts the workload, attaches with `extra` options once it is ready,
// releases it and collects both sides.
SitesRun run_sites(const Interp& in, const std::vector<std::string>& extra, bool lib_on_bind = false) {
    SitesRun s;
    TempDir tmp;
    Paths p = paths_for(in, tmp, lib_on_bind);
    std::vector<std::string> argv = p.argv;
    argv.insert(argv.end(), {"sites", "--lib", p.lib, "--wait-file", p.wait_file, "--depth",
                             std::to_string(kRecursion)});
    Background work(argv);
    std::string ready = work.wait_for_line("ready pid=", 60);
    if (ready.empty()) {
        s.work = work.wait(5);
        s.skip = "the workload never got ready: " + s.work.err.substr(0, 2000);
        return s;
    }
    const int pid = pid_of_ready(ready);
    std::vector<std::string> dargv = {commdbg_bin(), "attach", std::to_string(pid), "--no-daemon", "--probes",
                                      "nccl", "--json", tmp.path("out.json")};
    dargv.insert(dargv.end(), extra.begin(), extra.end());
    Background dbg(dargv);
    if (dbg.wait_for_err_line("commdbg: tracing", 60).empty()) {
        s.dbg = dbg.wait(5);
        s.skip = "commdbg never said it was tracing; status " + std::to_string(s.dbg.status) + ": " + s.dbg.err;
        return s;
    }
    touch(tmp.path("go"));
    s.work = work.wait(60);
    s.dbg = dbg.wait(60);  // ends by itself once the target exits
    if (std::filesystem::exists(tmp.path("out.json"))) s.dump = read_json(tmp.path("out.json"));
    s.plan = workload_lines(s.work.out, "site");
    s.calls = workload_lines(s.work.out, "call");
    auto reports = workload_lines(s.work.out, "tids");
    if (!reports.empty()) s.report = reports.back();
    if (!s.dump.is_null() && s.report.is_object()) {
        s.procs = processes_of(s.dump);
        if (const nlohmann::json* proc = process_by_pid(s.procs, s.report["pid"].get<int>()))
            collect_allreduce((*proc)["records"], s.records);
    }
    std::sort(s.records.begin(), s.records.end(), [](const NcclRecord& a, const NcclRecord& b) {
        return a.tid != b.tid ? a.tid < b.tid : a.start_ns < b.start_ns;
    });
    return s;
}

std::string skip_reason(const Interp& in) {
    if (in.trixie) return trixie_unavailable_reason();
    if (access(in.exe.c_str(), X_OK) != 0) return in.exe + " is not here";
    return {};
}

#define REQUIRE_INTERP(in)                                                                    \
    do {                                                                                      \
        REQUIRE_BPF();                                                                        \
        const std::string why_ = skip_reason(in);                                             \
        if (!why_.empty() && (in).optional) GTEST_SKIP() << why_ << " (optional interpreter)"; \
        REQUIRE_NO_REASON(why_);                                                              \
    } while (0)

// The run both sides agree happened: the workload exited 0 (it checked its
// own stacks), commdbg too, and it recorded one call per site.
void expect_clean_run(const SitesRun& s) {
    ASSERT_TRUE(s.skip.empty()) << s.skip;
    ASSERT_EQ(s.work.status, 0) << "the traced workload failed\n" << s.work.err.substr(0, 4000);
    ASSERT_EQ(s.dbg.status, 0) << s.dbg.err;
    ASSERT_FALSE(s.dump.is_null()) << "no JSON written\n" << s.dbg.err;
    ASSERT_TRUE(s.report.is_object()) << s.work.out.substr(0, 4000);
    ASSERT_EQ(s.plan.size(), s.calls.size()) << s.work.out.substr(0, 4000);
    ASSERT_EQ(s.records.size(), s.calls.size()) << "one record per call site\n"
                                                << s.dump.dump(1).substr(0, 4000);
}

// The records of the workload's Python thread `tid`, in call order, paired
// with the workload's own account of the same calls.
std::vector<std::pair<const nlohmann::json*, const nlohmann::json*>> pairs_on(const SitesRun& s, int tid) {
    std::vector<const nlohmann::json*> calls;
    for (const auto& c : s.calls)
        if (c["tid"].get<int>() == tid) calls.push_back(&c);
    std::vector<const nlohmann::json*> recs;
    for (const auto& r : s.records)
        if (r.tid == tid) recs.push_back(r.rec);
    std::vector<std::pair<const nlohmann::json*, const nlohmann::json*>> out;
    EXPECT_EQ(recs.size(), calls.size()) << "tid " << tid << ": records and calls differ in number";
    for (size_t i = 0; i < std::min(recs.size(), calls.size()); ++i) out.emplace_back(recs[i], calls[i]);
    return out;
}

// Frame by frame: qualname and file exact; the line is the line being run
// (where the resolver decodes it) or the code object's first line.
void expect_frames(const nlohmann::json& got, const nlohmann::json& want, size_t n, const std::string& site) {
    for (size_t i = 0; i < n; ++i) {
        SCOPED_TRACE(site + " frame " + std::to_string(i));
        const auto& g = got[i];
        const auto& w = want[i];
        EXPECT_EQ(g.value("qualname", ""), w["qualname"].get<std::string>());
        EXPECT_EQ(g.value("file", ""), w["file"].get<std::string>());
        const int line = g.value("line", -1);
        EXPECT_TRUE(line == w["line"].get<int>() || line == w["first"].get<int>())
            << "line " << line << ", want " << w["line"] << " (current) or " << w["first"] << " (first line)";
    }
}

const nlohmann::json* plan_of(const SitesRun& s, const std::string& site) {
    for (const auto& p : s.plan)
        if (p["site"] == site) return &p;
    return nullptr;
}

// The main thread's recursion record: its `depth` innermost frames exact,
// flagged truncated, nothing failed to read.
void expect_main_recursion_cut_at(const SitesRun& s, int depth) {
    int checked = 0;
    for (auto [rec, call] : pairs_on(s, s.report["pid"].get<int>())) {
        if ((*call)["call"] != "recursion") continue;
        const auto& got = (*rec)["py_stack"];
        ASSERT_EQ(got.size(), static_cast<size_t>(depth)) << got.dump(1).substr(0, 3000);
        EXPECT_TRUE(rec->value("py_stack_truncated", false)) << "a cut stack says so";
        EXPECT_FALSE(rec->value("py_stack_partial", false));
        expect_frames(got, (*call)["stack"], depth, "recursion");
        ++checked;
    }
    EXPECT_EQ(checked, 1);
}

class PyStack : public ::testing::TestWithParam<Interp> {};

// Every site but the recursion: the whole stack, exactly as the interpreter
// saw it, innermost first, not truncated; the innermost frames are the
// qualnames the workload announced (nested closures, Worker.method, the
// closure over self, the generator under its caller, the second thread's
// thread_body under Thread.run, and a call after a dlopen: a loader change
// must not cost the tracer its view of the interpreter).
TEST_P(PyStack, ExactQualnamesFilesAndLinesAtEachCallSite) {
    const Interp& in = GetParam();
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {"--py-depth", std::to_string(kPyDepth)});
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    int checked = 0;
    for (int tid : s.report["tids"].get<std::vector<int>>()) {
        for (auto [rec, call] : pairs_on(s, tid)) {
            const std::string site = (*call)["call"].get<std::string>();
            if (site == "recursion") continue;
            SCOPED_TRACE(in.name + " site " + site);
            ASSERT_TRUE(rec->contains("py_stack")) << rec->dump(1);
            const auto& got = (*rec)["py_stack"];
            const auto& want = (*call)["stack"];
            EXPECT_EQ(got.size(), want.size()) << got.dump(1);
            EXPECT_FALSE(rec->value("py_stack_truncated", false));
            EXPECT_FALSE(rec->value("py_stack_partial", false));
            expect_frames(got, want, std::min(got.size(), want.size()), site);
            const nlohmann::json* plan = plan_of(s, site);
            ASSERT_NE(plan, nullptr);
            const auto innermost = (*plan)["innermost"].get<std::vector<std::string>>();
            for (size_t i = 0; i < innermost.size() && i < got.size(); ++i)
                EXPECT_EQ(got[i].value("qualname", ""), innermost[i]) << "frame " << i;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 6) << "nested, method, closure_self, generator, thread, after_dlopen";
}

// recurse() 200 frames deep under --py-depth 40: the 40 innermost frames,
// each recurse() with its file and line, flagged truncated -- not a wrong
// or partial stack.
TEST_P(PyStack, DeepRecursionTruncatedAtPyDepth) {
    const Interp& in = GetParam();
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {"--py-depth", std::to_string(kPyDepth)});
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    int checked = 0;
    for (int tid : s.report["tids"].get<std::vector<int>>()) {
        for (auto [rec, call] : pairs_on(s, tid)) {
            if ((*call)["call"] != "recursion") continue;
            const auto& got = (*rec)["py_stack"];
            ASSERT_EQ(got.size(), static_cast<size_t>(kPyDepth)) << got.dump(1).substr(0, 3000);
            EXPECT_TRUE(rec->value("py_stack_truncated", false)) << "a cut stack says so";
            EXPECT_FALSE(rec->value("py_stack_partial", false));
            ASSERT_GT((*call)["stack"].size(), static_cast<size_t>(kRecursion));
            expect_frames(got, (*call)["stack"], kPyDepth, "recursion");
            ++checked;
        }
    }
    EXPECT_EQ(checked, 1);
}

// The same recursion under the deepest --py-depth: 128 recurse() frames
// are more than one copy of the data stack (the walker refills it from
// below) and, past the thread's first 16 KiB chunk, frames of an older chunk
// read one by one: the same exact frames whichever way each was read.
TEST_P(PyStack, DeepestWalkReadsFramesBeyondOneStackCopy) {
    const Interp& in = GetParam();
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {"--py-depth", std::to_string(kMaxPyDepth)});
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    expect_main_recursion_cut_at(s, kMaxPyDepth);
}

// A thread that never ran Python (pthread_create straight into
// ncclCommDestroy, like an NCCL proxy or gloo worker) has no thread state:
// its record says "py_stack": [], not garbage and not absent.
TEST_P(PyStack, ThreadWithoutPythonHasEmptyStack) {
    const Interp& in = GetParam();
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {"--py-depth", std::to_string(kPyDepth)});
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    const auto tids = s.report["tids"].get<std::set<int>>();
    int native = 0;
    for (const auto& r : s.records) {
        if (tids.count(r.tid)) continue;
        ++native;
        EXPECT_EQ(r.rec->value("name", ""), "ncclCommDestroy");
        ASSERT_TRUE(r.rec->contains("py_stack")) << "a Python process's record carries a stack field\n"
                                                 << r.rec->dump(1);
        EXPECT_EQ((*r.rec)["py_stack"], nlohmann::json::array()) << r.rec->dump(1);
        EXPECT_FALSE(r.rec->value("py_stack_truncated", false));
        EXPECT_FALSE(r.rec->value("py_stack_partial", false));
    }
    EXPECT_EQ(native, 1) << "one call from the thread without Python";
}

std::vector<Interp> interpreters() {
    return {
        {"debian_python3_11", "/usr/bin/python3.11", false, false},
        {"trixie_python3_13", "/usr/bin/python3.13", true, false},
        {"pyenv_3_10_13", "/root/.pyenv/versions/3.10.13/bin/python3", false, true},
        {"pyenv_3_11_7", "/root/.pyenv/versions/3.11.7/bin/python3", false, true},
        {"pyenv_3_12_1", "/root/.pyenv/versions/3.12.1/bin/python3", false, true},
        {"pyenv_3_13_0", "/root/.pyenv/versions/3.13.0/bin/python3", false, true},
    };
}

INSTANTIATE_TEST_SUITE_P(Interpreters, PyStack, ::testing::ValuesIn(interpreters()),
                         [](const ::testing::TestParamInfo<Interp>& i) { return i.param.name; });

// Without --py-depth the walk stops at 64 frames (the documented default).
TEST(PyStackDefaults, RecursionTruncatedAt64FramesByDefault) {
    const Interp in = interpreters()[0];
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {});
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    expect_main_recursion_cut_at(s, kDefaultPyDepth);
}

// A container's libraries often live on its own mounts (a volume, a bind
// of /opt): the stub on a bind mount of the job's private namespace, which
// /proc/PID/maps names by a path the host cannot open, is probed all the same
// and its records carry their stacks.
TEST(PyStackInRoot, LibraryOnTheJobsOwnMountIsProbed) {
    const Interp in = interpreters()[1];
    REQUIRE_INTERP(in);
    auto s = run_sites(in, {"--py-depth", std::to_string(kPyDepth)}, true);
    expect_clean_run(s);
    if (HasFatalFailure()) return;
    for (const auto& r : s.records) EXPECT_TRUE(r.rec->contains("py_stack")) << r.rec->dump(1);
}

// A record with a stack wakes commdbg at most once in 5 ms (bpf/python/
// context.h); one that comes sooner after the last wake-up announces
// nothing.  commdbg reads it all the same within about that long, while the
// code it names lives: each burst's second call, 2 ms after its first, is
// named although burst_K's code object is freed 25 ms later.  (It once
// waited for the next poll, 50 ms at most in `commdbg run`, and a job's last collectives before its
// interpreter's finalization freed __main__'s code lost their names.)
TEST(PyStackNaming, RecordsNoWakeUpAnnouncedAreNamedWhileTheirCodeLives) {
    const Interp in = interpreters()[0];
    REQUIRE_INTERP(in);
    constexpr int kBursts = 6;
    TempDir tmp;
    const std::string job = std::string(SOURCE_DIR) + "/tests/testprogs/py_trailing_records.py";
    auto r = run({commdbg_bin(), "run", "--probes", "nccl", "--json", tmp.path("out.json"), "--", in.exe, job,
                  std::to_string(kBursts), "25", "--lib", std::string(STUB_NCCL_DIR) + "/libnccl.so.2"},
                 {}, 120);
    ASSERT_EQ(r.status, 0) << r.err;
    auto bursts = workload_lines(r.out, "burst");
    auto ends = workload_lines(r.out, "calls_per_burst");
    ASSERT_EQ(bursts.size(), static_cast<size_t>(kBursts)) << r.out;
    ASSERT_EQ(ends.size(), 1u) << r.out;
    auto procs = processes_of(read_json(tmp.path("out.json")));
    const nlohmann::json* p = process_by_pid(procs, ends[0]["pid"].get<int>());
    ASSERT_NE(p, nullptr) << "the job's pid is not in the dump";
    std::vector<NcclRecord> recs;
    collect_allreduce((*p)["records"], recs);
    std::sort(recs.begin(), recs.end(), [](const NcclRecord& a, const NcclRecord& b) { return a.start_ns < b.start_ns; });
    ASSERT_EQ(recs.size(), static_cast<size_t>(2 * kBursts));
    for (size_t i = 0; i < recs.size(); ++i) {
        const nlohmann::json& want = bursts[i / 2];
        const nlohmann::json& stack = recs[i].rec->value("py_stack", nlohmann::json::array());
        SCOPED_TRACE("burst " + std::to_string(i / 2) + " call " + std::to_string(i % 2) + ": " + stack.dump());
        ASSERT_FALSE(stack.empty());
        EXPECT_EQ(stack[0].value("qualname", ""), want["qualname"].get<std::string>());
        EXPECT_EQ(stack[0].value("file", ""), want["file"].get<std::string>());
    }
}

}  // namespace
}  // namespace commdbg::e2e
