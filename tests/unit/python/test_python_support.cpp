// SPDX-License-Identifier: Apache-2.0
// PythonSupport without BPF: a fake PyMaps records what would be written to
// the kernel's maps.  Discovery is scripted (synthetic results, for the
// retries and refusals) or real: interpreters this test spawns (reading a
// child of the same uid needs no privilege) whose script says from inside
// what the resolver and the kernel should then be told.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python_support.hpp"
#include "test_proc.hpp"

using namespace commdbg;
using namespace commdbg::python;
using nlohmann::json;
using Status = PyDiscovery::Status;

namespace {

struct Write {
    enum Kind { Config, CodeKinds, Clear } kind;
    uint32_t pid = 0;
    cd_py_cfg cfg{};                   // Config
    std::optional<cd_py_codes> codes;  // CodeKinds: nullopt when told "none"
};

// Records every write; refuses configs while `refuse` is set, as a full or
// failing map would.
class FakeMaps final : public PyMaps {
public:
    Result<bool> write_config(uint32_t pid, const cd_py_cfg& cfg) override {
        writes.push_back({Write::Config, pid, cfg, std::nullopt});
        if (!refuse.empty()) return Result<bool>::fail(refuse);
        return true;
    }
    void write_code_kinds(uint32_t pid, const cd_py_codes* codes) override {
        writes.push_back({Write::CodeKinds, pid, {}, codes ? std::optional(*codes) : std::nullopt});
    }
    void clear(uint32_t pid) override { writes.push_back({Write::Clear, pid, {}, std::nullopt}); }

    std::vector<Write> of(Write::Kind k) const {
        std::vector<Write> out;
        std::copy_if(writes.begin(), writes.end(), std::back_inserter(out), [&](const Write& w) { return w.kind == k; });
        return out;
    }
    std::vector<Write> writes;
    std::string refuse;
};

bool same(const cd_py_cfg& a, const cd_py_cfg& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Answers in turn, the last one again and again; counts the calls.
struct ScriptedDiscovery {
    std::vector<PyDiscovery> answers;
    int calls = 0;
    PythonSupport::Discover fn() {
        return [this](int) { return answers[std::min<size_t>(calls++, answers.size() - 1)]; };
    }
};

PyDiscovery failed(Status s, std::string reason) {
    PyDiscovery d;
    d.status = s;
    d.reason = std::move(reason);
    return d;
}

// A layout py_walk_config accepts (a key within glibc's first block), with
// a runtime address to recognise it by.
PyDiscovery synthetic_supported() {
    PyDiscovery d;
    d.status = Status::supported;
    d.layout.major = 3, d.layout.minor = 12;
    d.layout.key = 3, d.layout.tls_keys = 32, d.layout.tls_stride = 16, d.layout.tls_base = 0x310;
    d.layout.runtime_addr = 0x5eed000;
    return d;
}

// A pid nobody has now (a child already reaped): the resolver adopting a
// synthetic discovery for it reads nothing real.
uint32_t gone_pid() {
    pid_t c = fork();
    if (c == 0) _exit(0);
    waitpid(c, nullptr, 0);
    return static_cast<uint32_t>(c);
}

std::string no_stacks(uint32_t pid, const std::string& why) {
    return "no Python stacks for pid " + std::to_string(pid) + ": " + why;
}

class PythonSupportScripted : public ::testing::Test {
protected:
    // `n` setups; the notes they returned, by call index.
    std::vector<std::pair<int, std::string>> setups(int n) {
        std::vector<std::pair<int, std::string>> notes;
        for (int i = 0; i < n; ++i)
            if (auto note = py_.setup(pid_)) notes.emplace_back(i, *note);
        return notes;
    }
    const uint32_t pid_ = gone_pid();
    FakeMaps maps_;
    ScriptedDiscovery disc_;
    PySupportOptions opts_{.stacks = true, .depth = 7};
    PythonSupport py_{maps_, opts_, disc_.fn()};
};

constexpr int kMax = static_cast<int>(PythonSupport::kMaxTries);

TEST_F(PythonSupportScripted, AnInterpreterNotYetInitialisedIsTriedKMaxTimesAndNotedOnceAtTheLast) {
    disc_.answers = {failed(Status::error, "its thread-state key is not set yet")};
    auto notes = setups(kMax + 5);
    EXPECT_EQ(disc_.calls, kMax) << "retries are bounded";
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].first, kMax - 1) << "noted when given up, not at every try";
    EXPECT_EQ(notes[0].second, no_stacks(pid_, "its thread-state key is not set yet"));
    EXPECT_TRUE(maps_.writes.empty()) << "nothing reaches the kernel for a failed discovery";
    ASSERT_NE(py_.process(pid_), nullptr);
    EXPECT_FALSE(py_.process(pid_)->ready);
    EXPECT_EQ(py_.process(pid_)->tries, PythonSupport::kMaxTries);
}

TEST_F(PythonSupportScripted, ANonPythonProcessIsTriedKMaxTimesNeverNotedNorWritten) {
    disc_.answers = {failed(Status::not_python, "no CPython")};
    EXPECT_TRUE(setups(kMax + 3).empty());
    EXPECT_EQ(disc_.calls, kMax);
    EXPECT_TRUE(maps_.writes.empty());
    EXPECT_FALSE(py_.process(pid_)->ready);
}

TEST_F(PythonSupportScripted, AnUnsupportedInterpreterIsNotedAtOnceAndNotTriedAgain) {
    disc_.answers = {failed(Status::unsupported, "CPython 3.9 is not supported"), synthetic_supported()};
    auto notes = setups(4);
    EXPECT_EQ(disc_.calls, 1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].first, 0);
    EXPECT_EQ(notes[0].second, no_stacks(pid_, "CPython 3.9 is not supported"));
    EXPECT_TRUE(maps_.writes.empty());
    EXPECT_FALSE(py_.process(pid_)->ready);
}

TEST_F(PythonSupportScripted, OnceInitialisedTheConfigIsWrittenOnceAndTheResolverAdoptsTheDiscovery) {
    const PyDiscovery ok = synthetic_supported();
    disc_.answers = {failed(Status::error, "not yet"), failed(Status::error, "not yet"), ok};
    EXPECT_TRUE(setups(6).empty());
    EXPECT_EQ(disc_.calls, 3) << "not discovered again once ready";
    ASSERT_EQ(maps_.writes.size(), 2u);
    // What an earlier image of the pid taught goes first, then the config.
    EXPECT_EQ(maps_.writes[0].kind, Write::CodeKinds);
    EXPECT_FALSE(maps_.writes[0].codes.has_value());
    ASSERT_EQ(maps_.writes[1].kind, Write::Config);
    EXPECT_EQ(maps_.writes[1].pid, pid_);
    auto want = py_walk_config(ok.layout, opts_.depth);
    ASSERT_TRUE(want) << want.error();
    EXPECT_TRUE(same(maps_.writes[1].cfg, *want));
    EXPECT_EQ(maps_.writes[1].cfg.max_frames, 7u) << "the session's depth";
    const PyProcess* p = py_.process(pid_);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->ready);
    EXPECT_TRUE(same(p->cfg, *want));
    EXPECT_EQ(py_.resolver().discovery(pid_).layout.runtime_addr, ok.layout.runtime_addr)
        << "the resolver uses the session's discovery, not one of its own";
}

TEST_F(PythonSupportScripted, AConfigTheKernelRefusesIsNotedAndGivenUp) {
    maps_.refuse = "commdbg: enabling Python stacks for pid 1: No space left on device";
    disc_.answers = {synthetic_supported()};
    auto notes = setups(3);
    EXPECT_EQ(disc_.calls, 1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].second, no_stacks(pid_, maps_.refuse));
    EXPECT_FALSE(py_.process(pid_)->ready);
    EXPECT_EQ(py_.process(pid_)->tries, PythonSupport::kMaxTries);
    const size_t before = maps_.writes.size();
    py_.retrace(pid_);
    EXPECT_EQ(maps_.writes.size(), before) << "not ready: nothing to rewrite";
}

TEST_F(PythonSupportScripted, ALayoutTheWalkerCannotUseIsNotedAndNoConfigWritten) {
    PyDiscovery d = synthetic_supported();
    d.layout.key = d.layout.tls_keys + 8;  // past glibc's first block of key slots
    disc_.answers = {d};
    auto notes = setups(3);
    EXPECT_EQ(disc_.calls, 1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].second, no_stacks(pid_, py_walk_config(d.layout, opts_.depth).error()));
    EXPECT_TRUE(maps_.of(Write::Config).empty());
    EXPECT_FALSE(py_.process(pid_)->ready);
}

TEST_F(PythonSupportScripted, RetraceRewritesTheConfigOnlyOnceReady) {
    disc_.answers = {failed(Status::error, "not yet"), synthetic_supported()};
    (void)py_.setup(pid_);
    py_.retrace(pid_);
    EXPECT_TRUE(maps_.writes.empty());
    (void)py_.setup(pid_);
    ASSERT_EQ(maps_.of(Write::Config).size(), 1u);
    py_.retrace(pid_);
    auto configs = maps_.of(Write::Config);
    ASSERT_EQ(configs.size(), 2u) << "traced anew: the kernel's flag comes back with the config";
    EXPECT_TRUE(same(configs[1].cfg, py_.process(pid_)->cfg));
}

TEST_F(PythonSupportScripted, WithholdingClearsTheMapsAndStopsWalking) {
    disc_.answers = {synthetic_supported()};
    (void)py_.setup(pid_);
    ASSERT_TRUE(py_.process(pid_)->ready);
    py_.withhold(pid_);
    ASSERT_FALSE(maps_.writes.empty());
    EXPECT_EQ(maps_.writes.back().kind, Write::Clear);
    EXPECT_EQ(maps_.writes.back().pid, pid_);
    EXPECT_FALSE(py_.process(pid_)->ready);
    const size_t before = maps_.writes.size();
    py_.retrace(pid_);
    EXPECT_EQ(maps_.writes.size(), before) << "a withheld process gets no config back";
}

TEST_F(PythonSupportScripted, AForgottenProcessStartsOverWhenSetUpAgain) {
    disc_.answers = {failed(Status::unsupported, "no")};
    (void)py_.setup(pid_);
    py_.exited(pid_);
    EXPECT_TRUE(py_.process(pid_)->exited);
    py_.clear(pid_);
    ASSERT_EQ(maps_.writes.size(), 1u);
    EXPECT_EQ(maps_.writes[0].kind, Write::Clear);
    py_.forget(pid_);
    EXPECT_EQ(py_.process(pid_), nullptr);
    disc_.answers = {synthetic_supported()};
    disc_.calls = 0;
    EXPECT_EQ(py_.setup(pid_), std::nullopt);
    EXPECT_EQ(disc_.calls, 1) << "a new process of that pid is discovered anew";
    EXPECT_TRUE(py_.process(pid_)->ready);
}

TEST(PythonSupport, WithStacksOffNothingIsDiscoveredOrWritten) {
    FakeMaps maps;
    ScriptedDiscovery disc{{synthetic_supported()}};
    PythonSupport py(maps, {.stacks = false}, disc.fn());
    const uint32_t pid = gone_pid();
    EXPECT_EQ(py.setup(pid), std::nullopt);
    EXPECT_EQ(disc.calls, 0);
    EXPECT_EQ(py.process(pid), nullptr);
    EXPECT_TRUE(maps.writes.empty());
}

// ---- on real interpreters -------------------------------------------------

// A torch-free record_function (its file named like torch's, which is how
// the resolver knows it), an instance, and the order of its attributes as
// CPython keeps them (3.11: the shared keys' order, the kernel's index).
const char* const kScript = R"py(
import json, os, sys, time, types

def fake_module(name, src="", file="<none>"):
    m = types.ModuleType(name)
    sys.modules[name] = m
    exec(compile(src, file, "exec"), m.__dict__)
    return m

PROFILER = '''
class record_function:
    def __init__(self, name):
        self.handle = None
        self.name = name

    def __enter__(self):
        return self
'''

for n in ("torch", "torch.autograd"):
    fake_module(n)
rf_cls = fake_module("torch.autograd.profiler", PROFILER, "/fake/site/torch/autograd/profiler.py").record_function
rf = rf_cls("my-scope")
order = list(vars(rf_cls("probe")))


def plain(a):
    return a


def no_args():
    return 1


print("PYSUPPORT " + json.dumps({
    "pid": os.getpid(), "rf": id(rf), "rf_type": id(rf_cls), "enter": id(rf_cls.__enter__.__code__),
    "plain": id(plain.__code__), "no_args": id(no_args.__code__), "order": order}), flush=True)
time.sleep(3600)
)py";

// `pyenv prefix VERSION`'s python3, or why there is none.
std::string find_pyenv(const char* version, std::string& path) {
    const char* home = std::getenv("HOME");
    for (std::string pyenv : {std::string("pyenv"), std::string(home ? home : "/root") + "/.pyenv/bin/pyenv"}) {
        auto r = testproc::run({pyenv, "prefix", version}, {}, 30);
        if (r.status != 0) continue;
        path = r.out.substr(0, r.out.find('\n')) + "/bin/python3";
        if (access(path.c_str(), X_OK) == 0) return {};
    }
    return std::string("no pyenv CPython ") + version + " here (pyenv prefix " + version + ")";
}

// The script running under pyenv's `version`, and what it said of itself.
class LivePython {
public:
    explicit LivePython(const char* version) {
        std::string py;
        if (skip = find_pyenv(version, py); !skip.empty()) return;
        char tmpl[] = "/tmp/commdbg-pysupport-XXXXXX";
        dir_ = mkdtemp(tmpl);
        std::ofstream(dir_ + "/support.py") << kScript;
        proc_ = std::make_unique<testproc::Background>(std::vector<std::string>{py, dir_ + "/support.py"});
        line = proc_->wait_for_line("PYSUPPORT", 60);
        if (line.find("PYSUPPORT {") != std::string::npos) self = json::parse(line.substr(line.find('{')));
    }
    ~LivePython() {
        proc_.reset();
        if (!dir_.empty()) std::filesystem::remove_all(dir_);
    }
    uint32_t pid() const { return self["pid"].get<uint32_t>(); }
    uint64_t id(const char* k) const { return self[k].get<uint64_t>(); }
    // A frame of `code` as the kernel hands it (no instruction in particular).
    cd_py_frame frame(const char* code, uint64_t self_obj = 0, uint64_t self_type = 0) const {
        return cd_py_frame{id(code), self_obj, self_type, 0};
    }
    cd_py_frame enter_frame() const { return frame("enter", id("rf"), id("rf_type")); }

    std::string skip;  // why the test skips
    std::string line;
    json self;

private:
    std::string dir_;
    std::unique_ptr<testproc::Background> proc_;
};

#define START_PYTHON(var, version)                                                             \
    LivePython var(version);                                                                   \
    if (!var.skip.empty()) GTEST_SKIP() << var.skip;                                           \
    ASSERT_FALSE(var.self.is_null()) << "the script did not start: " << var.line;

TEST(PythonSupportLive, ARealInterpreterGetsTheConfigItsDiscoveryGives) {
    START_PYTHON(py, "3.12");
    FakeMaps maps;
    PythonSupport support(maps, {.stacks = true, .depth = 20});
    EXPECT_EQ(support.setup(py.pid()), std::nullopt);
    const PyDiscovery d = discover_python(static_cast<int>(py.pid()));
    ASSERT_TRUE(d.ok()) << d.reason;
    auto want = py_walk_config(d.layout, 20);
    ASSERT_TRUE(want) << want.error();
    auto configs = maps.of(Write::Config);
    ASSERT_EQ(configs.size(), 1u);
    EXPECT_EQ(configs[0].pid, py.pid());
    EXPECT_TRUE(same(configs[0].cfg, *want));
    EXPECT_TRUE(support.process(py.pid())->ready);
    EXPECT_EQ(support.process(py.pid())->tries, 1u);
    EXPECT_EQ(support.setup(py.pid()), std::nullopt);
    EXPECT_EQ(maps.of(Write::Config).size(), 1u) << "written once";
}

TEST(PythonSupportLive, CodeKindsOfNamedFramesAreToldOnlyForWalkedLiveProcesses) {
    START_PYTHON(py, "3.12");
    FakeMaps maps;
    PythonSupport support(maps, {});
    // Named before the kernel walks it (the resolver discovers it itself): not told.
    ASSERT_TRUE(support.resolver().frame(py.pid(), py.frame("plain")).known);
    support.tell_code_kinds();
    EXPECT_TRUE(maps.of(Write::CodeKinds).empty());

    ASSERT_EQ(support.setup(py.pid()), std::nullopt);
    const size_t cleared = maps.of(Write::CodeKinds).size();  // setup's "none" for an earlier image
    support.begin_batch();
    ASSERT_TRUE(support.resolver().frame(py.pid(), py.frame("plain")).known);
    ASSERT_EQ(support.resolver().frame(py.pid(), py.enter_frame()).kind, PyFrameKind::RecordFunctionEnter);
    support.tell_code_kinds();
    auto told = maps.of(Write::CodeKinds);
    ASSERT_EQ(told.size(), cleared + 1);
    ASSERT_TRUE(told.back().codes.has_value());
    EXPECT_EQ(told.back().pid, py.pid());
    EXPECT_EQ(cd_py_code_lookup(&*told.back().codes, py.id("plain")), static_cast<uint32_t>(CD_CODE_PLAIN));
    EXPECT_EQ(cd_py_code_lookup(&*told.back().codes, py.id("enter")), static_cast<uint32_t>(CD_CODE_SELF));
    support.tell_code_kinds();
    EXPECT_EQ(maps.of(Write::CodeKinds).size(), cleared + 1) << "unchanged: not told again";

    support.exited(py.pid());
    ASSERT_TRUE(support.resolver().frame(py.pid(), py.frame("no_args")).known);
    support.tell_code_kinds();
    EXPECT_EQ(maps.of(Write::CodeKinds).size(), cleared + 1) << "an exited process is told nothing";
}

TEST(PythonSupportLive, ARecordFunctionFrameTeachesTheKernelWhereItsLabelIs) {
    START_PYTHON(py, "3.11");
    FakeMaps maps;
    PythonSupport support(maps, {});
    const std::vector<cd_py_frame> stack = {py.frame("plain", 1, 2), py.enter_frame()};
    support.learn_scope_label(py.pid(), stack);
    EXPECT_TRUE(maps.writes.empty()) << "not walked yet: nothing to teach";

    ASSERT_EQ(support.setup(py.pid()), std::nullopt);
    const cd_py_cfg first = support.process(py.pid())->cfg;
    // Past the innermost CD_SCOPE_LABEL_FRAMES the kernel would not look: neither does this.
    std::vector<cd_py_frame> deep(CD_SCOPE_LABEL_FRAMES, py.frame("plain", 1, 2));
    deep.push_back(py.enter_frame());
    support.learn_scope_label(py.pid(), deep);
    EXPECT_EQ(maps.of(Write::Config).size(), 1u);
    EXPECT_EQ(support.process(py.pid())->label_tries, 0u);

    support.learn_scope_label(py.pid(), stack);
    auto configs = maps.of(Write::Config);
    ASSERT_EQ(configs.size(), 2u);
    const auto order = py.self["order"].get<std::vector<std::string>>();
    const auto name_at = std::find(order.begin(), order.end(), "name") - order.begin();
    EXPECT_EQ(configs[1].cfg.rf_type, py.id("rf_type"));
    EXPECT_EQ(configs[1].cfg.rf_name_index, static_cast<uint32_t>(name_at)) << "the instances' slot of `name`";
    cd_py_cfg rest = configs[1].cfg;
    rest.rf_type = first.rf_type, rest.rf_name_index = first.rf_name_index;
    EXPECT_TRUE(same(rest, first)) << "only the label's fields change";
    EXPECT_TRUE(same(support.process(py.pid())->cfg, configs[1].cfg));
    support.learn_scope_label(py.pid(), stack);
    EXPECT_EQ(maps.of(Write::Config).size(), 2u) << "learned once";
}

TEST(PythonSupportLive, ALabelConfigTheKernelRefusesIsTriedAgainAtTheNextScope) {
    START_PYTHON(py, "3.11");
    FakeMaps maps;
    PythonSupport support(maps, {});
    ASSERT_EQ(support.setup(py.pid()), std::nullopt);
    const std::vector<cd_py_frame> stack = {py.enter_frame()};
    maps.refuse = "full";
    support.learn_scope_label(py.pid(), stack);
    EXPECT_EQ(maps.of(Write::Config).size(), 2u);
    EXPECT_EQ(support.process(py.pid())->cfg.rf_type, 0u) << "the kernel does not have it";
    maps.refuse.clear();
    support.learn_scope_label(py.pid(), stack);
    EXPECT_EQ(maps.of(Write::Config).size(), 3u);
    EXPECT_EQ(support.process(py.pid())->cfg.rf_type, py.id("rf_type"));
    EXPECT_EQ(support.process(py.pid())->label_tries, 2u);
}

TEST(PythonSupportLive, WithoutAnInstanceSlotLabelsAreLookedForAtMostKMaxLabelTriesTimes) {
    START_PYTHON(py, "3.12");  // 3.12 keeps no inline-values index the kernel could read
    FakeMaps maps;
    PythonSupport support(maps, {});
    ASSERT_EQ(support.setup(py.pid()), std::nullopt);
    const std::vector<cd_py_frame> stack = {py.enter_frame()};
    for (uint32_t i = 0; i < PythonSupport::kMaxLabelTries + 6; ++i) support.learn_scope_label(py.pid(), stack);
    EXPECT_EQ(maps.of(Write::Config).size(), 1u) << "only setup's";
    EXPECT_EQ(support.process(py.pid())->label_tries, PythonSupport::kMaxLabelTries);
    EXPECT_EQ(support.process(py.pid())->cfg.rf_type, 0u);
}

TEST(PythonSupportLive, AnUnsupportedCPythonIsNotedOnceAndNothingWritten) {
    std::string path;
    if (auto why = find_pyenv("3.9", path); !why.empty()) GTEST_SKIP() << why;
    testproc::Background child({path, "-c", "import time; print('UP', flush=True); time.sleep(3600)"});
    ASSERT_NE(child.wait_for_line("UP").find("UP"), std::string::npos);
    const auto pid = static_cast<uint32_t>(child.pid());
    FakeMaps maps;
    PythonSupport support(maps, {});
    auto note = support.setup(pid);
    const PyDiscovery d = discover_python(child.pid());
    ASSERT_EQ(d.status, Status::unsupported);
    EXPECT_EQ(note, no_stacks(pid, d.reason));
    EXPECT_EQ(support.setup(pid), std::nullopt) << "given up: not noted again";
    EXPECT_EQ(support.process(pid)->tries, PythonSupport::kMaxTries);
    EXPECT_TRUE(maps.writes.empty());
}

TEST(PythonSupportLive, ANonPythonProcessGetsNoNoteAndNoWrites) {
    testproc::Background sleeper({"/bin/sleep", "30"});
    usleep(100 * 1000);
    const auto pid = static_cast<uint32_t>(sleeper.pid());
    FakeMaps maps;
    PythonSupport support(maps, {});
    for (int i = 0; i < kMax + 2; ++i) EXPECT_EQ(support.setup(pid), std::nullopt);
    EXPECT_TRUE(maps.writes.empty());
    EXPECT_FALSE(support.process(pid)->ready);
    EXPECT_EQ(support.process(pid)->tries, PythonSupport::kMaxTries);
}

}  // namespace
