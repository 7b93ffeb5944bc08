// SPDX-License-Identifier: Apache-2.0
#include "py_objects.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

namespace commdbg {
namespace {

// ---- the target's memory -------------------------------------------------

// x86-64 user space; anything else is a garbage pointer, not worth a syscall.
bool plausible(uint64_t addr) { return addr >= 4096 && addr < (1ull << 47); }

// A live object's ob_refcnt: a freed pymalloc block holds the free list's
// next pointer (or NULL) there, glibc's tcache a mangled pointer.  3.12+
// immortal objects sit at 2^30 - 1 / 2^32 - 1.
bool plausible_refcnt(uint64_t rc) { return rc >= 1 && rc <= (1ull << 33); }

class LiveMemory final : public PyMemory {
public:
    explicit LiveMemory(int pid) : pid_(pid) {}
    bool read(uint64_t addr, void* out, size_t n) override {
        iovec local{out, n};
        iovec remote{reinterpret_cast<void*>(addr), n};
        if (process_vm_readv(pid_, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n)) return true;
        gone_ = errno == ESRCH;  // exited (or a zombie: no memory left), not an unmapped address
        return false;
    }
    bool read2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) override {
        iovec local[2] = {{oa, na}, {ob, nb}};
        iovec remote[2] = {{reinterpret_cast<void*>(a), na}, {reinterpret_cast<void*>(b), nb}};
        return process_vm_readv(pid_, local, 2, remote, 2, 0) == static_cast<ssize_t>(na + nb);
    }
    bool gone() const override { return gone_; }

private:
    int pid_;
    bool gone_ = false;
};

// The largest single read: a dict's entries (kMaxDictEntries of 24 bytes).
constexpr size_t kMaxRead = 1u << 20;

// Checked reads of the target's memory: plausible addresses, bounded sizes.
class Remote {
public:
    explicit Remote(std::unique_ptr<PyMemory> mem) : mem_(std::move(mem)) {}
    bool read(uint64_t addr, void* out, size_t n) const {
        if (!plausible(addr) || n == 0 || n > kMaxRead) return false;
        return mem_->read(addr, out, n);
    }
    // The last failed read failed because the process has no memory any more.
    bool gone() const { return mem_->gone(); }
    template <typename T>
    bool get(uint64_t addr, T& out) const {
        return read(addr, &out, sizeof out);
    }
    // Two ranges in one system call: a re-validation of fields far apart.
    bool read2(uint64_t a, void* oa, size_t na, uint64_t b, void* ob, size_t nb) const {
        if (!plausible(a) || !plausible(b) || na > kMaxRead || nb > kMaxRead) return false;
        return mem_->read2(a, oa, na, b, ob, nb);
    }
    // A NUL-terminated C string (tp_name, member names) of at most `max` bytes.
    bool c_string(uint64_t addr, std::string& out, size_t max) const {
        std::array<char, 128> buf{};
        max = std::min(max, buf.size() - 1);
        out.clear();
        if (read(addr, buf.data(), max)) {
            out.assign(buf.data(), strnlen(buf.data(), max));
            return true;
        }
        // Byte-wise: the string may end just before an unmapped page.
        for (size_t i = 0; i < max; ++i) {
            char c = 0;
            if (!get(addr + i, c)) return false;
            if (c == '\0') return true;
            out.push_back(c);
        }
        return true;
    }

private:
    std::unique_ptr<PyMemory> mem_;
};

template <typename T>
T field(const uint8_t* bytes, uint32_t off) {
    T v;
    std::memcpy(&v, bytes + off, sizeof v);
    return v;
}

// ---- layouts beyond PyLayout ----------------------------------------------

// offsetof() in each version's headers (pyenv's include/, Debian's
// python3.11-dev: the same), and checked against the target by
// check_object_layout.  The same in 3.10-3.13: tp_basicsize 32, tp_itemsize
// 40, tp_members 240, tp_base 256, tp_dict 264, tp_dictoffset 288, tp_mro 344,
// ma_keys 32, ma_values 40, bytes data 32.
struct ObjLayout {
    uint32_t heap_type_size;  // sizeof(PyHeapTypeObject) == PyType_Type.tp_basicsize
    uint32_t ht_qualname, ht_cached_keys;
    uint32_t code_linetable;
    uint32_t code_adaptive;  // offsetof(co_code_adaptive) == PyCode_Type.tp_basicsize; 0 on 3.10
    uint32_t values_items;   // PyDictValues.values (3.13 puts capacity/size/embedded/valid first)
};

ObjLayout obj_layout(int minor) {
    switch (minor) {
    case 10: return {888, 864, 872, 120, 0, 0};
    case 11: return {904, 864, 872, 136, 184, 0};
    case 12: return {920, 872, 880, 136, 192, 0};
    default: return {928, 872, 880, 136, 200, 8};
    }
}

constexpr uint32_t kTpBasicsize = 32, kTpItemsize = 40, kTpMembers = 240, kTpBase = 256, kTpDict = 264;
constexpr uint32_t kTpDictoffset = 288, kTpMro = 344, kTypeRead = kTpMro + 8;
constexpr uint32_t kMaKeys = 32, kMaValues = 40, kBytesData = 32, kObSize = 16, kObjectHead = 16;
constexpr int64_t kManagedDict = -24, kManagedValues311 = -CD_PY311_VALUES_BEFORE;  // pycore_object.h: obj - 3 / 4 words

constexpr uint64_t kFlagInlineValues = 1ull << 2;  // 3.13
constexpr uint64_t kFlagManagedDict = 1ull << 4;   // 3.11+
constexpr uint64_t kFlagHeapType = 1ull << 9;
constexpr uint64_t kFlagReady = 1ull << 12;
constexpr uint64_t kFlagTuple = 1ull << 26, kFlagBytes = 1ull << 27, kFlagUnicode = 1ull << 28;
constexpr uint64_t kFlagDict = 1ull << 29, kFlagType = 1ull << 31;

constexpr size_t kMaxDictEntries = 16384;  // a dict larger than this is read in part
constexpr size_t kMaxTupleItems = 64;      // MRO depth, names read
constexpr size_t kMaxLinetable = 64 * 1024;
constexpr size_t kMaxModules = 10000, kMaxModuleDepth = 32;
constexpr int kMaxTreeBuilds = 16;
// Distinct resolved frames kept per process (references stay valid until
// forget): record_function labels such as "step 1234" would grow it forever.
constexpr size_t kMaxFrames = 100000;
// Bytes of the key strings one tree walk remembers (the same interned keys,
// "_modules", "training", in every module): past them it reads them again.
constexpr size_t kMaxWalkMemo = 1u << 20;

// ---- what a cached entry costs ----------------------------------------------

// A node of a std::map / unordered_map with its share of the buckets and the
// allocator's header: the accounting errs on the side of too much.
constexpr size_t kEntryOverhead = 64;
// A string's own allocation (libstdc++ keeps up to 15 characters inline).
size_t heap_of(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }
size_t heap_of(const std::optional<std::string>& s) { return s ? heap_of(*s) : 0; }

size_t cost_of(const PyFrameInfo& f) {
    return heap_of(f.qualname) + heap_of(f.file) + heap_of(f.module_class) + heap_of(f.label);
}

// PyMemberDef tables: name -> offset.
std::map<std::string, int64_t> members_of(const Remote& mem, uint64_t type) {
    std::map<std::string, int64_t> found;
    uint64_t members = 0;
    if (!mem.get(type + kTpMembers, members)) return found;
    for (int i = 0; i < 64; ++i) {
        struct {
            uint64_t name;
            int32_t type, pad;
            int64_t offset;
            int32_t flags, pad2;
            uint64_t doc;
        } m{};
        static_assert(sizeof m == 40, "PyMemberDef on x86-64");
        if (!mem.get(members + 40ull * static_cast<uint64_t>(i), m) || m.name == 0) break;
        std::string name;
        if (mem.c_string(m.name, name, 64)) found[name] = m.offset;
    }
    return found;
}

// The table above against the target: PyType_Type's own members and size,
// PyCode_Type's co_linetable and size.  Empty when it matches.
std::string check_object_layout(const Remote& mem, const PyLayout& l, const ObjLayout& o, uint64_t type_type) {
    int64_t size = 0;
    if (!mem.get(type_type + kTpBasicsize, size)) return "cannot read PyType_Type";
    if (size != o.heap_type_size)
        return "heap types are " + std::to_string(size) + " bytes, the verified table says " +
               std::to_string(o.heap_type_size);
    const std::map<std::string, int64_t> want = {{"__basicsize__", kTpBasicsize}, {"__itemsize__", kTpItemsize},
                                                 {"__flags__", l.tp_flags},       {"__base__", kTpBase},
                                                 {"__dictoffset__", kTpDictoffset}, {"__mro__", kTpMro}};
    auto got = members_of(mem, type_type);
    for (const auto& [name, off] : want) {
        auto it = got.find(name);
        // 3.12+ serve __mro__ by a getter (static types keep theirs elsewhere): heap types' tp_mro stays.
        if (it == got.end() && name == "__mro__" && l.minor >= 12) continue;
        if (it == got.end() || it->second != off) return "type." + name + " is not at " + std::to_string(off);
    }
    auto code = members_of(mem, l.code_type_addr);
    if (auto it = code.find("co_linetable"); it == code.end() || it->second != o.code_linetable)
        return "co_linetable is not at " + std::to_string(o.code_linetable);
    if (o.code_adaptive != 0) {
        if (!mem.get(l.code_type_addr + kTpBasicsize, size) || size != o.code_adaptive)
            return "co_code_adaptive is not at " + std::to_string(o.code_adaptive);
    }
    return {};
}

// ---- text -----------------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) cp = 0xfffd;  // a lone surrogate has no UTF-8
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
        out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
}

std::string utf8_of(const uint8_t* data, size_t chars, int kind) {
    std::string out;
    out.reserve(chars);
    for (size_t i = 0; i < chars; ++i) {
        uint32_t cp = kind == 1 ? data[i] : kind == 2 ? field<uint16_t>(data, static_cast<uint32_t>(2 * i))
                                                      : field<uint32_t>(data, static_cast<uint32_t>(4 * i));
        append_utf8(out, cp);
    }
    return out;
}

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The runtime's own files, torch's and installed packages': not user code.
bool library_file(std::string_view file, int minor) {
    if (file.rfind("<frozen ", 0) == 0) return true;
    const std::string stdlib = "/python3." + std::to_string(minor) + "/";
    return contains(file, "/lib" + stdlib) || contains(file, "/lib64" + stdlib) || contains(file, "/site-packages/") ||
           contains(file, "/dist-packages/") || contains(file, "/torch/") || file.rfind("torch/", 0) == 0;
}

// 3.10 has co_name only: the bare method name, confirmed by the file (and,
// for __enter__, by the type of self in frame()).
PyFrameKind kind_of(std::string_view q, std::string_view file, int minor) {
    auto is = [&](std::string_view cls, std::string_view fn) {
        if (minor == 10) return q == fn;
        return q.size() == cls.size() + 1 + fn.size() && q.substr(0, cls.size()) == cls && q[cls.size()] == '.' &&
               q.substr(cls.size() + 1) == fn;
    };
    const bool call = is("Module", "_call_impl") || is("Module", "_wrapped_call_impl");
    if (call && ends_with(file, "torch/nn/modules/module.py")) return PyFrameKind::ModuleCall;
    if (ends_with(file, "torch/autograd/profiler.py") && is("record_function", "__enter__"))
        return PyFrameKind::RecordFunctionEnter;
    if (ends_with(file, "torch/autograd/graph.py") && q == "_engine_run_backward") return PyFrameKind::BackwardEntry;
    if (ends_with(file, "torch/autograd/__init__.py") && (q == "backward" || q == "grad"))
        return PyFrameKind::BackwardEntry;
    return PyFrameKind::Plain;
}

// ---- line tables ----------------------------------------------------------

// 3.10 (PEP 626): (bytecode delta, signed line delta) byte pairs; -128 is "no line".
int line_310(std::string_view t, uint32_t first, int64_t offset) {
    int64_t start = 0, line = first;
    for (size_t i = 0; i + 1 < t.size(); i += 2) {
        int64_t end = start + static_cast<uint8_t>(t[i]);
        int8_t ldelta = static_cast<int8_t>(t[i + 1]);
        if (ldelta != -128) line += ldelta;
        if (offset >= start && offset < end) return ldelta == -128 ? -1 : static_cast<int>(line);
        start = end;
    }
    return -1;
}

// 3.11+ (Objects/locations.md): an entry's first byte has bit 7 set, its
// code in bits 3-6 and (code units - 1) in bits 0-2; varints are 6-bit chunks.
int line_311(std::string_view t, uint32_t first, int64_t offset) {
    auto byte = [&](size_t i) { return i < t.size() ? static_cast<uint8_t>(t[i]) : 0; };
    auto signed_varint = [&](size_t i) {
        uint32_t v = byte(i) & 63, shift = 0;
        while ((byte(i) & 64) && shift < 30) v |= (byte(++i) & 63u) << (shift += 6);
        return (v & 1) ? -static_cast<int64_t>(v >> 1) : static_cast<int64_t>(v >> 1);
    };
    int64_t start = 0, line = first;
    for (size_t i = 0; i < t.size();) {
        uint8_t b = byte(i);
        int code = (b >> 3) & 15;
        int64_t end = start + 2 * ((b & 7) + 1);
        if (code == 13 || code == 14) line += signed_varint(i + 1);
        else if (code == 11 || code == 12) line += code - 10;
        if (offset >= start && offset < end) return code == 15 ? -1 : static_cast<int>(line);
        start = end;
        for (++i; i < t.size() && !(byte(i) & 128); ++i) {}
    }
    return -1;
}

}  // namespace

uint32_t py_line_of(int minor, std::string_view linetable, uint32_t firstlineno, int64_t offset) {
    if (offset < 0) return firstlineno;
    int line = minor == 10 ? line_310(linetable, firstlineno, offset) : line_311(linetable, firstlineno, offset);
    return line > 0 ? static_cast<uint32_t>(line) : firstlineno;
}

// ---- one process ----------------------------------------------------------

class LivePyResolver::Process {
public:
    // Where its caches' bytes are counted and what the bound cost it.
    struct Account {
        size_t per_process;
        PyCacheBudget* budget;
        PyCacheStats* stats;
    };
    Process(PyDiscovery d, std::unique_ptr<PyMemory> mem, Account account);
    ~Process() { account_.budget->give(bytes_); }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;
    size_t bytes() const { return bytes_; }
    const PyDiscovery& discovery() const { return d_; }
    const std::string& layout_error() const { return layout_error_; }
    const PyFrameInfo& frame(const cd_py_frame& f);
    std::optional<std::string> module_path(uint64_t root, uint64_t module);
    std::optional<PyTypeFacts> type_facts(uint64_t t);
    uint64_t attr(uint64_t obj, std::string_view name);
    std::optional<std::string> str(uint64_t obj);
    void set_epoch(uint64_t e) { epoch_ = e; }
    PyCodeTable& code_table() { return table_; }
    std::optional<uint32_t> values_index(uint64_t type_ptr, std::string_view name);

private:
    struct Code {
        uint64_t serial = 0;
        uint64_t checked = 0;  // epoch it was last re-validated in
        uint64_t name = 0, filename = 0, linetable = 0, varnames = 0;  // what it was read from: re-validation
        int32_t argcount = 0;
        uint32_t firstlineno = 0;
        int64_t code_bytes = -1;  // 3.11+: bytecode size, for the instruction offset's bounds
        std::string qualname, file, first_local;
        PyFrameKind kind = PyFrameKind::Plain;
        bool library = false;
        std::optional<std::string> table;  // co_linetable, read on the first line asked for
        std::unordered_map<int64_t, uint32_t> lines;
        size_t bytes = 0;  // accounted for it, given back when it goes
    };
    struct Type {
        uint64_t serial = 0;
        uint64_t checked = 0;  // epoch it was last re-validated in
        uint64_t meta = 0, name_ptr = 0;  // re-validate a heap type
        uint64_t flags = 0, dict = 0, mro = 0;
        int64_t basicsize = 0, itemsize = 0, dictoffset = 0;
        PyTypeFacts facts;
        bool torch_module = false;  // this very type is torch.nn.modules.module.Module
        bool mro_done = false;
        size_t bytes = 0;
    };
    // The modules below a root as links to their parents: a path costs its
    // names once, not once per descendant (a deep tree of long names held
    // as whole paths took ~200 MB).
    struct Tree {
        struct Node {
            uint64_t parent = 0;  // 0: the root
            uint32_t name = 0;    // index in names
        };
        std::unordered_map<uint64_t, Node> nodes;
        std::vector<std::string> names;  // the keys of the modules' _modules dicts
        size_t bytes = 0;                // nodes and names (the tree's share), 0 when evicted
        uint64_t used = 0;               // tree_clock_ when last asked: the least recent goes first
        std::chrono::steady_clock::time_point built;
        int builds = 0;
    };
    struct WalkMemo {
        std::unordered_map<uint64_t, std::string> strs;
        size_t bytes = 0;
    };
    // code serial, line, kind, module, module type serial, label
    using FrameKey = std::tuple<uint64_t, uint32_t, PyFrameKind, uint64_t, uint64_t, std::string>;
    using ItemFn = std::function<bool(uint64_t key, uint64_t value)>;  // false: stop

    bool code_head(uint64_t ptr, Code& c);
    bool read_code(uint64_t ptr, Code& c);
    Code* code(uint64_t ptr);
    uint32_t line_of(Code& c, uint64_t code_ptr, uint64_t instr);
    bool read_type(uint64_t ptr, Type& t);
    Type* type(uint64_t ptr);
    bool is_module(uint64_t type_ptr);
    bool has_flag(uint64_t obj_type, uint64_t flag);
    bool header(uint64_t obj, uint64_t& ob_type);
    std::optional<std::vector<uint64_t>> tuple_items(uint64_t tuple, size_t max);
    bool keys_items(uint64_t keys, uint64_t values, const ItemFn& fn);
    bool dict_items(uint64_t dict, const ItemFn& fn);
    uint64_t find_in(uint64_t keys, uint64_t values, uint64_t dict, std::string_view name);
    uint64_t dict_pointer(uint64_t obj, const Type& t);
    bool str_equals(uint64_t obj, std::string_view s);
    std::string frame_label(const cd_py_frame& f);
    const PyFrameInfo& keep_frame(FrameKey key, PyFrameInfo info);
    void build_tree(uint64_t root, Tree& tree);
    bool walk_children(uint64_t m, size_t depth, uint64_t root, Tree& tree, std::deque<std::pair<uint64_t, size_t>>& queue,
                       std::unordered_map<uint64_t, uint32_t>& name_ids);
    Tree* tree_of(uint64_t root);
    bool tree_charge(Tree& tree, uint64_t root, size_t n);
    void drop_tree(Tree& tree);
    bool evict_tree(uint64_t keep);
    std::optional<std::string> path_in(const Tree& tree, uint64_t module) const;
    // Room for `n` more bytes in the process's share and the total: taken, or false.
    bool charge(size_t n);
    void release(size_t n);

    PyDiscovery d_;
    Remote mem_;
    ObjLayout o_{};
    std::string layout_error_;  // non-empty: no types' dicts, no attributes
    uint64_t type_type_ = 0, str_type_ = 0;
    uint64_t serials_ = 0;
    uint64_t epoch_ = 1;  // LivePyResolver::begin_batch()
    std::unordered_map<uint64_t, Code> codes_;
    PyCodeTable table_;  // what the kernel is told of codes_
    std::unordered_map<uint64_t, Type> types_;
    std::map<FrameKey, PyFrameInfo> frames_;  // node-stable: frame() hands out references
    std::unordered_map<uint64_t, Tree> trees_;   // entries stay (their build counts); contents may be evicted
    size_t tree_bytes_ = 0;                      // the trees' contents: at most half the process's share
    uint64_t tree_clock_ = 0;
    std::map<std::pair<uint64_t, uint64_t>, std::optional<std::string>> paths_;
    WalkMemo* memo_ = nullptr;  // key strings seen during one tree walk
    Account account_;
    size_t bytes_ = 0;  // what the caches above hold, accounted
};

namespace {
const PyFrameInfo kUnknownFrame{};
}

LivePyResolver::Process::Process(PyDiscovery d, std::unique_ptr<PyMemory> mem, Account account)
    : d_(std::move(d)), mem_(std::move(mem)), account_(account) {
    if (!d_.ok()) return;
    o_ = obj_layout(d_.layout.minor);
    if (!mem_.get(d_.layout.code_type_addr + d_.layout.ob_type, type_type_) || !plausible(type_type_)) {
        layout_error_ = "cannot read PyCode_Type's type";
        type_type_ = 0;
        return;
    }
    layout_error_ = check_object_layout(mem_, d_.layout, o_, type_type_);
}

bool LivePyResolver::Process::charge(size_t n) {
    if (bytes_ + n > account_.per_process || !account_.budget->take(n)) return false;
    bytes_ += n;
    return true;
}

void LivePyResolver::Process::release(size_t n) {
    bytes_ -= n;
    account_.budget->give(n);
}

// ---- objects: headers, types, strings, tuples ------------------------------

bool LivePyResolver::Process::header(uint64_t obj, uint64_t& ob_type) {
    uint64_t h[2] = {0, 0};
    if (!mem_.read(obj, h, sizeof h) || !plausible_refcnt(h[0]) || !plausible(h[1])) return false;
    ob_type = h[1];
    return true;
}

bool LivePyResolver::Process::read_type(uint64_t ptr, Type& t) {
    std::array<uint8_t, kTypeRead> b{};
    if (!mem_.read(ptr, b.data(), b.size())) return false;
    const PyLayout& l = d_.layout;
    t.meta = field<uint64_t>(b.data(), l.ob_type);
    t.flags = field<uint64_t>(b.data(), l.tp_flags);
    if (!plausible_refcnt(field<uint64_t>(b.data(), 0)) || !(t.flags & kFlagReady)) return false;
    // A type's type is `type` or a metaclass (a subclass of it).
    if (t.meta != type_type_) {
        uint64_t meta_flags = 0;
        if (!mem_.get(t.meta + l.tp_flags, meta_flags) || !(meta_flags & kFlagType)) return false;
    }
    t.basicsize = field<int64_t>(b.data(), kTpBasicsize), t.itemsize = field<int64_t>(b.data(), kTpItemsize);
    t.dictoffset = field<int64_t>(b.data(), kTpDictoffset);
    t.dict = field<uint64_t>(b.data(), kTpDict), t.mro = field<uint64_t>(b.data(), kTpMro);
    t.facts = PyTypeFacts{};
    t.facts.heap = (t.flags & kFlagHeapType) != 0;
    if (t.facts.heap) {
        if (!mem_.get(ptr + o_.ht_qualname, t.name_ptr)) return false;
        auto name = str(t.name_ptr);
        if (!name) return false;
        t.facts.name = *name;
    } else if (!mem_.c_string(field<uint64_t>(b.data(), l.tp_name), t.facts.name, 128)) {
        return false;
    }
    t.torch_module = false, t.mro_done = false;
    if (t.facts.heap && t.facts.name == "Module" && layout_error_.empty()) {
        uint64_t mod = find_in(0, 0, t.dict, "__module__");
        t.torch_module = mod != 0 && str_equals(mod, "torch.nn.modules.module");
    }
    t.serial = ++serials_;
    return true;
}

// Static types live as long as the interpreter; a heap type may be freed and
// its address reused, so it is re-validated (refcount, type, qualname object).
LivePyResolver::Process::Type* LivePyResolver::Process::type(uint64_t ptr) {
    if (!plausible(ptr) || type_type_ == 0) return nullptr;
    if (auto it = types_.find(ptr); it != types_.end()) {
        Type& t = it->second;
        if (!t.facts.heap || t.checked == epoch_) return &t;
        uint64_t h[2] = {0, 0}, name = 0;
        if (mem_.read2(ptr, h, sizeof h, ptr + o_.ht_qualname, &name, sizeof name) && plausible_refcnt(h[0]) &&
            h[1] == t.meta && name == t.name_ptr) {
            t.checked = epoch_;
            return &t;
        }
        if (uint64_t w = 0; !mem_.get(ptr, w) && mem_.gone()) return &t;  // the process is gone: as for code objects
        release(t.bytes);
        types_.erase(it);
    }
    Type t;
    if (!read_type(ptr, t)) return nullptr;
    t.checked = epoch_;
    t.bytes = kEntryOverhead + sizeof(std::pair<uint64_t, Type>) + heap_of(t.facts.name);
    if (!charge(t.bytes)) {
        ++account_.stats->unread_types;
        return nullptr;
    }
    return &types_.insert_or_assign(ptr, std::move(t)).first->second;
}

bool LivePyResolver::Process::has_flag(uint64_t obj_type, uint64_t flag) {
    const Type* t = type(obj_type);
    return t != nullptr && (t->flags & flag) != 0;
}

std::optional<PyTypeFacts> LivePyResolver::Process::type_facts(uint64_t ptr) {
    Type* t = type(ptr);
    if (t == nullptr) return std::nullopt;
    PyTypeFacts f = t->facts;
    f.is_module = is_module(ptr);
    return f;
}

// Any class in the MRO that is torch's Module.  Loading the MRO's types may
// re-read this one, so no reference to it is held across them.
bool LivePyResolver::Process::is_module(uint64_t type_ptr) {
    const Type* t = type(type_ptr);
    if (t == nullptr || !layout_error_.empty()) return false;
    if (t->mro_done) return t->facts.is_module;
    const uint64_t serial = t->serial;
    auto items = tuple_items(t->mro, kMaxTupleItems);
    bool found = false;
    for (uint64_t base : items.value_or(std::vector<uint64_t>{})) {
        const Type* b = type(base);
        if (b != nullptr && b->torch_module) found = true;
    }
    auto it = types_.find(type_ptr);
    if (it != types_.end() && it->second.serial == serial && items) {
        it->second.facts.is_module = found;
        it->second.mro_done = true;
    }
    return found;
}

std::optional<std::string> LivePyResolver::Process::str(uint64_t obj) {
    if (memo_ != nullptr) {
        if (auto it = memo_->strs.find(obj); it != memo_->strs.end()) return it->second;
    }
    const PyLayout& l = d_.layout;
    // Header and the start of the text in one read, for the usual short name.
    std::array<uint8_t, 160> b{};
    size_t got = b.size();
    if (!mem_.read(obj, b.data(), got)) {
        got = l.unicode_state + 4;
        if (!mem_.read(obj, b.data(), got)) return std::nullopt;
    }
    uint64_t ob_type = field<uint64_t>(b.data(), l.ob_type);
    if (!plausible_refcnt(field<uint64_t>(b.data(), 0))) return std::nullopt;
    if (ob_type != str_type_) {
        // Learn `str` once: exactly the static type named str (a subclass's instances are not compact).
        const Type* t = str_type_ == 0 ? type(ob_type) : nullptr;
        if (t == nullptr || t->facts.heap || t->facts.name != "str" || !(t->flags & kFlagUnicode)) return std::nullopt;
        str_type_ = ob_type;
    }
    int64_t length = field<int64_t>(b.data(), l.unicode_length);
    uint32_t state = field<uint32_t>(b.data(), l.unicode_state);
    int kind = static_cast<int>((state >> 2) & 7);
    bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (length < 0 || !compact || (kind != 1 && kind != 2 && kind != 4)) return std::nullopt;
    if (ascii) kind = 1;
    size_t chars = std::min<size_t>(static_cast<size_t>(length), kPyMaxString);
    uint32_t data = ascii ? l.unicode_ascii_data : l.unicode_compact_data;
    std::vector<uint8_t> text(chars * static_cast<size_t>(kind));
    if (data + text.size() <= got) {
        std::memcpy(text.data(), b.data() + data, text.size());
    } else if (!text.empty() && !mem_.read(obj + data, text.data(), text.size())) {
        return std::nullopt;
    }
    std::string s = utf8_of(text.data(), chars, kind);
    if (memo_ != nullptr && memo_->bytes < kMaxWalkMemo) {
        memo_->bytes += kEntryOverhead + heap_of(s);
        memo_->strs.emplace(obj, s);
    }
    return s;
}

bool LivePyResolver::Process::str_equals(uint64_t obj, std::string_view s) {
    auto got = str(obj);
    return got && *got == s;
}

std::optional<std::vector<uint64_t>> LivePyResolver::Process::tuple_items(uint64_t tuple, size_t max) {
    uint64_t h[3] = {0, 0, 0};  // refcnt, type, ob_size
    if (!mem_.read(tuple, h, sizeof h) || !plausible_refcnt(h[0]) || !has_flag(h[1], kFlagTuple)) return std::nullopt;
    if (static_cast<int64_t>(h[2]) < 0) return std::nullopt;
    std::vector<uint64_t> items(std::min<size_t>(h[2], max));
    if (!items.empty() && !mem_.read(tuple + d_.layout.tuple_items, items.data(), items.size() * 8)) return std::nullopt;
    return items;
}

// ---- dicts ----------------------------------------------------------------

// Calls fn(key, value) for the live entries of a PyDictKeysObject; `values`
// is the split table's value array (0: values in the entries).
bool LivePyResolver::Process::keys_items(uint64_t keys, uint64_t values, const ItemFn& fn) {
    uint8_t h[40];
    if (!mem_.read(keys, h, sizeof h)) return false;
    uint64_t entries = 0, n = 0, esize = 24, key_at = 8, value_at = 16;
    if (d_.layout.minor == 10) {  // Objects/dict-common.h: refcnt, size, lookup, usable, nentries, indices
        uint64_t size = field<uint64_t>(h, 8);
        n = field<uint64_t>(h, 32);
        if (size < 8 || size > (1u << 26) || (size & (size - 1)) != 0 || n > size) return false;
        entries = keys + 40 + size * (size <= 0xff ? 1 : size <= 0xffff ? 2 : 4);
    } else {  // pycore_dict.h: refcnt, log2 size, log2 index bytes, kind, version, usable, nentries, indices
        uint8_t log2 = h[8], log2_index = h[9], kind = h[10];
        n = field<uint64_t>(h, 24);
        if (log2 < 3 || log2 > 26 || log2_index > log2 + 3 || n > (1ull << log2) || kind > 2) return false;
        entries = keys + 32 + (1ull << log2_index);
        if (kind != 0) esize = 16, key_at = 0, value_at = 8;  // unicode / split keys: no hash
    }
    n = std::min<uint64_t>(n, kMaxDictEntries);
    if (n == 0) return true;
    std::vector<uint8_t> e(n * esize);
    std::vector<uint64_t> v(values != 0 ? n : 0);
    if (!mem_.read(entries, e.data(), e.size())) return false;
    if (values != 0 && !mem_.read(values, v.data(), v.size() * 8)) return false;
    for (size_t i = 0; i < n; ++i) {
        uint64_t key = field<uint64_t>(e.data(), static_cast<uint32_t>(i * esize + key_at));
        uint64_t value = values != 0 ? v[i] : field<uint64_t>(e.data(), static_cast<uint32_t>(i * esize + value_at));
        if (key != 0 && value != 0 && !fn(key, value)) break;
    }
    return true;
}

bool LivePyResolver::Process::dict_items(uint64_t dict, const ItemFn& fn) {
    uint64_t h[6] = {};  // refcnt, type, used, version, keys, values
    if (!mem_.read(dict, h, sizeof h) || !plausible_refcnt(h[0]) || !has_flag(h[1], kFlagDict)) return false;
    uint64_t values = h[kMaValues / 8];
    return keys_items(h[kMaKeys / 8], values != 0 ? values + o_.values_items : 0, fn);
}

// The value under str key `name`: in a split table (keys, values) or a dict.
uint64_t LivePyResolver::Process::find_in(uint64_t keys, uint64_t values, uint64_t dict, std::string_view name) {
    uint64_t found = 0;
    auto match = [&](uint64_t key, uint64_t value) {
        if (!str_equals(key, name)) return true;
        found = value;
        return false;
    };
    if (dict != 0) dict_items(dict, match);
    else keys_items(keys, values, match);
    return found;
}

// Where a non-managed instance keeps its dict pointer (tp_dictoffset;
// negative: from the end of a variable-size object, _PyObject_DictPointer).
uint64_t LivePyResolver::Process::dict_pointer(uint64_t obj, const Type& t) {
    int64_t off = t.dictoffset;
    if (off < 0) {
        int64_t n = 0;
        if (!mem_.get(obj + kObSize, n)) return 0;
        int64_t size = (t.basicsize + std::abs(n) * t.itemsize + 7) & ~int64_t{7};
        off += size;
    }
    uint64_t dict = 0;
    if (off <= 0 || !mem_.get(obj + static_cast<uint64_t>(off), dict)) return 0;
    return dict;
}

// 3.11: the slot of `name` in the values array of the type's instances (its
// shared keys, ht_cached_keys, in insertion order).
std::optional<uint32_t> LivePyResolver::Process::values_index(uint64_t type_ptr, std::string_view name) {
    const Type* t = type(type_ptr);
    uint64_t keys = 0;
    uint8_t h[32];
    if (d_.layout.minor != 11 || t == nullptr || !(t->flags & kFlagManagedDict) ||
        !mem_.get(type_ptr + o_.ht_cached_keys, keys) || keys == 0 || !mem_.read(keys, h, sizeof h))
        return std::nullopt;
    const uint8_t log2 = h[8], log2_index = h[9], kind = h[10];
    const uint64_t n = std::min<uint64_t>(field<uint64_t>(h, 24), kMaxDictEntries);
    if (log2 < 3 || log2 > 26 || log2_index > log2 + 3 || kind != 2 || n > (1ull << log2)) return std::nullopt;
    std::vector<uint64_t> e(2 * n);  // split keys: (key, NULL) entries
    if (n == 0 || !mem_.read(keys + 32 + (1ull << log2_index), e.data(), e.size() * 8)) return std::nullopt;
    for (uint32_t i = 0; i < n; ++i)
        if (e[2 * i] != 0 && str_equals(e[2 * i], name)) return i;
    return std::nullopt;
}

uint64_t LivePyResolver::Process::attr(uint64_t obj, std::string_view name) {
    uint64_t ob_type = 0;
    if (!layout_error_.empty() || !header(obj, ob_type)) return 0;
    const Type* tp = type(ob_type);
    if (tp == nullptr) return 0;
    const Type t = *tp;  // a copy: lookups below may load more types
    const int minor = d_.layout.minor;
    if (minor == 10 || !(t.flags & kFlagManagedDict)) return find_in(0, 0, dict_pointer(obj, t), name);
    uint64_t keys = 0, dict = 0, word = 0;
    if (!mem_.get(ob_type + o_.ht_cached_keys, keys)) return 0;
    if (minor == 11) {  // values at obj - 4 words, or (materialized) the dict at obj - 3
        if (!mem_.get(obj + kManagedValues311, word)) return 0;
        if (word != 0) return find_in(keys, word, 0, name);
    } else if (minor == 12) {  // one word: values tagged with bit 0 (stored as values - 1), or the dict
        if (!mem_.get(obj + kManagedDict, word)) return 0;
        if (word & 1) return find_in(keys, word + 1, 0, name);
        dict = word;
    } else if ((t.flags & kFlagInlineValues) && t.basicsize == kObjectHead) {  // 3.13: after the head, while valid
        uint8_t vh[4] = {};
        uint64_t values = obj + kObjectHead;
        if (!mem_.read(values, vh, sizeof vh)) return 0;
        if (vh[3] != 0) return find_in(keys, values + o_.values_items, 0, name);
    }
    if (dict == 0 && !mem_.get(obj + kManagedDict, dict)) return 0;
    return dict != 0 ? find_in(0, 0, dict, name) : 0;
}

// ---- code objects and frames ---------------------------------------------

// The words a code object is known by, in one read: refcount, type, names,
// line table, argcount, first line.  False when it is not a live code object.
bool LivePyResolver::Process::code_head(uint64_t ptr, Code& c) {
    const PyLayout& l = d_.layout;
    const uint32_t name_at = l.minor == 10 ? l.code_name : l.code_qualname;
    const uint32_t len = std::max({name_at, l.code_filename, l.code_localsplusnames, o_.code_linetable}) + 8;
    std::array<uint8_t, 256> b{};
    if (len > b.size() || !mem_.read(ptr, b.data(), len)) return false;
    if (!plausible_refcnt(field<uint64_t>(b.data(), 0)) || field<uint64_t>(b.data(), l.ob_type) != l.code_type_addr)
        return false;
    c.name = field<uint64_t>(b.data(), name_at), c.filename = field<uint64_t>(b.data(), l.code_filename);
    c.linetable = field<uint64_t>(b.data(), o_.code_linetable);
    c.varnames = field<uint64_t>(b.data(), l.code_localsplusnames);
    c.argcount = field<int32_t>(b.data(), l.code_argcount);
    int32_t first = field<int32_t>(b.data(), l.code_firstlineno);
    c.firstlineno = first > 0 ? static_cast<uint32_t>(first) : 0;
    c.code_bytes = l.minor == 10 ? -1 : 2 * field<int64_t>(b.data(), kObSize);
    return true;
}

bool LivePyResolver::Process::read_code(uint64_t ptr, Code& c) {
    if (!code_head(ptr, c)) return false;
    auto q = str(c.name), f = str(c.filename);
    if (!q || !f) return false;
    c.qualname = std::move(*q), c.file = std::move(*f);
    if (auto names = tuple_items(c.varnames, 1); names && !names->empty())
        c.first_local = str(names->front()).value_or("");
    c.kind = kind_of(c.qualname, c.file, d_.layout.minor);
    c.library = library_file(c.file, d_.layout.minor);
    c.serial = ++serials_;
    return true;
}

// Cached per pointer; each use re-reads the words it was validated by, so a
// freed code object (its refcount word now the allocator's) or another
// object at the same address is noticed.
LivePyResolver::Process::Code* LivePyResolver::Process::code(uint64_t ptr) {
    if (!d_.ok() || !plausible(ptr)) return nullptr;
    if (auto it = codes_.find(ptr); it != codes_.end()) {
        Code now;
        Code& c = it->second;
        if (c.checked == epoch_) return &c;
        if (code_head(ptr, now) && now.name == c.name && now.filename == c.filename && now.linetable == c.linetable &&
            now.varnames == c.varnames && now.argcount == c.argcount && now.firstlineno == c.firstlineno) {
            c.checked = epoch_;
            table_.note(ptr, py_code_kind(c.kind, c.argcount), epoch_);
            return &c;
        }
        // Unreadable now, not changed: the process exited (or is exiting)
        // since the kernel saw a frame run this very code.  The last name
        // validated stands; records read after a fast exit keep their names.
        if (uint64_t w = 0; !mem_.get(ptr, w) && mem_.gone()) return &c;
        release(c.bytes);
        codes_.erase(it);
        table_.drop(ptr);
    }
    Code c;
    if (!read_code(ptr, c)) return nullptr;
    c.checked = epoch_;
    c.bytes = kEntryOverhead + sizeof(std::pair<uint64_t, Code>) + heap_of(c.qualname) + heap_of(c.file) +
              heap_of(c.first_local);
    if (!charge(c.bytes)) {
        ++account_.stats->unnamed_frames;
        return nullptr;
    }
    table_.note(ptr, py_code_kind(c.kind, c.argcount), epoch_);
    return &codes_.insert_or_assign(ptr, std::move(c)).first->second;
}

uint32_t LivePyResolver::Process::line_of(Code& c, uint64_t code_ptr, uint64_t instr) {
    int64_t offset = -1;
    if (d_.layout.minor == 10) {
        int32_t lasti = static_cast<int32_t>(instr);  // f_lasti: an instruction index
        if (lasti >= 0) offset = 2 * static_cast<int64_t>(lasti);
    } else if (uint64_t base = code_ptr + o_.code_adaptive; instr >= base) {
        if (instr - base < static_cast<uint64_t>(c.code_bytes)) offset = static_cast<int64_t>(instr - base);
    }
    if (offset < 0) return c.firstlineno;
    if (auto it = c.lines.find(offset); it != c.lines.end()) return it->second;
    // A table that does not fit is read for this line and not kept.
    std::string scratch;
    if (!c.table) {
        uint64_t h[3] = {0, 0, 0};  // refcnt, type, ob_size
        if (mem_.read(c.linetable, h, sizeof h) && has_flag(h[1], kFlagBytes) && h[2] <= kMaxLinetable) {
            scratch.resize(h[2]);
            if (!scratch.empty() && !mem_.read(c.linetable + kBytesData, scratch.data(), scratch.size()))
                scratch.clear();
        }
        if (charge(heap_of(scratch))) c.bytes += heap_of(scratch), c.table = std::move(scratch);
    }
    uint32_t line = py_line_of(d_.layout.minor, c.table ? *c.table : scratch, c.firstlineno, offset);
    constexpr size_t kLineBytes = kEntryOverhead + sizeof(std::pair<int64_t, uint32_t>);
    if (c.lines.size() < 4096 && charge(kLineBytes)) c.bytes += kLineBytes, c.lines.emplace(offset, line);
    return line;
}

// record_function.__enter__'s `self.name`, read while the frame is live (the
// object is short-lived: its address is reused by the next record_function).
std::string LivePyResolver::Process::frame_label(const cd_py_frame& f) {
    uint64_t now_type = 0;
    if (!header(f.self, now_type) || now_type != f.self_type) return {};
    return str(attr(f.self, "name")).value_or("");
}

const PyFrameInfo& LivePyResolver::Process::frame(const cd_py_frame& f) {
    Code* c = code(f.code);  // stays put: nothing below touches other code objects
    if (c == nullptr) return kUnknownFrame;
    const uint32_t line = line_of(*c, f.code, f.instr);
    PyFrameKind kind = c->kind;
    const Type* st = c->argcount >= 1 && f.self != 0 ? type(f.self_type) : nullptr;
    const uint64_t st_serial = st != nullptr ? st->serial : 0;
    const std::string st_name = st != nullptr ? st->facts.name : "";
    const bool mod = st != nullptr && (st->mro_done ? st->facts.is_module : is_module(f.self_type));
    const uint64_t module = mod ? f.self : 0;
    std::string label;
    if (kind == PyFrameKind::RecordFunctionEnter) {
        if ((d_.layout.minor == 10 && st_name != "record_function") || c->first_local != "self") kind = PyFrameKind::Plain;
        else label = frame_label(f);
    }
    // Past kMaxFrames only labels are dropped: the rest is bounded by the program's code and modules.
    if (frames_.size() >= kMaxFrames && !label.empty()) {
        ++account_.stats->dropped_labels;
        label = std::string();
    }
    FrameKey key{c->serial, line, kind, module, module != 0 ? st_serial : 0, label};
    if (auto it = frames_.find(key); it != frames_.end()) return it->second;
    PyFrameInfo info;
    info.qualname = c->qualname, info.file = c->file, info.line = line, info.known = true;
    info.kind = kind, info.module = module, info.module_class = module != 0 ? st_name : "";
    info.label = std::move(label), info.library = c->library;
    return keep_frame(std::move(key), std::move(info));
}

// A new entry; past the bytes bound the same frame without its label, where
// it fits or is there; else the frame goes unnamed.
const PyFrameInfo& LivePyResolver::Process::keep_frame(FrameKey key, PyFrameInfo info) {
    auto cost = [](const FrameKey& k, const PyFrameInfo& i) {
        return kEntryOverhead + sizeof(std::pair<const FrameKey, PyFrameInfo>) + heap_of(std::get<5>(k)) + cost_of(i);
    };
    if (charge(cost(key, info))) return frames_.emplace(std::move(key), std::move(info)).first->second;
    if (!info.label.empty()) {
        ++account_.stats->dropped_labels;
        std::get<5>(key) = std::string(), info.label = std::string();
        if (auto it = frames_.find(key); it != frames_.end()) return it->second;
        if (charge(cost(key, info))) return frames_.emplace(std::move(key), std::move(info)).first->second;
    }
    ++account_.stats->unnamed_frames;
    return kUnknownFrame;
}

// ---- module paths -----------------------------------------------------------

// Module trees take at most half the process's share: the code objects and
// frames of the same records need the rest.  Past it the least recently asked
// tree goes (but the one being walked); a tree alone larger is cut there.
bool LivePyResolver::Process::tree_charge(Tree& tree, uint64_t root, size_t n) {
    for (;;) {
        if (tree_bytes_ + n <= account_.per_process / 2 && charge(n)) {
            tree_bytes_ += n, tree.bytes += n;
            return true;
        }
        if (!evict_tree(root)) return false;
    }
}

void LivePyResolver::Process::drop_tree(Tree& tree) {
    std::unordered_map<uint64_t, Tree::Node>().swap(tree.nodes);
    std::vector<std::string>().swap(tree.names);
    release(tree.bytes);
    tree_bytes_ -= tree.bytes, tree.bytes = 0;
}

bool LivePyResolver::Process::evict_tree(uint64_t keep) {
    Tree* lru = nullptr;
    for (auto& [root, t] : trees_)
        if (root != keep && t.bytes != 0 && (lru == nullptr || t.used < lru->used)) lru = &t;
    if (lru == nullptr) return false;
    drop_tree(*lru);
    ++account_.stats->evicted_trees;
    return true;
}

LivePyResolver::Process::Tree* LivePyResolver::Process::tree_of(uint64_t root) {
    if (auto it = trees_.find(root); it != trees_.end()) return &it->second;
    if (!charge(kEntryOverhead + sizeof(std::pair<uint64_t, Tree>))) return nullptr;
    return &trees_[root];
}

// The children of module `m` (its _modules dict) join the tree; false when
// the tree is full or out of room.
bool LivePyResolver::Process::walk_children(uint64_t m, size_t depth, uint64_t root, Tree& tree,
                                            std::deque<std::pair<uint64_t, size_t>>& queue,
                                            std::unordered_map<uint64_t, uint32_t>& name_ids) {
    constexpr size_t kNodeBytes = kEntryOverhead + sizeof(std::pair<uint64_t, Tree::Node>);
    uint64_t modules = depth < kMaxModuleDepth ? attr(m, "_modules") : 0;
    bool room = true;
    if (modules == 0) return true;
    dict_items(modules, [&](uint64_t key, uint64_t child) {
        if (child == d_.layout.none_addr || tree.nodes.count(child) != 0) return true;
        auto id = name_ids.find(key);
        if (id == name_ids.end()) {
            auto name = str(key);
            if (!name) return true;
            if (!(room = tree_charge(tree, root, sizeof(std::string) + heap_of(*name) + kEntryOverhead))) return false;
            tree.names.push_back(std::move(*name));
            id = name_ids.emplace(key, static_cast<uint32_t>(tree.names.size() - 1)).first;
        }
        if (!(room = tree_charge(tree, root, kNodeBytes))) return false;
        tree.nodes.emplace(child, Tree::Node{m, id->second});
        queue.emplace_back(child, depth + 1);
        return tree.nodes.size() < kMaxModules;
    });
    return room && tree.nodes.size() < kMaxModules;
}

void LivePyResolver::Process::build_tree(uint64_t root, Tree& tree) {
    WalkMemo memo;
    memo_ = &memo;
    drop_tree(tree);
    // Key objects to names: a key shared by many modules ("0", "weight") is one name.
    std::unordered_map<uint64_t, uint32_t> name_ids;
    bool whole = tree_charge(tree, root, kEntryOverhead + sizeof(std::pair<uint64_t, Tree::Node>));
    if (whole) tree.nodes.emplace(root, Tree::Node{});
    std::deque<std::pair<uint64_t, size_t>> queue{{root, 0}};
    while (whole && !queue.empty()) {
        auto [m, depth] = queue.front();
        queue.pop_front();
        whole = walk_children(m, depth, root, tree, queue, name_ids);
    }
    // The name index was charged as part of the names (kEntryOverhead each) and is kept as such.
    memo_ = nullptr;
    if (!whole && tree.nodes.size() < kMaxModules) ++account_.stats->cut_walks;
}

// The dotted path from the tree's root, cut on the left past kPyMaxModulePath.
std::optional<std::string> LivePyResolver::Process::path_in(const Tree& tree, uint64_t module) const {
    std::vector<const std::string*> names;  // innermost first
    size_t len = 0;
    bool cut = false;
    for (uint64_t m = module, steps = 0;; ++steps) {
        auto it = tree.nodes.find(m);
        if (it == tree.nodes.end() || steps > kMaxModuleDepth) return std::nullopt;
        if (it->second.parent == 0) break;
        const std::string& name = tree.names[it->second.name];
        if (len + name.size() + 1 > kPyMaxModulePath) cut = true;
        if (!cut) names.push_back(&name), len += name.size() + 1;
        m = it->second.parent;
    }
    std::string path = cut ? "\u2026" : "";
    for (size_t i = names.size(); i-- > 0;) path += (path.empty() ? "" : ".") + *names[i];
    return path;
}

// The tree below `root` is walked once; a module not in it may have been
// added since, so a miss walks it again, but at most once a second and
// kMaxTreeBuilds times (a model that makes modules in forward() misses
// often, and a large tree takes a while), then the answer is kept.  An
// evicted tree misses everything: walked again under the same rule.
std::optional<std::string> LivePyResolver::Process::module_path(uint64_t root, uint64_t module) {
    if (root == module) return std::string();
    if (!d_.ok() || !layout_error_.empty()) return std::nullopt;
    const auto key = std::make_pair(root, module);
    if (auto it = paths_.find(key); it != paths_.end()) return it->second;
    Tree* tree = tree_of(root);
    if (tree == nullptr) {
        ++account_.stats->cut_walks;
        return std::nullopt;
    }
    tree->used = ++tree_clock_;
    const auto now = std::chrono::steady_clock::now();
    if (tree->builds == 0 || (tree->nodes.count(module) == 0 && tree->builds < kMaxTreeBuilds &&
                              now - tree->built >= std::chrono::seconds(1))) {
        build_tree(root, *tree);
        tree->built = now, ++tree->builds;
    }
    std::optional<std::string> path = path_in(*tree, module);
    if (charge(kEntryOverhead + sizeof(std::pair<decltype(key), std::optional<std::string>>) + heap_of(path)))
        paths_.emplace(key, path);
    return path;
}

// ---- the resolver -----------------------------------------------------------

PyCacheBudget& PyCacheBudget::program_wide() {
    static PyCacheBudget budget(limits::kPyCacheBytesTotal);
    return budget;
}

bool PyCacheBudget::take(size_t n) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (n > total_ || used > total_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
}

LivePyResolver::LivePyResolver(std::string proc_root, size_t per_process, PyCacheBudget& budget)
    : proc_root_(std::move(proc_root)), per_process_(per_process), budget_(budget) {}
LivePyResolver::~LivePyResolver() = default;

LivePyResolver::Process& LivePyResolver::process(uint32_t pid) {
    auto it = procs_.find(pid);
    if (it == procs_.end())
        adopt(pid, discover_python(static_cast<int>(pid), proc_root_)), it = procs_.find(pid);
    return *it->second;
}

void LivePyResolver::adopt(uint32_t pid, const PyDiscovery& d) {
    adopt(pid, d, std::make_unique<LiveMemory>(static_cast<int>(pid)));
}

void LivePyResolver::adopt(uint32_t pid, const PyDiscovery& d, std::unique_ptr<PyMemory> mem) {
    procs_.erase(pid);  // its bytes go back before the new one takes any
    procs_[pid] = std::make_unique<Process>(d, std::move(mem), Process::Account{per_process_, &budget_, &stats_[pid]});
}

PyCacheStats LivePyResolver::cache_stats(uint32_t pid) const {
    auto it = stats_.find(pid);
    PyCacheStats s = it != stats_.end() ? it->second : PyCacheStats{};
    auto p = procs_.find(pid);
    s.bytes = p != procs_.end() ? p->second->bytes() : 0;
    return s;
}

std::optional<std::string> LivePyResolver::cache_note(uint32_t pid) const {
    const PyCacheStats s = cache_stats(pid);
    if (!s.lossy()) return std::nullopt;
    std::string what;
    auto add = [&](uint64_t n, const char* text) {
        if (n != 0) what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + text;
    };
    add(s.unnamed_frames, "frames left <unknown>");
    add(s.unread_types, "types not read (their modules unnamed)");
    add(s.dropped_labels, "record_function labels dropped");
    add(s.evicted_trees, "module trees evicted and walked again");
    add(s.cut_walks, "module tree walks cut short (modules past them are <unknown>)");
    auto size = [](size_t n) { return n >= (1u << 20) ? std::to_string(n >> 20) + " MiB" : std::to_string(n >> 10) + " KiB"; };
    return "Python names of pid " + std::to_string(pid) + " reached the resolver's memory bound (" + size(per_process_) +
           " per process, " + size(budget_.total()) + " in all): " + what;
}

void LivePyResolver::drop_stats(uint32_t pid) {
    procs_.erase(pid);  // first: it counts into its entry
    stats_.erase(pid);
}

const PyDiscovery& LivePyResolver::discovery(uint32_t pid) { return process(pid).discovery(); }

std::string LivePyResolver::object_layout_error(uint32_t pid) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.layout_error() : p.discovery().reason;
}

std::optional<uint32_t> LivePyResolver::values_index(uint32_t pid, uint64_t type_ptr, std::string_view name) {
    return process(pid).values_index(type_ptr, name);
}

const PyFrameInfo& LivePyResolver::frame(uint32_t pid, const cd_py_frame& f) {
    Process& p = process(pid);
    p.set_epoch(epoch_);
    return p.frame(f);
}

std::optional<std::string> LivePyResolver::module_path(uint32_t pid, uint64_t root, uint64_t module) {
    return process(pid).module_path(root, module);
}

void LivePyResolver::forget(uint32_t pid) { procs_.erase(pid); }

void LivePyResolver::take_code_tables(const std::function<void(uint32_t, const cd_py_codes&)>& fn) {
    for (auto& [pid, p] : procs_)
        if (p->code_table().take_changed()) fn(pid, p->code_table().slots());
}

std::optional<PyTypeFacts> LivePyResolver::type(uint32_t pid, uint64_t type_ptr) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.type_facts(type_ptr) : std::nullopt;
}

uint64_t LivePyResolver::attr(uint32_t pid, uint64_t obj, std::string_view name) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.attr(obj, name) : 0;
}

std::optional<std::string> LivePyResolver::str(uint32_t pid, uint64_t obj) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.str(obj) : std::nullopt;
}

}  // namespace commdbg
