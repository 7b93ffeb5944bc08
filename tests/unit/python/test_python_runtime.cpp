// SPDX-License-Identifier: Apache-2.0
// Python discovery on real interpreters this test spawns (process_vm_readv of
// a child of the same uid needs no privilege), and the bounded decoders on
// the bytes the builds here compile to.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "python_runtime.hpp"
#include "test_proc.hpp"

using namespace commdbg;
using namespace commdbg::python;
using Status = PyDiscovery::Status;

namespace {

const std::string kScript = std::string(SOURCE_DIR) + "/tests/testprogs/py_wait.py";

struct Interpreter {
    const char* name;  // test parameter name
    const char* path;
    int minor;
    bool shared;       // CPython in libpython3.X.so
    uint32_t key_off;  // key_addr - _PyRuntime (docs/design/python-walker.md; +4 where it names the Py_tss_t)
    const char* root = nullptr;  // run chrooted here: a container's python, read through /proc/PID/root
};

const char* const kTrixieRoot = "/var/cache/commdbg/trixie-root";

// Debian 3.11 loads the key itself at _PyRuntime+596; the pyenv builds pass
// the Py_tss_t (docs/design/python-walker.md: +0x248 / +0x608 / +0x870), whose key is 4 further.
// 3.11.7's +0x250 is what objdump shows of its PyGILState_GetThisThreadState.
const Interpreter kInterpreters[] = {
    {"debian_3_11", "/usr/bin/python3.11", 11, false, 596},
    {"pyenv_3_10_13", "/root/.pyenv/versions/3.10.13/bin/python3", 10, true, 0x248 + 4},
    {"pyenv_3_11_7", "/root/.pyenv/versions/3.11.7/bin/python3", 11, true, 0x250 + 4},
    {"pyenv_3_12_1", "/root/.pyenv/versions/3.12.1/bin/python3", 12, true, 0x608 + 4},
    {"pyenv_3_13_0", "/root/.pyenv/versions/3.13.0/bin/python3", 13, true, 0x870 + 4},
    // Debian trixie's non-PIE python3.13 (tests/trixie_root.sh), in its own root.
    {"trixie_3_13", "/usr/bin/python3.13", 13, false, 0x870 + 4, kTrixieRoot},
};

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// argv that runs the wait script under `py`; the script goes in by -c where
// the interpreter lives in another root and cannot see this checkout.
std::vector<std::string> script_argv(const Interpreter& py) {
    if (py.root == nullptr) return {py.path, kScript};
    return {"chroot", py.root, py.path, "-c", read_text(kScript)};
}

// What the script says of itself, "k=v" words after "PYWAIT".
std::map<std::string, std::string> parse_line(const std::string& line) {
    std::map<std::string, std::string> out;
    std::istringstream in(line.substr(line.find("PYWAIT")));
    std::string word;
    while (in >> word) {
        auto eq = word.find('=');
        if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return out;
}

template <typename T>
T peek(int pid, uint64_t addr) {
    T v{};
    iovec local{&v, sizeof v}, remote{reinterpret_cast<void*>(addr), sizeof v};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof v)) {
        ADD_FAILURE() << "cannot read 0x" << std::hex << addr;
    }
    return v;
}

std::string peek_ascii(int pid, uint64_t str, const PyLayout& l) {
    std::string s;
    for (int i = 0; i < 64; ++i) {
        char c = peek<char>(pid, str + l.unicode_ascii_data + static_cast<uint64_t>(i));
        if (c == '\0') break;
        s.push_back(c);
    }
    return s;
}

// The innermost frame's code object of the thread list's first thread, as a
// BPF walker would find it (owner-3 frames skipped, bounded).
uint64_t top_code(int pid, const PyLayout& l, uint64_t tstate) {
    uint64_t f = peek<uint64_t>(pid, tstate + l.ts_frame);
    if (l.ts_frame_inner != kPyNoOffset && f != 0) f = peek<uint64_t>(pid, f + l.ts_frame_inner);
    for (int i = 0; i < 8 && f != 0; ++i) {
        bool cstack = l.frame_owner_cstack != kPyNoOffset &&
                      peek<uint8_t>(pid, f + l.frame_owner) == l.frame_owner_cstack;
        uint64_t code = peek<uint64_t>(pid, f + l.frame_code);
        if (!cstack && !(l.skip_none_code && code == l.none_addr)) return code;
        f = peek<uint64_t>(pid, f + l.frame_previous);
    }
    return 0;
}

class PythonRuntimeOn : public ::testing::TestWithParam<Interpreter> {};

TEST_P(PythonRuntimeOn, DiscoversKeyCodeOffsetsAndWalksToTheWaitingFunction) {
    const Interpreter& py = GetParam();
    std::string exe = std::string(py.root ? py.root : "") + py.path;
    if (access(exe.c_str(), X_OK) != 0) GTEST_SKIP() << exe << " is not installed here";
    if (py.root && geteuid() != 0) GTEST_SKIP() << "running python chrooted in " << py.root << " needs root";
    testproc::Background child(script_argv(py));
    auto self = parse_line(child.wait_for_line("PYWAIT"));
    ASSERT_EQ(self["pid"], std::to_string(child.pid())) << "the script did not start";

    PyDiscovery d = discover_python(child.pid());
    ASSERT_EQ(d.status, Status::supported) << d.reason;
    const PyLayout& l = d.layout;
    EXPECT_EQ(l.major, 3);
    EXPECT_EQ(l.minor, py.minor);
    EXPECT_EQ(self["version"].rfind(d.info.version, 0), 0u) << d.info.version << " vs " << self["version"];
    EXPECT_EQ(d.info.shared_library, py.shared) << d.info.file;
    if (!py.shared) {
        EXPECT_EQ(d.info.load_bias, 0u) << "Debian's python3.11 is not PIE";
    }
    EXPECT_EQ(l.runtime_addr, std::stoull(self["runtime"]));
    EXPECT_EQ(l.key_addr - l.runtime_addr, py.key_off);
    EXPECT_EQ(static_cast<int>(l.key), std::stoi(self["key"])) << "pthread_getspecific found another key inside";

    // docs/design/python-walker.md's table, here found at run time through tp_members.
    const bool v310 = py.minor == 10;
    EXPECT_EQ(l.code_argcount, v310 ? 16u : py.minor == 11 ? 56u : 52u);
    EXPECT_EQ(l.code_flags, v310 ? 36u : 48u);
    EXPECT_EQ(l.code_firstlineno, v310 ? 40u : py.minor == 11 ? 72u : 68u);
    EXPECT_EQ(l.code_filename, v310 ? 104u : 112u);
    EXPECT_EQ(l.code_name, v310 ? 112u : 120u);
    EXPECT_EQ(l.code_qualname, v310 ? kPyNoOffset : 128u);
    EXPECT_EQ(d.info.debug_offsets, py.minor == 13);

    // glibc 2.36's key slots, decoded from the target's own libc.
    EXPECT_EQ(l.tls_derived, 1) << (d.notes.empty() ? "" : d.notes.back());
    EXPECT_EQ(l.tls_base, 0x310u);
    EXPECT_EQ(l.tls_stride, 16u);
    EXPECT_EQ(l.tls_data, 8u);
    EXPECT_EQ(l.tls_keys, 32u);

    // The lookup the BPF side will do, from here: fsbase (= pthread_self)'s slot holds the tstate.
    const uint64_t tstate = std::stoull(self["tstate"]), fsbase = std::stoull(self["pthread_self"]);
    EXPECT_EQ(peek<uint64_t>(child.pid(), fsbase + l.tls_base + l.tls_stride * l.key + l.tls_data), tstate);
    // And the thread list: the only thread is the head, and its thread_id is fsbase.
    uint64_t interp = peek<uint64_t>(child.pid(), l.runtime_addr + l.rt_interpreters_head);
    uint64_t head = peek<uint64_t>(child.pid(), interp + l.interp_threads_head);
    ASSERT_EQ(head, tstate);
    EXPECT_EQ(peek<uint64_t>(child.pid(), head + l.ts_thread_id), fsbase);

    uint64_t code = top_code(child.pid(), l, head);
    ASSERT_NE(code, 0u);
    EXPECT_EQ(peek<uint64_t>(child.pid(), code + l.ob_type), l.code_type_addr);
    uint64_t name = peek<uint64_t>(child.pid(), code + (v310 ? l.code_name : l.code_qualname));
    EXPECT_EQ(peek_ascii(child.pid(), name, l), "wait_here");
    uint64_t file = peek<uint64_t>(child.pid(), code + l.code_filename);
    EXPECT_EQ(peek_ascii(child.pid(), file, l), py.root ? "<string>" : kScript);
    // A chroot's maps already name host paths, so this run proves another
    // root's python and glibc, not the /proc/PID/root translation (procfs's).
    if (py.root) {
        EXPECT_EQ(d.info.file, std::string(py.root) + py.path);
    }
}

INSTANTIATE_TEST_SUITE_P(Builds, PythonRuntimeOn, ::testing::ValuesIn(kInterpreters),
                         [](const auto& info) { return std::string(info.param.name); });

// pyenv's 3.9 is a real CPython outside 3.10-3.13: a note, not a layout.
TEST(PythonRuntime, AnOlderCPythonIsUnsupportedWithItsVersion) {
    const char* py = "/root/.pyenv/versions/3.9.18/bin/python3";
    if (access(py, X_OK) != 0) GTEST_SKIP() << py << " is not installed here";
    testproc::Background child({py, "-c", "import time; print('up', flush=True); time.sleep(30)"});
    child.wait_for_line("up");
    PyDiscovery d = discover_python(child.pid());
    EXPECT_EQ(d.status, Status::unsupported);
    EXPECT_EQ(d.reason, "CPython 3.9 is not supported (supported: 3.10, 3.11, 3.12, 3.13)");
}

TEST(PythonRuntime, ANonPythonProcessIsNotACPythonProcess) {
    testproc::Background sleeper({"/bin/sleep", "30"});
    usleep(100 * 1000);  // past exec
    PyDiscovery d = discover_python(sleeper.pid());
    EXPECT_EQ(d.status, Status::not_python);
    EXPECT_EQ(d.reason, "not a CPython process");
}

TEST(PythonRuntime, AnExitedOrZombieProcessIsAClearError) {
    pid_t z = fork();
    ASSERT_GE(z, 0);
    if (z == 0) _exit(0);
    usleep(100 * 1000);  // exited, not reaped: a zombie with no maps
    PyDiscovery zombie = discover_python(z);
    EXPECT_EQ(zombie.status, Status::error);
    EXPECT_NE(zombie.reason.find("exited"), std::string::npos) << zombie.reason;
    waitpid(z, nullptr, 0);
    PyDiscovery gone = discover_python(z);
    EXPECT_EQ(gone.status, Status::error);
    EXPECT_NE(gone.reason.find("does not exist or has exited"), std::string::npos) << gone.reason;
}

// A python killed at a random point while discovery runs over and over:
// every answer is a layout or "exited", never a crash or another story.
TEST(PythonRuntime, AProcessKilledDuringDiscoveryGivesExitedNotACrash) {
    if (access("/usr/bin/python3.11", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3.11 is not installed here";
    testproc::Background child({"/usr/bin/python3.11", kScript});
    child.wait_for_line("PYWAIT");
    std::jthread killer([pid = child.pid()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        kill(pid, SIGKILL);
    });
    int supported = 0, exited = 0;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < until) {
        PyDiscovery d = discover_python(child.pid());
        if (d.ok()) {
            ++supported;
            continue;
        }
        ASSERT_EQ(d.status, Status::error) << d.reason;
        ASSERT_NE(d.reason.find("exited"), std::string::npos) << d.reason;
        ++exited;
        if (exited > 20) break;
    }
    EXPECT_GT(exited, 0);
    RecordProperty("supported_before_kill", supported);
}

// ---- the decoders, on bytes these builds compile to --------------------

TEST(PythonKeyDecoder, DebianDirectLoadOfTheKeyRelativeToRip) {
    // cmpq $0,0x563d50(%rip); je ...; mov 0x563d50(%rip),%edi; jmp pthread_getspecific@plt
    std::vector<uint8_t> c = {0x48, 0x83, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0x00, 0x0f, 0x84, 0x1f, 0xc8,
                              0xf2, 0xff, 0x8b, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0xe9, 0xa7, 0x8a, 0xf2, 0xff};
    auto k = decode_key_load(c, 0x4f7c30);
    ASSERT_TRUE(k) << k.error();
    EXPECT_FALSE(k->via_got);
    EXPECT_FALSE(k->is_tss_pointer);
    EXPECT_EQ(k->target, 0xa5b740u + 596);  // _PyRuntime + 596
}

TEST(PythonKeyDecoder, SharedLibraryGotLoadThenLeaOfThePyTss) {
    // 3.12.1: mov GOT(%rip),%rax; push %rbx; lea 0x608(%rax),%rbx; mov %rbx,%rdi; call PyThread_tss_is_created
    std::vector<uint8_t> c = {0x48, 0x8b, 0x05, 0xc9, 0xc0, 0x26, 0x00, 0x53, 0x48, 0x8d, 0x98, 0x08,
                              0x06, 0x00, 0x00, 0x48, 0x89, 0xdf, 0xe8, 0xd9, 0x21, 0xe3, 0xff};
    auto k = decode_key_load(c, 0x2d7c30);
    ASSERT_TRUE(k) << k.error();
    EXPECT_TRUE(k->via_got);
    EXPECT_TRUE(k->is_tss_pointer);
    EXPECT_EQ(k->got_slot, 0x543d00u);
    EXPECT_EQ(k->target, 0x608u);
}

TEST(PythonKeyDecoder, NonPieImmediateAddressOfThePyTss) {
    // A non-PIE executable: Ubuntu 24.04's /usr/bin/python3.12 (3.12.3), as read
    // on the GPU machine: endbr64; push %rbp; mov $0xb369c8,%edi;
    // mov %rsp,%rbp; call PyThread_tss_is_created.
    std::vector<uint8_t> c = {0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0xbf, 0xc8, 0x69, 0xb3, 0x00,
                              0x48, 0x89, 0xe5, 0xe8, 0x2e, 0x82, 0x00, 0x00};
    auto k = decode_key_load(c, 0x608290);
    ASSERT_TRUE(k) << k.error();
    EXPECT_FALSE(k->via_got);
    EXPECT_TRUE(k->is_tss_pointer);
    EXPECT_TRUE(k->absolute);
    EXPECT_EQ(k->target, 0xb369c8u);
    // Into another register than the argument's: not the key.
    c[5] = 0xbe;  // mov $imm32,%esi
    auto other = decode_key_load(c, 0x608290);
    ASSERT_FALSE(other);
    EXPECT_NE(other.error().find("not a load relative to a symbol"), std::string::npos) << other.error();
}

TEST(PythonKeyDecoder, RefusesAnUnknownInstructionWithItsByte) {
    // 3.13t-style or another compiler: a SIB-addressed load is not a form we follow.
    std::vector<uint8_t> c = {0x48, 0x8b, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00, 0xe9, 0, 0, 0, 0};
    auto k = decode_key_load(c, 0x1000);
    ASSERT_FALSE(k);
    EXPECT_NE(k.error().find("does not decode (byte 0x48 at +0)"), std::string::npos) << k.error();
    std::vector<uint8_t> no_call = {0x90};
    auto none = decode_key_load(no_call, 0x1000);
    ASSERT_FALSE(none);
    EXPECT_NE(none.error(), "");
}

TEST(PythonTlsDecoder, Glibc236GetspecificGivesSlotArithmetic) {
    std::vector<uint8_t> c = {0x83, 0xff, 0x1f, 0x77, 0x3b, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x31, 0x48, 0xc1, 0xe0,
                              0x04, 0x64, 0x48, 0x03, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x50, 0x08};
    auto t = arch::getspecific_slots(c);
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->base, 0x310u);
    EXPECT_EQ(t->stride, 16u);
    EXPECT_EQ(t->data, 8u);
    EXPECT_EQ(t->keys, 32u);
    c[5] = 0x90;  // another shape: refused, not guessed
    auto other = arch::getspecific_slots(c);
    ASSERT_FALSE(other);
    EXPECT_NE(other.error().find("not glibc's fast path"), std::string::npos);
}

}  // namespace
