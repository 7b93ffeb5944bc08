// SPDX-License-Identifier: Apache-2.0
// commdbgd's memory against a Python target shaped to inflate it (issue 21,
// point 2): a uid-65534 process with a torch-free torch/nn/modules/module.py
// builds module trees 31 deep of 512-character names with 9960 leaves under
// each of several roots, and the same user attaches to it through the daemon
// at noise level 2.  Named by whole paths, each tree took ~160 MB of the root
// daemon (2 GB for ten); the resolver's caches are bounded in bytes
// (limits::kPyCacheBytesPerProcess), so the daemon's peak RSS grows by less
// than that bound plus the session's own ring buffer and a fixed allowance.
#include <fstream>

#include "daemon_util.hpp"
#include "limits.hpp"

namespace commdbg::e2e {
namespace daemon_py_memory_tests {
namespace {

using namespace daemon_util;

// Module is found by its file and its __module__, as the resolver knows torch's.
const char* const kFakeModule = R"py(
class Module:
    def __init__(self):
        self._modules = {}

    def _call_impl(self, *args):
        return self.forward(*args)

    __call__ = _call_impl
)py";

// argv: LIBNCCL WAIT_FILE ROOTS.  Prints "ready pid=N" once the trees are
// built, waits for WAIT_FILE, makes 20 ncclAllReduce calls from a leaf of
// each root in turn (root -> leaf, both module calls), prints one JSON line
// of the leaves' names and lives on until WAIT_FILE.end exists: the trees
// are walked while the records are ingested, which an exit would cut short.
const char* const kWorkload = R"py(
import ctypes, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch.nn.modules.module import Module

LIB, WAIT, ROOTS = sys.argv[1], sys.argv[2], int(sys.argv[3])
DEPTH, LEAVES, CALLS = 30, 9960, 20
ar = ctypes.CDLL(LIB).ncclAllReduce
ar.restype = ctypes.c_int
ar.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
               ctypes.c_void_p, ctypes.c_void_p]

class Leaf(Module):
    def forward(self):
        return ar(None, None, 0, 0, 0, None, None)

class Root(Module):
    def forward(self):
        return self.leaf()

def name(tag, i):
    return ("%s%d_" % (tag, i)).ljust(512, "n")

roots, leaf_names = [], []
for r in range(ROOTS):
    root = node = Root()
    for d in range(DEPTH):
        child = Module()
        node._modules[name("r%dd" % r, d)] = child
        node = child
    for l in range(LEAVES):
        node._modules[name("r%dl" % r, l)] = Leaf()
    leaf_names.append(name("r%dl" % r, LEAVES - 1))
    root.leaf = node._modules[leaf_names[-1]]  # an attribute: the tree holds it under the chain's end
    roots.append(root)
print("ready pid=%d" % os.getpid(), flush=True)
while not os.path.exists(WAIT):
    time.sleep(0.05)
for i in range(CALLS):
    roots[i % ROOTS]()
print(json.dumps({"leaf_names": leaf_names}), flush=True)
while not os.path.exists(WAIT + ".end"):
    time.sleep(0.05)
)py";

long status_kb(int pid, const std::string& field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind(field + ":", 0) == 0) return atol(line.c_str() + field.size() + 1);
    return -1;
}

void write_file(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
}

TEST(DaemonPyMemory, DeepModuleTreesOfLongNamesDoNotInflateTheDaemon) {
    REQUIRE_BPF();
    const std::string python = "/usr/bin/python3.11";
    if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " is not installed here";
    SharedDir tmp;
    for (const char* pkg : {"torch", "torch/nn", "torch/nn/modules"}) write_file(tmp.path(pkg) + "/__init__.py", "");
    write_file(tmp.path("torch/nn/modules/module.py"), kFakeModule);
    write_file(tmp.path("work.py"), kWorkload);
    START_DAEMON(d, tmp);
    auto bins = nobody_bins();
    // Four roots: ~640 MB of whole paths; the bound holds one process to 32 MiB.
    constexpr int kRoots = 4;
    Background work(concat(kAsNobody, {python, tmp.path("work.py"), bins.stub_dir + "/libnccl.so.2", tmp.path("go"),
                                       std::to_string(kRoots)}));
    ASSERT_FALSE(work.wait_for_line("ready pid=", 120).empty()) << "workload (uid 65534) never got ready: "
                                                                  << work.wait(5).err.substr(0, 2000);
    const long rss0 = status_kb(d.pid(), "VmRSS");
    ASSERT_GT(rss0, 0);

    // A window of 8 s: the 20 calls come at its start, the rest is for their ingestion.
    Background dbg(concat(kAsNobody, {bins.commdbg, "attach", std::to_string(work.pid()), "--socket", d.socket(),
                                      "-d", "8", "--noise-level", "2", "--json", tmp.path("out.json")}));
    ASSERT_FALSE(dbg.wait_for_err_line("commdbg: tracing", 60).empty()) << dbg.wait(5).err;
    touch(tmp.path("go"));
    const std::string leaves_line = work.wait_for_line("leaf_names", 120);
    auto r = dbg.wait(180);
    const long hwm = status_kb(d.pid(), "VmHWM");
    touch(tmp.path("go.end"));
    auto w = work.wait(60);
    ASSERT_EQ(w.status, 0) << w.err.substr(0, 2000);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 2000);
    ASSERT_FALSE(leaves_line.empty()) << "the workload made no calls: " << w.err.substr(0, 2000);

    // The peak, not the RSS after: a walk's transient strings count too.
    const long grown_kb = hwm - rss0;
    const long bound_kb = static_cast<long>(limits::kPyCacheBytesPerProcess / 1024 + limits::kDefaultRingbufKb) +
                          32 * 1024;  // the session: threads' arenas, model, outputs
    RecordProperty("daemon_rss_kb_before", static_cast<int>(rss0));
    RecordProperty("daemon_hwm_kb_after", static_cast<int>(hwm));
    std::cout << "[ daemon ] VmRSS " << rss0 << " kB before, VmHWM " << hwm << " kB after; bound +" << bound_kb
              << " kB\n";
    EXPECT_LT(grown_kb, bound_kb) << "commdbgd grew by " << grown_kb << " kB naming one process's modules";

    // Still named: each root's leaf by its (cut) path, and the bound's cost said.
    json dump = read_json(tmp.path("out.json"));
    auto procs = processes_of(dump);
    const json* proc = process_by_pid(procs, work.pid());
    ASSERT_NE(proc, nullptr) << dump.dump().substr(0, 2000);
    const json names = json::parse(leaves_line.substr(leaves_line.find('{')))["leaf_names"];
    const json by_module = proc->value("module_comm_counts", json::object());
    std::string seen;  // for a failure: the paths there are, shortened
    for (const auto& [fqn, c] : by_module.items())
        seen += " [" + fqn.substr(0, 40) + "..." + fqn.substr(fqn.size() - std::min<size_t>(fqn.size(), 20)) + "]";
    for (const auto& leaf : names) {
        bool found = false;
        for (const auto& [fqn, c] : by_module.items())
            found = found || (fqn.starts_with("\u2026.") && fqn.ends_with("." + leaf.get<std::string>()));
        EXPECT_TRUE(found) << "no module path ends with " << leaf.get<std::string>().substr(0, 12) << "...; there are:"
                           << seen << "; notes: " << proc->value("notes", json::array()).dump();
    }
    bool noted = false;
    for (const auto& n : proc->value("notes", json::array()))
        noted = noted || n.get<std::string>().find("reached the resolver's memory bound") != std::string::npos;
    EXPECT_TRUE(noted) << "four trees of ~7 MB take more than the trees' 16 MiB: evictions are noted";
}

}  // namespace
}  // namespace daemon_py_memory_tests
}  // namespace commdbg::e2e
