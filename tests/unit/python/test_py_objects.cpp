// SPDX-License-Identifier: Apache-2.0
// LivePyResolver on real interpreters this test spawns (reading a child of
// the same uid needs no privilege): a script builds a module hierarchy (a
// torch-free stand-in for torch.nn.Module, or real torch), instances and
// classes, prints what it knows of them from inside (id()s, qualnames,
// lines) and blocks inside nested module calls.  The resolver must name the
// same things from outside, walking the stack as the kernel does.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "py_config.hpp"
#include "py_objects.hpp"
#include "remote_memory.hpp"
#include "test_proc.hpp"

using namespace commdbg;
using namespace commdbg::python;
using nlohmann::json;

namespace {

// The probe target.  MODE "fake": torch.nn.modules.module and friends are
// stand-ins made with types.ModuleType (their files named like torch's);
// "torch": the real torch.nn.Module, record_function and backward entry.
const char* const kScript = R"py(
import ctypes, gc, json, os, signal, sys, time, types

MODE = sys.argv[1]
FAKE_ROOT = "/fake/site"

def fake_module(name, src="", file="<none>"):
    m = types.ModuleType(name)
    sys.modules[name] = m
    exec(compile(src, file, "exec"), m.__dict__)
    return m

FAKE_MODULE = '''
class Module:
    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        modules = object.__getattribute__(self, "_modules")
        if name in modules:
            return modules[name]
        raise AttributeError(name)

    def _call_impl(self, *args):
        return self.forward(*args)

    __call__ = _call_impl


class Sequential(Module):
    def __init__(self, *mods):
        super().__init__()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m
'''

FAKE_PROFILER = '''
class record_function:
    def __init__(self, name):
        self.name = name
        self.handle = None

    def __enter__(self):
        self.handle = 1
        return self

    def __exit__(self, *exc):
        return False
'''

FAKE_GRAPH = '''
def _engine_run_backward(t, *args):
    return t
'''

if MODE == "fake":
    for n in ("torch", "torch.nn", "torch.nn.modules", "torch.autograd"):
        fake_module(n)
    mm = fake_module("torch.nn.modules.module", FAKE_MODULE, FAKE_ROOT + "/torch/nn/modules/module.py")
    Module, Sequential = mm.Module, mm.Sequential
    record_function = fake_module("torch.autograd.profiler", FAKE_PROFILER,
                                  FAKE_ROOT + "/torch/autograd/profiler.py").record_function
    backward_entry = fake_module("torch.autograd.graph", FAKE_GRAPH,
                                 FAKE_ROOT + "/torch/autograd/graph.py")._engine_run_backward
else:
    try:
        import torch, torch.nn, torch.autograd, torch.autograd.profiler
    except Exception as e:
        print("PYOBJ_SKIP torch does not import: %r" % (e,), flush=True)
        time.sleep(3600)
    Module, Sequential = torch.nn.Module, torch.nn.Sequential
    record_function = torch.autograd.profiler.record_function
    try:
        import torch.autograd.graph
        backward_entry = torch.autograd.graph._engine_run_backward
    except (ImportError, AttributeError):
        backward_entry = torch.autograd.backward  # torch 1.x calls the engine there

# A class named Module that is not torch's.
Impostor = fake_module("notorch.nn", "class Module:\n    pass\n", "/srv/notorch/nn.py").Module


class Mixer(Module):
    def forward(self, x):
        return blocked(x)


class Block(Module):
    def __init__(self):
        super().__init__()
        self.mixer = Mixer()

    def forward(self, x):
        return self.mixer(x)


class Encoder(Module):
    def __init__(self):
        super().__init__()
        self.blocks = Sequential(Block(), Block())


class Model(Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = Mixer()

    def forward(self, x):
        return self.encoder.blocks._modules["1"](x)


class Outer:
    class Inner(Module):
        pass


class Plain:
    def __init__(self):
        self.alpha = 12345678
        self.name = "plain-name"
        self.latin = "caf\u00e9"
        self.greek = "\u03b1\u03b2\u03b3"
        self.emoji = "\U0001f642x"
        self.long = "x" * 600


class Many:
    def __init__(self):
        for i in range(40):  # past the shared keys' 30: a combined dict
            setattr(self, "a%d" % i, i * 1000003)
        self.name = "many-name"


class Slotted:
    __slots__ = ("name",)

    def __init__(self):
        self.name = "slotted"

    def method(self):
        return self


class SlottedChild(Slotted):
    __slots__ = ("extra",)

    def __init__(self):
        super().__init__()
        self.extra = "child-extra"
        self.name = "child-name"


def make_doomed(name, body="    return a\n"):
    ns = {}
    exec(compile("def %s(a):\n%s" % (name, body), "/srv/doomed.py", "exec"), ns)
    return ns[name]


model = Model()
plain, mat, many, slotted = Plain(), Plain(), Many(), Slotted()
slotted_child = SlottedChild()
ints = [0, 7, -3, 2 ** 29, 2 ** 40, True, False]
bound = slotted.method
empty_dict = {}
vars(mat)  # materialized: the dict, no longer the values array
mat.extra = "after-vars"
rf = record_function("my-scope")
inner = Outer.Inner()
impostor = Impostor()
doomed = make_doomed("doomed_fn")
doomed_code = id(doomed.__code__)
# Past pymalloc's 512 bytes: malloc's, whose free list overwrites the object's first words.
doomed_big = make_doomed("doomed_big", "    a = a + 1\n" * 200 + "    return a\n")
kept = []


def qualname(code):
    return getattr(code, "co_qualname", code.co_name)


def on_usr1(sig, frame):
    global doomed, doomed_big
    doomed = None
    gc.collect()
    for i in range(300):  # code objects of the same size: likely to reuse the freed one
        ns = {}
        exec(compile("def other_%d(a):\n    return a\n" % i, "/srv/other.py", "exec"), ns)
        kept.append(ns["other_%d" % i])
    reused = [qualname(f.__code__) for f in kept if id(f.__code__) == doomed_code]
    doomed_big = None  # last: nothing of its size is allocated after it
    gc.collect()
    print("PYFREED " + json.dumps({"reused_by": reused[0] if reused else None}), flush=True)


signal.signal(signal.SIGUSR1, on_usr1)


def truth_frames(f):
    out = []
    while f is not None:
        c = f.f_code
        first = f.f_locals.get(c.co_varnames[0]) if c.co_argcount >= 1 else None
        is_mod = isinstance(first, Module)
        out.append({"code": id(c), "qual": qualname(c), "file": c.co_filename, "line": f.f_lineno,
                    "module": id(first) if is_mod else 0, "cls": type(first).__qualname__ if is_mod else ""})
        f = f.f_back
    return out


def code_facts(fn):
    c = fn.__code__
    return {"code": id(c), "qual": qualname(c), "file": c.co_filename, "first": c.co_firstlineno}


def report():
    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    mods = model.encoder.blocks._modules
    out = {
        "pid": os.getpid(), "tstate": api.PyThreadState_Get(), "frames": truth_frames(sys._getframe(1)),
        "model": id(model), "encoder": id(model.encoder), "block0": id(mods["0"]), "block1": id(mods["1"]),
        "mixer1": id(mods["1"].mixer), "head": id(model.head), "inner": id(inner),
        "types": {n: id(t) for n, t in [("Mixer", Mixer), ("Module", Module), ("Sequential", Sequential),
                                        ("Plain", Plain), ("Impostor", Impostor), ("int", int),
                                        ("Inner", Outer.Inner), ("rf", type(rf))]},
        "plain": id(plain), "mat": id(mat), "many": id(many), "slotted": id(slotted),
        "slotted_child": id(slotted_child), "child_name": id(slotted_child.name),
        "child_extra": id(slotted_child.extra), "slot_name": id(slotted.name),
        "ints": id(ints), "int_ids": [id(i) for i in ints], "bound": id(bound), "empty_dict": id(empty_dict),
        "alpha": id(plain.alpha), "a39": id(many.a39), "modules": id(model._modules),
        "rf": id(rf), "rf_type": id(type(rf)), "rf_enter": code_facts(type(rf).__enter__),
        "backward": code_facts(backward_entry), "plain_init": code_facts(Plain.__init__),
        "doomed": code_facts(doomed), "doomed_big": code_facts(doomed_big),
        "stdlib": code_facts(json.dumps), "frozen": code_facts(sys.modules["_frozen_importlib"]._find_and_load),
    }
    print("PYOBJ " + json.dumps(out), flush=True)


def blocked(x):
    report(); time.sleep(3600)


model(7)
)py";

struct Interpreter {
    const char* name;
    const char* pyenv = nullptr;  // `pyenv prefix` of this version, or
    const char* path = nullptr;   // a fixed path
    const char* mode = "fake";
    bool trixie = false;  // in the trixie root, through tests/trixie_run.sh
};

const Interpreter kInterpreters[] = {
    {"debian_3_11", nullptr, "/usr/bin/python3.11"},
    {"debian_3_11_torch_1_13", nullptr, "/usr/bin/python3.11", "torch"},
    {"pyenv_3_10", "3.10"},
    {"pyenv_3_11", "3.11"},
    {"pyenv_3_12", "3.12"},
    {"pyenv_3_13", "3.13"},
    {"trixie_3_13", nullptr, "python3", "fake", true},
    {"trixie_3_13_torch_2_6", nullptr, "python3", "torch", true},
};

// What does not depend on torch (freed objects, garbage pointers, library
// files) runs once per interpreter, without torch's seconds of import.
const Interpreter kFakeInterpreters[] = {
    {"debian_3_11", nullptr, "/usr/bin/python3.11"}, {"pyenv_3_10", "3.10"}, {"pyenv_3_11", "3.11"},
    {"pyenv_3_12", "3.12"}, {"pyenv_3_13", "3.13"}, {"trixie_3_13", nullptr, "python3", "fake", true},
};

const char* const kTrixieRoot = "/var/cache/commdbg/trixie-root";
const std::string kInRoot = "/commdbg-pyobj";

// An interpreter's path, or why it is not here (the test skips naming it).
std::string find_python(const Interpreter& py, std::string& path) {
    if (py.trixie) {
        if (!std::filesystem::exists(std::string(kTrixieRoot) + "/.commdbg-trixie-root"))
            return std::string("no trixie root at ") + kTrixieRoot + " (make trixie-root)";
        if (geteuid() != 0) return "running python in the trixie root needs root";
        path = py.path;
        return {};
    }
    if (py.path != nullptr) {
        path = py.path;
        return access(path.c_str(), X_OK) == 0 ? "" : path + " is not installed here";
    }
    const char* home = std::getenv("HOME");
    for (std::string pyenv : {std::string("pyenv"), std::string(home ? home : "/root") + "/.pyenv/bin/pyenv"}) {
        auto r = testproc::run({pyenv, "prefix", py.pyenv}, {}, 30);
        if (r.status != 0) continue;
        path = r.out.substr(0, r.out.find('\n')) + "/bin/python3";
        if (access(path.c_str(), X_OK) == 0) return {};
    }
    return std::string("no pyenv CPython ") + py.pyenv + " here (pyenv prefix " + py.pyenv + ")";
}

class ScriptDir {
public:
    ScriptDir() {
        char tmpl[] = "/tmp/commdbg-pyobj-XXXXXX";
        dir_ = mkdtemp(tmpl);
        std::ofstream(dir_ + "/objects.py") << kScript;
    }
    ~ScriptDir() { std::filesystem::remove_all(dir_); }
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
};

template <typename T>
T peek(int pid, uint64_t addr) {
    T v{};
    iovec local{&v, sizeof v}, remote{reinterpret_cast<void*>(addr), sizeof v};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof v)) return T{};
    return v;
}

std::string type_name(int pid, const PyLayout& l, uint64_t type) {
    uint64_t name = peek<uint64_t>(pid, type + l.tp_name);
    std::string s;
    for (char c; s.size() < 64 && (c = peek<char>(pid, name + s.size())) != '\0';) s.push_back(c);
    return s;
}

// The thread's frames as the kernel's walker captures them (events.h,
// cd_py_frame): C-stack frames and 3.13's None frames skipped, `self` only
// for code with arguments (a cell's contents where a closure captured it),
// its type read at capture time.
std::vector<cd_py_frame> walk(int pid, const PyLayout& l, uint64_t tstate) {
    std::vector<cd_py_frame> out;
    uint64_t f = peek<uint64_t>(pid, tstate + l.ts_frame);
    if (l.ts_frame_inner != kPyNoOffset && f != 0) f = peek<uint64_t>(pid, f + l.ts_frame_inner);
    for (int i = 0; i < 64 && f != 0; ++i, f = peek<uint64_t>(pid, f + l.frame_previous)) {
        if (l.frame_owner_cstack != kPyNoOffset && peek<uint8_t>(pid, f + l.frame_owner) == l.frame_owner_cstack)
            continue;
        cd_py_frame p{};
        p.code = peek<uint64_t>(pid, f + l.frame_code);
        if (l.skip_none_code && p.code == l.none_addr) continue;
        if (peek<int32_t>(pid, p.code + l.code_argcount) >= 1) {
            p.self = peek<uint64_t>(pid, f + l.frame_localsplus);
            p.self_type = p.self ? peek<uint64_t>(pid, p.self + l.ob_type) : 0;
            if (p.self_type != 0 && type_name(pid, l, p.self_type) == "cell") {  // self captured by a closure
                p.self = peek<uint64_t>(pid, p.self + l.cell_contents);
                p.self_type = p.self ? peek<uint64_t>(pid, p.self + l.ob_type) : 0;
            }
        }
        p.instr = l.minor == 10 ? static_cast<uint64_t>(static_cast<int64_t>(peek<int32_t>(pid, f + l.frame_instr)))
                                : peek<uint64_t>(pid, f + l.frame_instr);
        out.push_back(p);
    }
    return out;
}

uint64_t u(const json& j) { return j.get<uint64_t>(); }

// A frame as the kernel hands it, for a code object at no instruction in particular.
cd_py_frame at_start(const PyLayout& l, uint64_t code, uint64_t self = 0, uint64_t self_type = 0) {
    return cd_py_frame{code, self, self_type, l.minor == 10 ? ~0ull : 0};  // 3.10: f_lasti -1
}

// One script per interpreter, shared by its tests (torch takes seconds to
// import); each test gets a fresh resolver, so no cache carries over.
struct Child {
    ScriptDir dir;
    std::unique_ptr<testproc::Background> proc;
    std::string skip;  // why the tests skip, or empty
    std::string line;  // the PYOBJ line
};

std::shared_ptr<Child> start(const Interpreter& py) {
    auto c = std::make_shared<Child>();
    std::string path;
    if (c->skip = find_python(py, path); !c->skip.empty()) return c;
    std::vector<std::string> argv = {path, c->dir.dir() + "/objects.py", py.mode};
    if (py.trixie)
        argv = {std::string(SOURCE_DIR) + "/tests/trixie_run.sh", "--bind", c->dir.dir() + ":" + kInRoot, kTrixieRoot,
                path, kInRoot + "/objects.py", py.mode};
    c->proc = std::make_unique<testproc::Background>(argv);
    c->line = c->proc->wait_for_line("PYOBJ", 90);
    if (c->line.empty()) {
        auto r = c->proc->wait(5);
        c->line = "no PYOBJ line; status " + std::to_string(r.status) + ", stderr: " + r.err.substr(0, 3000);
    }
    if (c->line.find("PYOBJ_SKIP") != std::string::npos) c->skip = c->line;
    return c;
}

class PyObjectsOn : public ::testing::TestWithParam<Interpreter> {
protected:
    static std::map<std::string, std::shared_ptr<Child>>& children() {
        static std::map<std::string, std::shared_ptr<Child>> m;
        return m;
    }
    static void TearDownTestSuite() { children().clear(); }

    void SetUp() override {
        const Interpreter& py = GetParam();
        auto& c = children()[py.name];
        if (!c) c = start(py);
        child_ = c;
        if (!c->skip.empty()) GTEST_SKIP() << c->skip;
        ASSERT_NE(c->line.find("PYOBJ {"), std::string::npos) << "the script did not start: " << c->line;
        self_ = json::parse(c->line.substr(c->line.find('{')));
        pid_ = self_["pid"].get<uint32_t>();
        ASSERT_EQ(static_cast<int>(pid_), c->proc->pid());
        ASSERT_TRUE(res_.discovery(pid_).ok()) << res_.discovery(pid_).reason;
        ASSERT_EQ(res_.object_layout_error(pid_), "");
    }
    const PyLayout& layout() { return res_.discovery(pid_).layout; }
    std::string str_attr(const char* obj, const char* name) {
        return res_.str(pid_, res_.attr(pid_, u(self_[obj]), name)).value_or("<none>");
    }

    std::shared_ptr<Child> child_;
    json self_;
    uint32_t pid_ = 0;
    LivePyResolver res_;
};

class PyObjectsFakeOn : public PyObjectsOn {};

TEST_P(PyObjectsOn, NamesEveryFrameOfTheLiveStackWithLinesModulesAndKinds) {
    const auto& truth = self_["frames"];
    std::vector<uint64_t> walked, told;
    for (const auto& t : truth) told.push_back(u(t["code"]));
    std::vector<cd_py_frame> frames;
    // The line comes from report(), just before blocked() sleeps: wait for that.
    for (int i = 0; i < 200 && walked != told; ++i, usleep(20 * 1000)) {
        frames = walk(static_cast<int>(pid_), layout(), u(self_["tstate"]));
        walked.clear();
        for (const auto& f : frames) walked.push_back(f.code);
    }
    ASSERT_EQ(walked, told) << "the kernel-style walk and the script disagree on the stack";
    int module_calls = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
        const auto& t = truth[i];
        SCOPED_TRACE("frame " + std::to_string(i) + ": " + t.dump());
        const PyFrameInfo& info = res_.frame(pid_, frames[i]);
        EXPECT_TRUE(info.known);
        EXPECT_EQ(info.qualname, t["qual"].get<std::string>());
        EXPECT_EQ(info.file, t["file"].get<std::string>());
        EXPECT_EQ(info.line, t["line"].get<uint32_t>()) << "the current line, from co_linetable";
        EXPECT_EQ(info.module, u(t["module"]));
        EXPECT_EQ(info.module_class, t["cls"].get<std::string>());
        const std::string q = info.qualname.substr(info.qualname.rfind('.') + 1);
        const bool call = (q == "_call_impl" || q == "_wrapped_call_impl") &&
                          info.file.ends_with("torch/nn/modules/module.py");
        EXPECT_EQ(info.kind, call ? PyFrameKind::ModuleCall : PyFrameKind::Plain);
        module_calls += call;
        EXPECT_EQ(info.library, info.file.find("/torch/") != std::string::npos);
        EXPECT_EQ(&res_.frame(pid_, frames[i]), &info) << "the same frame resolves to the same entry";
    }
    EXPECT_GE(module_calls, 3) << "Model, Block and Mixer are each called through Module";
    // Innermost first: blocked(), then Mixer.forward on the mixer of block 1.
    EXPECT_EQ(res_.frame(pid_, frames[0]).qualname, "blocked");
    EXPECT_EQ(res_.frame(pid_, frames[1]).module, u(self_["mixer1"]));
    EXPECT_EQ(res_.frame(pid_, frames[1]).module_class, "Mixer");
    EXPECT_EQ(res_.module_path(pid_, u(self_["model"]), res_.frame(pid_, frames[1]).module), "encoder.blocks.1.mixer");
}

// The target's memory, read as ProcessMemory reads it, with each read kept:
// what a batch costs in system calls.
class CountingMemory final : public host::RemoteMemory {
public:
    explicit CountingMemory(int pid) : inner_(pid) {}
    void read_from(int pid) { inner_ = host::ProcessMemory(pid); }  // another process's memory from now on
    std::vector<uint64_t> singles;               // addresses read one by one
    std::vector<std::vector<uint64_t>> batches;  // each read of many ranges at once
    // Those of the batches that read any of `codes` (a type's re-validation
    // reads its two ranges at once too).
    std::vector<std::vector<uint64_t>> batches_of(const std::set<uint64_t>& codes) const {
        std::vector<std::vector<uint64_t>> out;
        for (const auto& b : batches)
            if (std::any_of(b.begin(), b.end(), [&](uint64_t a) { return codes.count(a) != 0; })) out.push_back(b);
        return out;
    }

protected:
    int fetch(uint64_t addr, void* out, size_t n) override {
        singles.push_back(addr);
        return inner_.read(addr, out, n) ? 0 : inner_.last_error();
    }
    size_t fetch_prefix(std::span<const Range> ranges, int& err) override {
        batches.emplace_back();
        for (const Range& r : ranges) batches.back().push_back(r.addr);
        const size_t whole = inner_.read_prefix(ranges);
        err = inner_.last_error();
        return whole;
    }

private:
    host::ProcessMemory inner_;
};

TEST_P(PyObjectsOn, ABatchRevalidatesTheCodeObjectsTheLastOneNamedInOneRead) {
    std::vector<cd_py_frame> frames;
    for (int i = 0; i < 200 && frames.size() != self_["frames"].size(); ++i, usleep(20 * 1000))
        frames = walk(static_cast<int>(pid_), layout(), u(self_["tstate"]));
    ASSERT_EQ(frames.size(), self_["frames"].size());
    std::set<uint64_t> codes;
    for (const auto& f : frames) codes.insert(f.code);
    ASSERT_GE(codes.size(), 4u);

    LivePyResolver res;
    auto counted = std::make_unique<CountingMemory>(static_cast<int>(pid_));
    CountingMemory& mem = *counted;
    res.adopt(pid_, res_.discovery(pid_), std::move(counted));
    std::vector<std::string> first;
    for (const auto& f : frames) first.push_back(res.frame(pid_, f).qualname);
    EXPECT_TRUE(mem.batches_of(codes).empty()) << "the first batch reads each code object itself";

    res.begin_batch();
    const auto batches = mem.batches_of(codes);
    ASSERT_EQ(batches.size(), 1u) << "one read re-validates what the last batch named";
    EXPECT_EQ(std::set<uint64_t>(batches[0].begin(), batches[0].end()), codes);
    const size_t singles_before = mem.singles.size();
    for (size_t i = 0; i < frames.size(); ++i) EXPECT_EQ(res.frame(pid_, frames[i]).qualname, first[i]);
    for (size_t i = singles_before; i < mem.singles.size(); ++i)
        EXPECT_FALSE(codes.count(mem.singles[i])) << std::hex << mem.singles[i] << " read again by itself";

    // A batch that named nothing leaves nothing to re-validate for the next.
    res.begin_batch();
    res.begin_batch();
    EXPECT_EQ(mem.batches_of(codes).size(), 2u);

    // The process gone (its memory now an exited one's): one read says so,
    // not one per code object, and the names validated last stand.
    for (const auto& f : frames) res.frame(pid_, f);
    pid_t exited = fork();
    ASSERT_GE(exited, 0);
    if (exited == 0) _exit(0);
    ASSERT_EQ(waitpid(exited, nullptr, 0), exited);
    mem.read_from(exited);
    res.begin_batch();
    EXPECT_EQ(mem.batches_of(codes).size(), 3u) << "one read, not one per code object";
    for (size_t i = 0; i < frames.size(); ++i) EXPECT_EQ(res.frame(pid_, frames[i]).qualname, first[i]);
}

// A thread's stack named again within a batch is its last stack, not named
// frame by frame: the same frames and the same serial (the model then skips
// interning it), until anything differs: another frame, another thread, the
// next batch.  Frames are named as frame() names them, whichever way.
TEST_P(PyObjectsOn, AThreadsRepeatedStackIsNamedOnceABatch) {
    std::vector<cd_py_frame> frames;
    for (int i = 0; i < 200 && frames.size() != self_["frames"].size(); ++i, usleep(20 * 1000))
        frames = walk(static_cast<int>(pid_), layout(), u(self_["tstate"]));
    ASSERT_EQ(frames.size(), self_["frames"].size());
    ASSERT_GE(frames.size(), 2u);
    LivePyResolver res;
    res.adopt(pid_, res_.discovery(pid_), std::make_unique<host::ProcessMemory>(static_cast<int>(pid_)));
    auto by_frame = [&](const std::vector<cd_py_frame>& fs) {
        std::vector<const PyFrameInfo*> out;
        for (const auto& f : fs) out.push_back(&res.frame(pid_, f));
        return out;
    };
    std::vector<const PyFrameInfo*> named, again;
    const uint64_t first = res.stack(pid_, 7, frames, named);
    EXPECT_EQ(named, by_frame(frames));
    for (const PyFrameInfo* f : named) ASSERT_TRUE(f->known) << f->qualname;
    ASSERT_NE(first, 0u) << "a stack of named frames is kept";
    EXPECT_EQ(res.stack(pid_, 7, frames, again), first);
    EXPECT_EQ(again, named);

    // Another line in the innermost frame: another stack, named anew.
    std::vector<cd_py_frame> moved = frames;
    const auto& top = self_["frames"][0];
    moved[0].instr = at_start(layout(), frames[0].code).instr;
    const uint64_t other = res.stack(pid_, 7, moved, again);
    EXPECT_NE(other, first);
    EXPECT_EQ(again, by_frame(moved));
    EXPECT_EQ(again[0]->line, res.frame(pid_, moved[0]).line);
    EXPECT_NE(again[0]->line, top["line"].get<uint32_t>()) << "the line of the instruction given, not the kept one";
    const uint64_t back = res.stack(pid_, 7, frames, again);
    EXPECT_NE(back, first) << "only the thread's last stack is kept: the first one is named anew";
    EXPECT_NE(back, other);
    EXPECT_EQ(again, named);

    // Another thread with this very stack has its own.
    const uint64_t mine = res.stack(pid_, 7, frames, again);
    const uint64_t theirs = res.stack(pid_, 8, frames, again);
    EXPECT_NE(theirs, mine);
    EXPECT_EQ(again, named);
    EXPECT_EQ(res.stack(pid_, 7, frames, again), mine) << "each thread keeps its own";

    // The next batch re-validates the code objects: not the kept stack.
    res.begin_batch();
    const uint64_t next = res.stack(pid_, 7, frames, again);
    EXPECT_NE(next, mine);
    EXPECT_EQ(again, named);

    // A frame left unnamed is asked again every time: no serial.
    std::vector<cd_py_frame> unknown = frames;
    unknown[1].code = 0x10;
    EXPECT_EQ(res.stack(pid_, 7, unknown, again), 0u);
    EXPECT_FALSE(again[1]->known);
    EXPECT_EQ(res.stack(pid_, 7, unknown, again), 0u);
}

TEST_P(PyObjectsOn, ModulePathsFollowTheModulesDicts) {
    const uint64_t root = u(self_["model"]);
    EXPECT_EQ(res_.module_path(pid_, root, root), "");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["encoder"])), "encoder");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["block0"])), "encoder.blocks.0");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["block1"])), "encoder.blocks.1");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["mixer1"])), "encoder.blocks.1.mixer");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["head"])), "head");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["inner"])), std::nullopt) << "a module outside the tree";
    EXPECT_EQ(res_.module_path(pid_, u(self_["encoder"]), u(self_["mixer1"])), "blocks.1.mixer");
    EXPECT_EQ(res_.module_path(pid_, root, u(self_["mixer1"])), "encoder.blocks.1.mixer") << "cached";
}

TEST_P(PyObjectsOn, TypesHaveTheirNamesAndKnowWhetherTheyAreModules) {
    const auto& t = self_["types"];
    struct Want {
        const char* key;
        const char* name;
        bool heap, module;
    };
    for (const Want& w : {Want{"Mixer", "Mixer", true, true}, Want{"Module", "Module", true, true},
                          Want{"Sequential", "Sequential", true, true}, Want{"Inner", "Outer.Inner", true, true},
                          Want{"Plain", "Plain", true, false}, Want{"Impostor", "Module", true, false},
                          Want{"int", "int", false, false}, Want{"rf", "record_function", true, false}}) {
        SCOPED_TRACE(w.key);
        auto facts = res_.type(pid_, u(t[w.key]));
        ASSERT_TRUE(facts.has_value());
        EXPECT_EQ(facts->name, w.name);
        EXPECT_EQ(facts->heap, w.heap);
        EXPECT_EQ(facts->is_module, w.module);
    }
    EXPECT_EQ(res_.type(pid_, u(self_["plain"])), std::nullopt) << "an instance is not a type";
}

TEST_P(PyObjectsOn, InstanceAttributesFromValuesDictsAndCombinedDicts) {
    EXPECT_EQ(res_.attr(pid_, u(self_["plain"]), "alpha"), u(self_["alpha"]));
    EXPECT_EQ(str_attr("plain", "name"), "plain-name");
    EXPECT_EQ(str_attr("plain", "latin"), "caf\u00e9") << "compact UCS1";
    EXPECT_EQ(str_attr("plain", "greek"), "\u03b1\u03b2\u03b3") << "compact UCS2";
    EXPECT_EQ(str_attr("plain", "emoji"), "\U0001f642x") << "compact UCS4";
    EXPECT_EQ(str_attr("plain", "long"), std::string(kPyMaxString, 'x')) << "bounded";
    EXPECT_EQ(str_attr("mat", "name"), "plain-name") << "after vars(): the materialized dict";
    EXPECT_EQ(str_attr("mat", "extra"), "after-vars");
    EXPECT_EQ(str_attr("many", "name"), "many-name") << "more attributes than shared keys hold";
    EXPECT_EQ(res_.attr(pid_, u(self_["many"]), "a39"), u(self_["a39"]));
    EXPECT_EQ(res_.attr(pid_, u(self_["plain"]), "missing"), 0u);
    EXPECT_EQ(res_.attr(pid_, u(self_["slotted"]), "name"), 0u) << "a slot is not in an instance dict";
    EXPECT_EQ(res_.attr(pid_, u(self_["model"]), "_modules"), u(self_["modules"]));
    EXPECT_EQ(str_attr("rf", "name"), "my-scope");
    EXPECT_EQ(res_.attr(pid_, 0x10, "name"), 0u) << "a garbage pointer";
}

// What torch/ reads of a module's parameters: __slots__ members through the
// MRO, one-digit ints, bools, lists, a bound method's __self__, an empty dict.
TEST_P(PyObjectsOn, SlotsIntsListsAndBoundMethodsReadAsTheInterpreterHasThem) {
    const uint64_t slotted = u(self_["slotted"]), child = u(self_["slotted_child"]);
    EXPECT_EQ(res_.slot(pid_, slotted, "name"), u(self_["slot_name"]));
    EXPECT_EQ(res_.slot(pid_, child, "name"), u(self_["child_name"])) << "a base class's slot";
    EXPECT_EQ(res_.slot(pid_, child, "extra"), u(self_["child_extra"]));
    EXPECT_EQ(res_.slot(pid_, slotted, "method"), 0u) << "a function, not a member descriptor";
    EXPECT_EQ(res_.slot(pid_, slotted, "missing"), 0u);
    EXPECT_EQ(res_.slot(pid_, u(self_["plain"]), "name"), 0u) << "an instance-dict attribute is no slot";

    auto items = res_.list_items(pid_, u(self_["ints"]), 64);
    ASSERT_TRUE(items.has_value());
    ASSERT_EQ(items->size(), self_["int_ids"].size());
    for (size_t i = 0; i < items->size(); ++i) EXPECT_EQ((*items)[i], u(self_["int_ids"][i])) << i;
    EXPECT_EQ(res_.list_items(pid_, u(self_["ints"]), 2)->size(), 2u) << "bounded";
    EXPECT_FALSE(res_.list_items(pid_, u(self_["plain"]), 8).has_value()) << "not a list";
    // 0, 7, -3, 2**29: one digit; 2**40: two (not read); True, False: bools, not ints.
    const std::vector<std::optional<int64_t>> want = {0, 7, -3, int64_t{1} << 29, std::nullopt, std::nullopt,
                                                      std::nullopt};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(res_.small_int(pid_, (*items)[i]), want[i]) << i;
    // And a bool is read as one; an int is none (0 is not False).
    const std::vector<std::optional<bool>> truths = {std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                                     std::nullopt, true, false};
    for (size_t i = 0; i < truths.size(); ++i) EXPECT_EQ(res_.truth(pid_, (*items)[i]), truths[i]) << i;

    EXPECT_EQ(res_.method_self(pid_, u(self_["bound"])), slotted);
    EXPECT_EQ(res_.method_self(pid_, slotted), 0u) << "not a method";
    int n = 0;
    EXPECT_TRUE(res_.dict_items(pid_, u(self_["empty_dict"]), [&](uint64_t, uint64_t) { return ++n, true; }));
    EXPECT_EQ(n, 0) << "an empty dict is read as empty, not as unreadable";
    EXPECT_FALSE(res_.dict_items(pid_, slotted, [](uint64_t, uint64_t) { return true; })) << "not a dict";
}

TEST_P(PyObjectsOn, RecordFunctionBackwardAndPlainFramesAreClassified) {
    const PyLayout& l = layout();
    const auto& enter = self_["rf_enter"];
    const PyFrameInfo& rf = res_.frame(pid_, at_start(l, u(enter["code"]), u(self_["rf"]), u(self_["rf_type"])));
    EXPECT_TRUE(rf.known);
    EXPECT_EQ(rf.kind, PyFrameKind::RecordFunctionEnter);
    EXPECT_EQ(rf.label, "my-scope");
    EXPECT_EQ(rf.qualname, l.minor == 10 ? "__enter__" : "record_function.__enter__");
    EXPECT_EQ(rf.line, enter["first"].get<uint32_t>()) << "no instruction: the first line";
    EXPECT_TRUE(rf.library);
    EXPECT_EQ(rf.module, 0u);

    const PyFrameInfo& bw = res_.frame(pid_, at_start(l, u(self_["backward"]["code"])));
    EXPECT_EQ(bw.kind, PyFrameKind::BackwardEntry) << bw.qualname << " in " << bw.file;

    const auto& init = self_["plain_init"];
    const PyFrameInfo& pi = res_.frame(pid_, at_start(l, u(init["code"]), u(self_["plain"]), u(self_["types"]["Plain"])));
    EXPECT_EQ(pi.kind, PyFrameKind::Plain);
    EXPECT_EQ(pi.qualname, init["qual"].get<std::string>());
    EXPECT_EQ(pi.line, init["first"].get<uint32_t>());
    EXPECT_EQ(pi.module, 0u) << "Plain is not a module";
    EXPECT_FALSE(pi.library);

    // What the kernel is then told: read `self` in a scope's __enter__, mark
    // the autograd entry, read a method's `self` only inside it.
    cd_py_codes told{};
    int tables = 0;
    res_.take_code_tables([&](uint32_t pid, const cd_py_codes& t) { tables += pid == pid_, told = t; });
    ASSERT_EQ(tables, 1);
    EXPECT_EQ(cd_py_code_lookup(&told, u(enter["code"])), static_cast<uint32_t>(CD_CODE_SELF));
    EXPECT_EQ(cd_py_code_lookup(&told, u(self_["backward"]["code"])), static_cast<uint32_t>(CD_CODE_BACKWARD));
    EXPECT_EQ(cd_py_code_lookup(&told, u(init["code"])), static_cast<uint32_t>(CD_CODE_PLAIN));
    res_.take_code_tables([&](uint32_t, const cd_py_codes&) { ++tables; });
    EXPECT_EQ(tables, 1) << "unchanged since: not sent again";
}

// The walker reads the thread state in one window and, on 3.11+, copies the
// data stack the frames live in: on the live interpreter, its tstate's
// datastack_chunk / top / limit are where the config says, the chunk's own
// size agrees, and the innermost frame lies below the top.
TEST_P(PyObjectsOn, WalkConfigCoversTheThreadStateAndItsDataStack) {
    const PyLayout& l = layout();
    auto cfg = py_walk_config(l, CD_DEFAULT_PY_FRAMES);
    ASSERT_TRUE(cfg) << cfg.error();
    std::vector<uint32_t> fields = {cfg->ts_thread_id, cfg->ts_frame};
    if (cfg->ts_stack != kPyNoOffset) fields.insert(fields.end(), {cfg->ts_stack, cfg->ts_stack + 8, cfg->ts_stack + 16});
    for (uint32_t f : fields) {
        EXPECT_GE(f, cfg->ts_lo);
        EXPECT_LE(f + 8, cfg->ts_lo + cfg->ts_span);
    }
    EXPECT_LE(cfg->ts_span, static_cast<uint32_t>(CD_PY_TS_WINDOW));
    EXPECT_GE(cfg->frame_span, std::max(cfg->frame_code, cfg->frame_previous) + 8);
    EXPECT_LE(cfg->frame_span, 128u);
    if (l.minor == 10) {
        EXPECT_EQ(cfg->ts_stack, kPyNoOffset) << "3.10's frames are objects on the heap";
        return;
    }
    ASSERT_NE(cfg->ts_stack, kPyNoOffset);
    const int pid = static_cast<int>(pid_);
    const uint64_t ts = u(self_["tstate"]);
    const uint64_t chunk = peek<uint64_t>(pid, ts + cfg->ts_stack), top = peek<uint64_t>(pid, ts + cfg->ts_stack + 8),
                   limit = peek<uint64_t>(pid, ts + cfg->ts_stack + 16);
    ASSERT_NE(chunk, 0u);
    EXPECT_LT(chunk, top);
    EXPECT_LE(top, limit);
    EXPECT_EQ(peek<uint64_t>(pid, chunk + 8), limit - chunk) << "_PyStackChunk.size: the chunk ends at the limit";
    uint64_t f = peek<uint64_t>(pid, ts + l.ts_frame);
    if (l.ts_frame_inner != kPyNoOffset && f != 0) f = peek<uint64_t>(pid, f + l.ts_frame_inner);
    EXPECT_GE(f, chunk);
    EXPECT_LT(f, top) << "the innermost frame is on the data stack, below its top";
}

TEST_P(PyObjectsFakeOn, StdlibAndFrozenFilesAreLibraryFiles) {
    for (const char* key : {"stdlib", "frozen"}) {
        const auto& c = self_[key];
        const PyFrameInfo& f = res_.frame(pid_, at_start(layout(), u(c["code"])));
        EXPECT_EQ(f.qualname, c["qual"].get<std::string>());
        EXPECT_EQ(f.file, c["file"].get<std::string>());
        EXPECT_TRUE(f.library) << f.file;
    }
    EXPECT_EQ(res_.frame(pid_, at_start(layout(), u(self_["frozen"]["code"]))).file.rfind("<frozen ", 0), 0u);
}

// Pointers into and around live objects, as a garbage `self` or a stale
// code pointer would be: no crash, and the real objects resolve as before.
TEST_P(PyObjectsFakeOn, PointersIntoAndAroundObjectsNeverCrashOrPoisonTheCaches) {
    const PyLayout& l = layout();
    std::vector<uint64_t> bases;
    for (const char* k : {"plain", "model", "many", "rf", "modules"}) bases.push_back(u(self_[k]));
    for (const auto& [k, v] : self_["types"].items()) bases.push_back(u(v));
    for (const char* k : {"plain_init", "rf_enter", "backward"}) bases.push_back(u(self_[k]["code"]));
    size_t known = 0;
    for (uint64_t b : bases) {
        for (int64_t off = -256; off < 1024; off += 8) {
            const uint64_t p = b + static_cast<uint64_t>(off);
            known += res_.frame(pid_, cd_py_frame{p, p, p, p}).known;
            res_.frame(pid_, cd_py_frame{u(self_["plain_init"]["code"]), p, p + 8, 0});
            res_.attr(pid_, p, "name");
            res_.type(pid_, p);
            res_.str(pid_, p);
            res_.module_path(pid_, u(self_["model"]), p);
        }
    }
    RecordProperty("known_at_odd_addresses", static_cast<int>(known));
    const PyFrameInfo& init = res_.frame(pid_, at_start(l, u(self_["plain_init"]["code"])));
    EXPECT_EQ(init.qualname, self_["plain_init"]["qual"].get<std::string>());
    EXPECT_EQ(str_attr("plain", "name"), "plain-name");
    EXPECT_EQ(res_.module_path(pid_, u(self_["model"]), u(self_["mixer1"])), "encoder.blocks.1.mixer");
    EXPECT_TRUE(res_.type(pid_, u(self_["types"]["Mixer"]))->is_module);
}

TEST_P(PyObjectsFakeOn, AnythingButALiveCodeObjectIsUnknown) {
    const PyLayout& l = layout();
    for (uint64_t bad : {uint64_t{0}, uint64_t{0x1000}, u(self_["plain"]), u(self_["types"]["Plain"]),
                         uint64_t{0x7fffdead0000}}) {
        const PyFrameInfo& f = res_.frame(pid_, at_start(l, bad));
        EXPECT_FALSE(f.known) << std::hex << bad;
        EXPECT_EQ(f.qualname, "<unknown>");
    }
}

TEST_P(PyObjectsFakeOn, AFreedCodeObjectIsNotNamedAfterItsOldSelf) {
    const PyLayout& l = layout();
    const cd_py_frame doomed = at_start(l, u(self_["doomed"]["code"]));
    const cd_py_frame big = at_start(l, u(self_["doomed_big"]["code"]));
    ASSERT_EQ(res_.frame(pid_, doomed).qualname, "doomed_fn");
    ASSERT_EQ(res_.frame(pid_, big).qualname, "doomed_big");
    ASSERT_EQ(kill(static_cast<int>(pid_), SIGUSR1), 0);
    auto line = child_->proc->wait_for_line("PYFREED", 60);
    ASSERT_NE(line.find("PYFREED {"), std::string::npos) << line;
    auto freed = json::parse(line.substr(line.find('{')));
    // A later batch of records: what one batch validated it trusts (the
    // kernel saw those frames run that code), the next re-validates.
    res_.begin_batch();
    const PyFrameInfo& after = res_.frame(pid_, doomed);
    EXPECT_NE(after.qualname, "doomed_fn");
    if (freed["reused_by"].is_string()) {
        EXPECT_TRUE(after.known);
        EXPECT_EQ(after.qualname, freed["reused_by"].get<std::string>()) << "the code object there now";
    } else if (!after.known) {
        EXPECT_EQ(after.qualname, "<unknown>");
    }
    RecordProperty("reused_by", freed["reused_by"].dump());
    const PyFrameInfo& big_after = res_.frame(pid_, big);
    EXPECT_FALSE(big_after.known) << big_after.qualname;
    EXPECT_EQ(big_after.qualname, "<unknown>");
    // Nor does the kernel keep a kind for the freed code: its frames' types
    // are read again (or the kind is the new code's, where one lives there).
    cd_py_codes told{};
    res_.take_code_tables([&](uint32_t pid, const cd_py_codes& t) { if (pid == pid_) told = t; });
    EXPECT_EQ(cd_py_code_lookup(&told, big.code), static_cast<uint32_t>(CD_CODE_UNKNOWN));
    if (!after.known) {
        EXPECT_EQ(cd_py_code_lookup(&told, doomed.code), static_cast<uint32_t>(CD_CODE_UNKNOWN));
    }
}

TEST_P(PyObjectsFakeOn, ForgetDropsTheProcessAndALaterUseDiscoversItAgain) {
    const cd_py_frame init = at_start(layout(), u(self_["plain_init"]["code"]));
    EXPECT_TRUE(res_.frame(pid_, init).known);
    res_.forget(pid_);
    EXPECT_TRUE(res_.frame(pid_, init).known);
}

INSTANTIATE_TEST_SUITE_P(Builds, PyObjectsOn, ::testing::ValuesIn(kInterpreters),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Builds, PyObjectsFakeOn, ::testing::ValuesIn(kFakeInterpreters),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PyObjects, ANonPythonProcessResolvesNothing) {
    testproc::Background sleeper({"/bin/sleep", "30"});
    usleep(100 * 1000);
    LivePyResolver res;
    const uint32_t pid = static_cast<uint32_t>(sleeper.pid());
    EXPECT_FALSE(res.frame(pid, cd_py_frame{0x400000, 0, 0, 0}).known);
    EXPECT_EQ(res.module_path(pid, 1, 2), std::nullopt);
    EXPECT_EQ(res.module_path(pid, 1, 1), "");
    EXPECT_EQ(res.discovery(pid).status, PyDiscovery::Status::not_python);
}

// ---- line tables, on bytes these versions emit ----------------------------

TEST(PyLineTable, Format310PairsOfBytecodeAndLineDeltas) {
    // (6 bytes, +1) (0 bytes, +2: no range) (4 bytes, -128: no line) (8 bytes, -1)
    const std::string t = {6, 1, 0, 2, 4, static_cast<char>(-128), 8, static_cast<char>(-1)};
    EXPECT_EQ(py_line_of(10, t, 10, -2), 10u) << "before the first instruction";
    EXPECT_EQ(py_line_of(10, t, 10, 0), 11u);
    EXPECT_EQ(py_line_of(10, t, 10, 4), 11u);
    EXPECT_EQ(py_line_of(10, t, 10, 6), 10u) << "no line: the first line";
    EXPECT_EQ(py_line_of(10, t, 10, 10), 12u);
    EXPECT_EQ(py_line_of(10, t, 10, 100), 10u) << "past the table";
}

TEST(PyLineTable, Format311ShortOneLineNoColumnAndLongEntries) {
    // 0xf0: code 14 (long), 1 unit, line delta +2 (varint 4), end-line 0, columns 1, 5
    // 0xd9: code 11 (one line, +1), 2 units, two column bytes
    // 0x80: code 0 (short, same line), 1 unit, one column byte
    // 0xe8: code 13 (no columns), 1 unit, line delta -1 (varint 3)
    // 0xf8: code 15 (none), 1 unit
    const std::string t = {static_cast<char>(0xf0), 4, 0, 1, 5, static_cast<char>(0xd9), 0, 4,
                           static_cast<char>(0x80), 2, static_cast<char>(0xe8), 3, static_cast<char>(0xf8)};
    EXPECT_EQ(py_line_of(11, t, 20, 0), 22u);
    EXPECT_EQ(py_line_of(11, t, 20, 2), 23u);
    EXPECT_EQ(py_line_of(11, t, 20, 4), 23u);
    EXPECT_EQ(py_line_of(11, t, 20, 6), 23u);
    EXPECT_EQ(py_line_of(11, t, 20, 8), 22u);
    EXPECT_EQ(py_line_of(12, t, 20, 10), 20u) << "no location: the first line";
}

// ---- the caches' bytes bound ------------------------------------------------

// A target shaped to make the resolver hold much: roots whose trees are a
// chain 30 deep of 512-character names with LEAVES more under its end, and
// code objects with 512-character qualnames and 64 KiB line tables.
const char* const kBoundScript = R"py(
import json, os, sys, time

ROOTS, LEAVES, CODES = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

class M:
    def __init__(self):
        self._modules = {}

def name(tag, i):
    return ("%s%d_" % (tag, i)).ljust(512, "n")

roots, leaves, leaf_names = [], [], []
for r in range(ROOTS):
    root = node = M()
    for d in range(30):
        child = M()
        node._modules[name("r%dd" % r, d)] = child
        node = child
    for l in range(LEAVES):
        node._modules[name("r%dl" % r, l)] = M()
    roots.append(root)
    leaf_names.append(name("r%dl" % r, LEAVES - 1))
    leaves.append(node._modules[leaf_names[-1]])

def f(a):
    return a

TABLE = b"\x80" * 65536  # one object: the target stays small, each code object points at it
codes = [f.__code__.replace(co_qualname=("q%d_" % i).ljust(512, "q"), co_linetable=TABLE)
         for i in range(CODES)]
print("PYBOUND " + json.dumps({"pid": os.getpid(), "roots": [id(r) for r in roots], "leaves": [id(l) for l in leaves],
                               "leaf_names": leaf_names, "codes": [id(c) for c in codes],
                               "quals": [c.co_qualname for c in codes[:3]]}), flush=True)
time.sleep(3600)
)py";

class PyCacheBound : public ::testing::Test {
protected:
    static constexpr size_t kRoots = 4, kLeaves = 2000, kCodes = 3000;
    static constexpr size_t kPerProcess = 4u << 20;

    void SetUp() override {
        const char* py = "/usr/bin/python3.11";  // 3.11+: co_qualname and replace(co_linetable=)
        if (access(py, X_OK) != 0) GTEST_SKIP() << py << " is not installed here";
        std::ofstream(dir_.dir() + "/bound.py") << kBoundScript;
        proc_ = std::make_unique<testproc::Background>(std::vector<std::string>{
            py, dir_.dir() + "/bound.py", std::to_string(kRoots), std::to_string(kLeaves), std::to_string(kCodes)});
        std::string line = proc_->wait_for_line("PYBOUND", 90);
        ASSERT_NE(line.find("PYBOUND {"), std::string::npos) << "the script did not start: " << line;
        self_ = json::parse(line.substr(line.find('{')));
        pid_ = self_["pid"].get<uint32_t>();
    }

    ScriptDir dir_;
    std::unique_ptr<testproc::Background> proc_;
    json self_;
    uint32_t pid_ = 0;
};

TEST_F(PyCacheBound, ModuleTreesOfLongDeepNamesStayWithinTheProcessBound) {
    PyCacheBudget budget(64u << 20);
    LivePyResolver res("/proc", kPerProcess, budget);
    ASSERT_EQ(res.object_layout_error(pid_), "");
    for (size_t r = 0; r < kRoots; ++r) {
        SCOPED_TRACE("root " + std::to_string(r));
        auto path = res.module_path(pid_, u(self_["roots"][r]), u(self_["leaves"][r]));
        ASSERT_TRUE(path.has_value()) << "each tree fits the trees' share alone";
        EXPECT_TRUE(path->starts_with("\u2026.")) << "31 names of 512: cut on the left";
        EXPECT_TRUE(path->ends_with("." + self_["leaf_names"][r].get<std::string>())) << *path;
        EXPECT_LE(path->size(), kPyMaxModulePath);
        EXPECT_LE(res.cache_stats(pid_).bytes, kPerProcess);
    }
    const PyCacheStats st = res.cache_stats(pid_);
    EXPECT_GE(st.evicted_trees, kRoots - 1) << "one tree of 2030 long names takes the trees' half of 4 MiB";
    EXPECT_EQ(budget.used(), st.bytes) << "the process's bytes are the budget's";
    auto note = res.cache_note(pid_);
    ASSERT_TRUE(note.has_value());
    EXPECT_NE(note->find("module trees evicted"), std::string::npos) << *note;
    EXPECT_NE(note->find("4 MiB per process"), std::string::npos) << *note;
    EXPECT_EQ(res.module_path(pid_, u(self_["roots"][0]), u(self_["leaves"][0]))->substr(0, 4), "\u2026.")
        << "an answer given is kept after its tree goes";
    res.forget(pid_);
    EXPECT_EQ(budget.used(), 0u) << "forget gives every byte back";
    EXPECT_EQ(res.cache_stats(pid_).evicted_trees, st.evicted_trees) << "the losses outlive the process";
}

TEST_F(PyCacheBound, CodeObjectsWithHugeNamesAndTablesStayWithinBothBounds) {
    PyCacheBudget budget(6u << 20);  // less than two processes' shares: the total binds too
    LivePyResolver a("/proc", kPerProcess, budget), b("/proc", kPerProcess, budget);
    ASSERT_EQ(a.object_layout_error(pid_), "");
    ASSERT_EQ(b.object_layout_error(pid_), "");
    const PyLayout& l = a.discovery(pid_).layout;
    for (LivePyResolver* res : {&a, &b}) {
        for (const auto& c : self_["codes"]) {
            // An instruction inside the code: its line table is read.
            res->frame(pid_, cd_py_frame{u(c), 0, 0, u(c) + (l.minor == 11 ? 184u : 192u) + 2});
            ASSERT_LE(res->cache_stats(pid_).bytes, kPerProcess);
            ASSERT_LE(budget.used(), budget.total());
        }
    }
    const PyFrameInfo& first = a.frame(pid_, at_start(l, u(self_["codes"][0])));
    EXPECT_TRUE(first.known) << "what was kept before the bound still resolves";
    EXPECT_EQ(first.qualname, self_["quals"][0].get<std::string>());
    EXPECT_GT(a.cache_stats(pid_).unnamed_frames, 0u) << "3000 codes of 64 KiB tables do not fit 4 MiB";
    EXPECT_GT(b.cache_stats(pid_).unnamed_frames, a.cache_stats(pid_).unnamed_frames)
        << "the second resolver had only what the first left of the total";
    EXPECT_EQ(budget.used(), a.cache_stats(pid_).bytes + b.cache_stats(pid_).bytes);
    auto note = b.cache_note(pid_);
    ASSERT_TRUE(note.has_value());
    EXPECT_NE(note->find("frames left <unknown>"), std::string::npos) << *note;
    a.forget(pid_);
    b.forget(pid_);
    EXPECT_EQ(budget.used(), 0u);
}

TEST_F(PyCacheBound, WithinTheBoundNothingIsLostOrNoted) {
    LivePyResolver res;  // the program-wide defaults: 32 MiB per process
    ASSERT_EQ(res.object_layout_error(pid_), "");
    auto path = res.module_path(pid_, u(self_["roots"][0]), u(self_["leaves"][0]));
    ASSERT_TRUE(path.has_value());
    EXPECT_TRUE(res.frame(pid_, at_start(res.discovery(pid_).layout, u(self_["codes"][1]))).known);
    EXPECT_FALSE(res.cache_stats(pid_).lossy());
    EXPECT_EQ(res.cache_note(pid_), std::nullopt);
    EXPECT_GT(res.cache_stats(pid_).bytes, 2030u * 512) << "the tree's names are accounted";
}

}  // namespace
