// SPDX-License-Identifier: Apache-2.0
// LivePyResolver::Process (py_objects.hpp): one process's caches and the
// readers of its objects, defined across py_objects.cpp (accounting, the
// object layout check), py_object_reads.cpp (types, strs, tuples, dicts,
// attributes), py_frames.cpp (code objects, line tables, frame names) and
// py_module_tree.cpp (module paths).  For those files only.
#pragma once

#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "arch.hpp"
#include "py_objects.hpp"
#include "remote_memory.hpp"

namespace commdbg::python {
namespace pyobj {

// A live object's ob_refcnt: a freed pymalloc block holds the free list's
// next pointer (or NULL) there, glibc's tcache a mangled pointer.  3.12+
// immortal objects sit at 2^30 - 1 / 2^32 - 1.
inline bool plausible_refcnt(uint64_t rc) { return rc >= 1 && rc <= (1ull << 33); }

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

inline constexpr uint32_t kTpBasicsize = 32, kTpItemsize = 40, kTpMembers = 240, kTpBase = 256, kTpDict = 264;
inline constexpr uint32_t kTpDictoffset = 288, kTpMro = 344, kTypeRead = kTpMro + 8;
inline constexpr uint32_t kMaKeys = 32, kMaValues = 40, kBytesData = 32, kObSize = 16, kObjectHead = 16;
inline constexpr int64_t kManagedDict = -24, kManagedValues311 = -CD_PY311_VALUES_BEFORE;  // pycore_object.h: obj - 3 / 4 words

// descrobject.h: PyMemberDescrObject's d_member after PyDescr_COMMON (head,
// d_type, d_name, d_qualname); PyMemberDef {name, type, offset, ...} and
// T_OBJECT_EX (structmember.h; Py_T_OBJECT_EX in 3.12+).  The same in 3.10-3.13.
inline constexpr uint32_t kDescrMember = 40, kMemberType = 8, kMemberOffset = 16;
inline constexpr int32_t kTObjectEx = 16;
// longintrepr.h: an int's one digit at 24 (30-bit digits, as x86-64 builds
// configure them); before it ob_size (3.10, 3.11: signed digit count) or
// lv_tag (3.12+: digit count << 3 | sign, sign 0 positive, 1 zero, 2 negative).
inline constexpr uint32_t kLongDigit = 24;
inline constexpr uint64_t kFlagLong = 1ull << 24;
// listobject.h: ob_size at 16, ob_item (the items' array) at 24;
// classobject.h: a bound method's im_func at 16, im_self at 24.  3.10-3.13.
inline constexpr uint32_t kListItems = 24, kMethodSelf = 24;
inline constexpr uint64_t kFlagList = 1ull << 25;

inline constexpr uint64_t kFlagInlineValues = 1ull << 2;  // 3.13
inline constexpr uint64_t kFlagManagedDict = 1ull << 4;   // 3.11+
inline constexpr uint64_t kFlagHeapType = 1ull << 9;
inline constexpr uint64_t kFlagReady = 1ull << 12;
inline constexpr uint64_t kFlagTuple = 1ull << 26, kFlagBytes = 1ull << 27, kFlagUnicode = 1ull << 28;
inline constexpr uint64_t kFlagDict = 1ull << 29, kFlagType = 1ull << 31;

inline constexpr size_t kMaxDictEntries = 16384;  // a dict larger than this is read in part
inline constexpr size_t kMaxTupleItems = 64;      // MRO depth, names read
inline constexpr size_t kMaxLinetable = 64 * 1024;
inline constexpr size_t kMaxModules = 10000, kMaxModuleDepth = 32;
inline constexpr int kMaxTreeBuilds = 16;
// Distinct resolved frames kept per process (references stay valid until
// forget): record_function labels such as "step 1234" would grow it forever.
inline constexpr size_t kMaxFrames = 100000;
// Bytes of the key strings one tree walk remembers (the same interned keys,
// "_modules", "training", in every module): past them it reads them again.
inline constexpr size_t kMaxWalkMemo = 1u << 20;

// The table above for CPython 3.`minor`.
ObjLayout obj_layout(int minor);
// The table against the target: PyType_Type's own members and size,
// PyCode_Type's co_linetable and size.
Result<bool> check_object_layout(host::RemoteMemory& mem, const PyLayout& l, const ObjLayout& o, uint64_t type_type);

// ---- what a cached entry costs ----------------------------------------------

// A node of a std::map / unordered_map with its share of the buckets and the
// allocator's header: the accounting errs on the side of too much.
inline constexpr size_t kEntryOverhead = 64;
// A string's own allocation (libstdc++ keeps up to 15 characters inline).
inline size_t heap_of(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }
inline size_t heap_of(const std::optional<std::string>& s) { return s ? heap_of(*s) : 0; }

inline size_t cost_of(const PyFrameInfo& f) {
    return heap_of(f.qualname) + heap_of(f.file) + heap_of(f.module_class) + heap_of(f.label);
}

}  // namespace pyobj

// ---- one process ----------------------------------------------------------

class LivePyResolver::Process {
public:
    // Where its caches' bytes are counted and what the bound cost it.
    struct Account {
        size_t per_process;
        PyCacheBudget* budget;
        PyCacheStats* stats;
    };
    Process(PyDiscovery d, std::unique_ptr<host::RemoteMemory> mem, Account account);
    ~Process() { account_.budget->give(bytes_); }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;
    size_t bytes() const { return bytes_; }
    const PyDiscovery& discovery() const { return d_; }
    const std::string& layout_error() const { return layout_error_; }
    const PyFrameInfo& frame(const cd_py_frame& f);
    uint64_t stack(uint32_t tid, std::span<const cd_py_frame> raw, std::vector<const PyFrameInfo*>& out);
    std::optional<std::string> module_path(uint64_t root, uint64_t module);
    std::optional<PyTypeFacts> type_facts(uint64_t t);
    uint64_t attr(uint64_t obj, std::string_view name);
    std::optional<std::string> str(uint64_t obj);
    void set_epoch(uint64_t e) { epoch_ = e; }
    // At a batch's start (epoch `e`): the code objects the last batch named,
    // re-validated together (one system call per IOV_MAX of them, not one
    // each as frames ask): most frames of a batch ran code the last one ran.
    void revalidate_used(uint64_t e);
    PyCodeTable& code_table() { return table_; }
    std::optional<uint32_t> values_index(uint64_t type_ptr, std::string_view name);
    uint64_t type_of(uint64_t obj) {
        uint64_t t = 0;
        return header(obj, t) ? t : 0;
    }
    bool items_of(uint64_t dict, const std::function<bool(uint64_t, uint64_t)>& fn) {
        return layout_error_.empty() && dict_items(dict, fn);
    }
    std::optional<std::vector<uint64_t>> tuple_of(uint64_t tuple, size_t max) {
        return layout_error_.empty() ? tuple_items(tuple, max) : std::nullopt;
    }
    uint64_t slot(uint64_t obj, std::string_view name);
    std::optional<int64_t> small_int(uint64_t obj);
    std::optional<bool> truth(uint64_t obj);
    std::optional<std::vector<uint64_t>> list_items(uint64_t list, size_t max);
    uint64_t method_self(uint64_t method);

private:
    // The words a code object is known by: it still holds them, or it is
    // not the code object it was.
    struct CodeHead {
        uint64_t name = 0, filename = 0, linetable = 0, varnames = 0;  // what it was read from: re-validation
        int32_t argcount = 0;
        uint32_t firstlineno = 0;
        int64_t code_bytes = -1;  // 3.11+: bytecode size, for the instruction offset's bounds
        bool same_object(const CodeHead& o) const {
            return name == o.name && filename == o.filename && linetable == o.linetable && varnames == o.varnames &&
                   argcount == o.argcount && firstlineno == o.firstlineno;
        }
    };
    struct Code {
        uint64_t serial = 0;
        uint64_t checked = 0;  // epoch it was last re-validated in
        uint64_t used = 0;     // epoch a frame last named it in: re-validated at the next batch's start
        CodeHead head;
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

    static constexpr uint32_t kCodeHeadMax = 256;      // bytes of a code object's head read (3.10-3.13: < 160)
    static constexpr size_t kRevalidateMax = 4096;     // code objects re-validated together at a batch's start
    bool code_head(uint64_t ptr, CodeHead& h);
    bool parse_code_head(const uint8_t* b, CodeHead& h) const;
    uint32_t code_head_bytes() const;
    Code* mark_used(uint64_t ptr, Code& c);
    bool read_code(uint64_t ptr, Code& c);
    Code* code(uint64_t ptr);
    uint32_t line_of(Code& c, uint64_t code_ptr, uint64_t instr);
    bool read_type(uint64_t ptr, Type& t);
    Type* type(uint64_t ptr);
    bool is_module(uint64_t type_ptr);
    bool has_flag(uint64_t obj_type, uint64_t flag);
    bool header(uint64_t obj, uint64_t& ob_type);
    std::optional<std::vector<uint64_t>> tuple_items(uint64_t tuple, size_t max);
    std::optional<int64_t> one_digit(uint64_t obj, std::string_view name);
    bool keys_items(uint64_t keys, uint64_t values, const ItemFn& fn);
    bool dict_items(uint64_t dict, const ItemFn& fn);
    uint64_t find_in(uint64_t keys, uint64_t values, uint64_t dict, std::string_view name);
    uint64_t dict_pointer(uint64_t obj, const Type& t);
    uint64_t member_value(uint64_t obj, uint64_t descr, std::string_view name, int64_t basicsize);
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
    std::unique_ptr<host::RemoteMemory> mem_;
    pyobj::ObjLayout o_{};
    std::string layout_error_;  // non-empty: no types' dicts, no attributes
    uint64_t type_type_ = 0, str_type_ = 0;
    uint64_t serials_ = 0;
    uint64_t epoch_ = 1;  // LivePyResolver::begin_batch()
    std::unordered_map<uint64_t, Code> codes_;
    std::vector<uint64_t> used_;  // the code objects named in the current batch (Code::used == epoch_)
    PyCodeTable table_;  // what the kernel is told of codes_
    std::unordered_map<uint64_t, Type> types_;
    std::map<FrameKey, PyFrameInfo> frames_;  // node-stable: frame() hands out references
    // A thread's last stack as stack() named it, in the batch it was named in.
    struct StackMemo {
        uint32_t tid = 0;
        uint64_t epoch = 0;   // 0: none
        uint64_t serial = 0;  // what stack() returns for it: unique in the program
        std::vector<cd_py_frame> raw;
        std::vector<const PyFrameInfo*> named;
    };
    static constexpr size_t kStackMemos = 8;  // by tid, direct-mapped
    std::array<StackMemo, kStackMemos> memos_;
    bool memos_charged_ = false;
    std::unordered_map<uint64_t, Tree> trees_;   // entries stay (their build counts); contents may be evicted
    size_t tree_bytes_ = 0;                      // the trees' contents: at most half the process's share
    uint64_t tree_clock_ = 0;
    std::map<std::pair<uint64_t, uint64_t>, std::optional<std::string>> paths_;
    WalkMemo* memo_ = nullptr;  // key strings seen during one tree walk
    Account account_;
    size_t bytes_ = 0;  // what the caches above hold, accounted
};

}  // namespace commdbg::python
