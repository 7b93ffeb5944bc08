// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the Python resolver (py_objects.hpp): a synthetic
// CPython 3.11 memory image -- types, strs, dicts, tuples, bytes, code
// objects and a module tree, shaped by the input's first bytes -- is read
// through an in-memory host::RemoteMemory while the rest of the input mutates it
// (words overwritten with pointers anywhere into it, huge lengths, _modules
// pointing back up, non-str keys, hostile line tables) and drives the readers
// (frame, module_path, attr, str, type).  Two processes share one budget.  A
// crash, a sanitizer report, a str over its bound or caches over their byte
// bounds (per process, in total, or bytes not all given back) is a finding.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "py_objects.hpp"

namespace {

using namespace commdbg;
using namespace commdbg::python;

constexpr uint64_t kBase = 0x10000000;
constexpr size_t kPerProcess = 64u << 10, kTotal = 96u << 10;  // small: the bounds bind on small images
constexpr uint64_t kReady = 1ull << 12, kHeap = 1ull << 9, kTupleF = 1ull << 26, kBytesF = 1ull << 27;
constexpr uint64_t kUnicodeF = 1ull << 28, kDictF = 1ull << 29, kTypeF = 1ull << 31;

void require(bool cond) {
    if (!cond) abort();
}

// The input, read front to back; zeros once it is used up.
struct Input {
    const uint8_t* p;
    size_t n;
    bool empty() const { return n == 0; }
    uint64_t take(size_t bytes) {
        uint64_t v = 0;
        for (size_t i = 0; i < bytes && n > 0; ++i, ++p, --n) v |= uint64_t{*p} << (8 * i);
        return v;
    }
};

// Objects laid out in one buffer at kBase, as in a target's heap.
class Image {
public:
    uint64_t alloc(size_t n) {
        const uint64_t a = kBase + bytes.size();
        bytes.resize(bytes.size() + ((n + 15) & ~size_t{15}));
        objects.push_back(a);
        return a;
    }
    void w64(uint64_t a, uint64_t v) { std::memcpy(&bytes[a - kBase], &v, 8); }
    void w32(uint64_t a, uint32_t v) { std::memcpy(&bytes[a - kBase], &v, 4); }
    void put(uint64_t a, const void* d, size_t n) { std::memcpy(&bytes[a - kBase], d, n); }
    uint64_t cstr(const std::string& s) {
        uint64_t a = alloc(s.size() + 1);
        put(a, s.c_str(), s.size() + 1);
        return a;
    }
    std::vector<uint8_t> bytes;
    std::vector<uint64_t> objects;
};

class ImageMemory final : public host::RemoteMemory {
public:
    explicit ImageMemory(const std::vector<uint8_t>& b) : b_(b) {}

protected:
    int fetch(uint64_t addr, void* out, size_t n) override {
        if (addr < kBase || addr - kBase > b_.size() || n > b_.size() - (addr - kBase)) return EFAULT;
        std::memcpy(out, b_.data() + (addr - kBase), n);
        return 0;
    }

private:
    const std::vector<uint8_t>& b_;
};

// CPython 3.11's objects at the offsets the resolver (py_process.hpp) and discovery (py_layouts.cpp) verified.
class World {
public:
    Image img;
    uint64_t type_type = 0, code_type = 0, str_type = 0, dict_type = 0, tuple_type = 0, bytes_type = 0, none = 0;
    uint64_t module_cls = 0, rf_cls = 0;
    std::vector<uint64_t> modules, codes;

    uint64_t type(const std::string& name, uint64_t flags, int64_t basic, uint64_t meta) {
        uint64_t t = img.alloc(904);
        img.w64(t, 1), img.w64(t + 8, meta ? meta : t), img.w64(t + 24, img.cstr(name));
        img.w64(t + 32, static_cast<uint64_t>(basic)), img.w64(t + 168, flags | kReady);
        return t;
    }
    void members(uint64_t t, const std::vector<std::pair<std::string, int64_t>>& m) {
        uint64_t table = img.alloc(40 * (m.size() + 1));
        for (size_t i = 0; i < m.size(); ++i)
            img.w64(table + 40 * i, img.cstr(m[i].first)), img.w64(table + 40 * i + 16, static_cast<uint64_t>(m[i].second));
        img.w64(t + 240, table);
    }
    uint64_t str(const std::string& s) {
        uint64_t o = img.alloc(48 + s.size() + 1);
        img.w64(o, 1), img.w64(o + 8, str_type), img.w64(o + 16, s.size());
        img.w32(o + 32, (1u << 2) | (1u << 5) | (1u << 6));  // kind 1, compact, ascii
        img.put(o + 48, s.data(), s.size());
        return o;
    }
    uint64_t tuple(const std::vector<uint64_t>& items) {
        uint64_t o = img.alloc(24 + 8 * items.size());
        img.w64(o, 1), img.w64(o + 8, tuple_type), img.w64(o + 16, items.size());
        for (size_t i = 0; i < items.size(); ++i) img.w64(o + 24 + 8 * i, items[i]);
        return o;
    }
    uint64_t bytes(const std::string& data) {
        uint64_t o = img.alloc(32 + data.size() + 1);
        img.w64(o, 1), img.w64(o + 8, bytes_type), img.w64(o + 16, data.size());
        img.put(o + 32, data.data(), data.size());
        return o;
    }
    // A combined dict with unicode keys (dk_kind 1: key, value entries).
    uint64_t dict(const std::vector<std::pair<uint64_t, uint64_t>>& kv) {
        uint8_t log2 = 3;
        while ((size_t{1} << log2) < kv.size()) ++log2;
        const uint8_t log2_index = static_cast<uint8_t>(log2 + (log2 < 8 ? 0 : log2 < 16 ? 1 : 2));
        uint64_t keys = img.alloc(32 + (size_t{1} << log2_index) + 16 * kv.size());
        img.w64(keys, 1);
        const uint8_t head[3] = {log2, log2_index, 1};
        img.put(keys + 8, head, 3);
        img.w64(keys + 24, kv.size());
        for (size_t i = 0; i < kv.size(); ++i) {
            uint64_t e = keys + 32 + (size_t{1} << log2_index) + 16 * i;
            img.w64(e, kv[i].first), img.w64(e + 8, kv[i].second);
        }
        uint64_t d = img.alloc(48);
        img.w64(d, 1), img.w64(d + 8, dict_type), img.w64(d + 16, kv.size()), img.w64(d + 32, keys);
        return d;
    }
    uint64_t heap_class(const std::string& name, const std::string& module) {
        uint64_t t = type(name, kHeap, 24, type_type);
        img.w64(t + 264, dict({{str("__module__"), str(module)}}));
        img.w64(t + 288, 16);  // tp_dictoffset: the instance's dict pointer after its head
        img.w64(t + 344, tuple({t}));
        img.w64(t + 864, str(name));
        return t;
    }
    uint64_t instance(uint64_t cls, const std::vector<std::pair<uint64_t, uint64_t>>& attrs) {
        uint64_t o = img.alloc(24);
        img.w64(o, 1), img.w64(o + 8, cls), img.w64(o + 16, dict(attrs));
        return o;
    }
    uint64_t code(const std::string& qual, const std::string& file, const std::string& table, uint32_t units) {
        uint64_t c = img.alloc(184 + 2 * units);
        img.w64(c, 1), img.w64(c + 8, code_type), img.w64(c + 16, units);
        img.w32(c + 56, 1), img.w32(c + 72, 10);
        img.w64(c + 96, tuple({str("self")})), img.w64(c + 112, str(file)), img.w64(c + 120, str("fn"));
        img.w64(c + 128, str(qual)), img.w64(c + 136, bytes(table));
        return c;
    }

    void types() {
        img.alloc(16);  // nothing at kBase itself
        type_type = type("type", kTypeF, 904, 0);
        members(type_type, {{"__basicsize__", 32}, {"__itemsize__", 40}, {"__flags__", 168}, {"__base__", 256},
                            {"__dictoffset__", 288}, {"__mro__", 344}});
        code_type = type("code", 0, 184, type_type);
        members(code_type, {{"co_linetable", 136}});
        str_type = type("str", kUnicodeF, 72, type_type);
        dict_type = type("dict", kDictF, 48, type_type);
        tuple_type = type("tuple", kTupleF, 24, type_type);
        bytes_type = type("bytes", kBytesF, 33, type_type);
        none = img.alloc(16);
        img.w64(none, 1), img.w64(none + 8, type("NoneType", 0, 16, type_type));
    }

    // A tree `depth` deep of `fan` children per module, names `name_len` long.
    void tree(Input& in) {
        module_cls = heap_class("Module", "torch.nn.modules.module");
        const size_t depth = 1 + in.take(1) % 40, fan = 1 + in.take(1) % 6, name_len = in.take(2) % 2048;
        std::vector<uint64_t> level = {instance(module_cls, {})};
        modules = level;
        for (size_t d = 0; d < depth && modules.size() < 400; ++d) {
            std::vector<uint64_t> next;
            for (uint64_t parent : level) {
                std::vector<std::pair<uint64_t, uint64_t>> kids;
                for (size_t i = 0; i < fan && modules.size() < 400; ++i) {
                    std::string name = std::to_string(d) + "_" + std::to_string(i);
                    name.resize(std::max(name.size(), name_len), 'n');
                    uint64_t child = instance(module_cls, {});
                    kids.push_back({str(name), child});
                    next.push_back(child), modules.push_back(child);
                }
                img.w64(parent + 16, dict({{str("training"), none}, {str("_modules"), dict(kids)}}));
            }
            level = std::move(next);
        }
    }

    void code_objects(Input& in) {
        rf_cls = heap_class("record_function", "torch.autograd.profiler");
        const size_t n = 1 + in.take(1) % 32, qual_len = in.take(2) % 2048, table_len = in.take(3) % (72u << 10);
        for (size_t i = 0; i < n; ++i) {
            std::string table(table_len, static_cast<char>(in.take(1) | 0x80));
            std::string q = i % 3 == 0 ? "Module._call_impl" : i % 3 == 1 ? "record_function.__enter__" : "f";
            q.resize(std::max(q.size(), qual_len), 'q');
            const char* file = i % 3 == 0   ? "/x/torch/nn/modules/module.py"
                               : i % 3 == 1 ? "/x/torch/autograd/profiler.py"
                                            : "/srv/train.py";
            codes.push_back(code(q, file, table, 1 + static_cast<uint32_t>(in.take(1))));
        }
        modules.push_back(instance(rf_cls, {{str("name"), str(std::string(in.take(2) % 1024, 'L'))}}));
    }

    PyDiscovery discovery() const {
        PyDiscovery d;
        d.status = PyDiscovery::Status::supported;
        PyLayout& l = d.layout;
        l.major = 3, l.minor = 11;
        l.ob_type = 8, l.tp_name = 24, l.tp_flags = 168, l.tuple_items = 24, l.cell_contents = 16;
        l.unicode_length = 16, l.unicode_state = 32, l.unicode_ascii_data = 48, l.unicode_compact_data = 72;
        l.code_argcount = 56, l.code_firstlineno = 72, l.code_localsplusnames = 96, l.code_filename = 112;
        l.code_name = 120, l.code_qualname = 128;
        l.code_type_addr = code_type, l.none_addr = none;
        return d;
    }
};

// A pointer the input chooses: an object, near one, anywhere in the image, or raw.
uint64_t pick(Input& in, const World& w) {
    const std::vector<uint64_t>& objs = w.img.objects;
    const uint64_t sel = in.take(1), v = in.take(2);
    switch (sel % 6) {
    case 0: return w.modules[v % w.modules.size()];
    case 1: return w.codes[v % w.codes.size()];
    case 2: return objs[v % objs.size()];
    case 3: return objs[v % objs.size()] + (v >> 8) % 64 * 8 - 256;
    case 4: return kBase + v * 8 % w.img.bytes.size();
    default: return in.take(8);
    }
}

// Overwrites a word of the image: the pointers, lengths and counts objects are made of.
void mutate(Input& in, World& w) {
    const uint64_t at = kBase + (in.take(3) * 8) % (w.img.bytes.size() - 8);
    const uint64_t how = in.take(1);
    uint64_t v = 0;
    switch (how % 5) {
    case 0: v = pick(in, w); break;
    case 1: v = uint64_t{1} << (in.take(1) % 64); break;  // huge lengths, counts, flags
    case 2: v = in.take(1); break;
    case 3: v = ~uint64_t{0} - in.take(1); break;  // negative sizes
    default: v = in.take(8); break;
    }
    w.img.w64(at, v);
}

void check(const LivePyResolver& res, const PyCacheBudget& budget) {
    const size_t a = res.cache_stats(1).bytes, b = res.cache_stats(2).bytes;
    require(a <= kPerProcess && b <= kPerProcess);
    require(budget.used() <= kTotal);
    require(budget.used() == a + b);
}

void drive(Input& in, World& w, LivePyResolver& res) {
    const uint32_t pid = 1 + static_cast<uint32_t>(in.take(1) & 1);
    switch (in.take(1) % 9) {
    case 0:
    case 1: mutate(in, w); break;
    case 2: {
        const uint64_t code = pick(in, w);
        const uint64_t instr = in.take(1) & 1 ? code + 184 + 2 * in.take(1) : in.take(8);
        const PyFrameInfo& f = res.frame(pid, cd_py_frame{code, pick(in, w), pick(in, w), instr});
        require(f.qualname.size() <= 4 * kPyMaxString && f.label.size() <= 4 * kPyMaxString);
        break;
    }
    case 3: {
        auto path = res.module_path(pid, in.take(1) & 1 ? w.modules[0] : pick(in, w), pick(in, w));
        require(!path || path->size() <= kPyMaxModulePath + 8);
        break;
    }
    case 4: res.attr(pid, pick(in, w), in.take(1) & 1 ? "_modules" : "name"); break;
    case 5: {
        auto s = res.str(pid, pick(in, w));
        require(!s || s->size() <= 4 * kPyMaxString);
        break;
    }
    case 6: res.type(pid, pick(in, w)); break;
    case 7: res.begin_batch(); break;
    default: res.values_index(pid, pick(in, w), "name"); break;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Input in{data, size};
    World w;
    w.types();
    w.tree(in);
    w.code_objects(in);
    PyCacheBudget budget(kTotal);
    {
        LivePyResolver res("/nonexistent", kPerProcess, budget);
        for (uint32_t pid : {1u, 2u}) res.adopt(pid, w.discovery(), std::make_unique<ImageMemory>(w.img.bytes));
        require(res.object_layout_error(1).empty());
        // Before any mutation, the tree is named as built.
        if (w.modules.size() > 2) require(res.module_path(1, w.modules[0], w.modules[1]).has_value());
        for (int ops = 0; !in.empty() && ops < 4096; ++ops) {
            drive(in, w, res);
            check(res, budget);
        }
        res.forget(1);
        res.forget(2);
        require(budget.used() == 0);
    }
    return 0;
}
