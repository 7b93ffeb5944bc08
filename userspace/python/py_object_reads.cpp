// SPDX-License-Identifier: Apache-2.0
// LivePyResolver::Process's readers of objects: headers, types, strs,
// tuples, dicts and instance attributes, each read bounded and checked.
#include <algorithm>
#include <array>
#include <cstdlib>

#include "py_process.hpp"

namespace commdbg::python {
namespace {

using namespace pyobj;

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

}  // namespace

using namespace pyobj;

// ---- objects: headers, types, strings, tuples ------------------------------

bool LivePyResolver::Process::header(uint64_t obj, uint64_t& ob_type) {
    uint64_t h[2] = {0, 0};
    if (!mem_->read(obj, h, sizeof h) || !plausible_refcnt(h[0]) || !arch::is_user_address(h[1])) return false;
    ob_type = h[1];
    return true;
}

bool LivePyResolver::Process::read_type(uint64_t ptr, Type& t) {
    std::array<uint8_t, kTypeRead> b{};
    if (!mem_->read(ptr, b.data(), b.size())) return false;
    const PyLayout& l = d_.layout;
    t.meta = field<uint64_t>(b.data(), l.ob_type);
    t.flags = field<uint64_t>(b.data(), l.tp_flags);
    if (!plausible_refcnt(field<uint64_t>(b.data(), 0)) || !(t.flags & kFlagReady)) return false;
    // A type's type is `type` or a metaclass (a subclass of it).
    if (t.meta != type_type_) {
        uint64_t meta_flags = 0;
        if (!mem_->get(t.meta + l.tp_flags, meta_flags) || !(meta_flags & kFlagType)) return false;
    }
    t.basicsize = field<int64_t>(b.data(), kTpBasicsize), t.itemsize = field<int64_t>(b.data(), kTpItemsize);
    t.dictoffset = field<int64_t>(b.data(), kTpDictoffset);
    t.dict = field<uint64_t>(b.data(), kTpDict), t.mro = field<uint64_t>(b.data(), kTpMro);
    t.facts = PyTypeFacts{};
    t.facts.heap = (t.flags & kFlagHeapType) != 0;
    if (t.facts.heap) {
        if (!mem_->get(ptr + o_.ht_qualname, t.name_ptr)) return false;
        auto name = str(t.name_ptr);
        if (!name) return false;
        t.facts.name = *name;
    } else if (!mem_->c_string(field<uint64_t>(b.data(), l.tp_name), t.facts.name, 128)) {
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
    if (!arch::is_user_address(ptr) || type_type_ == 0) return nullptr;
    if (auto it = types_.find(ptr); it != types_.end()) {
        Type& t = it->second;
        if (!t.facts.heap || t.checked == epoch_) return &t;
        uint64_t h[2] = {0, 0}, name = 0;
        if (mem_->read2(ptr, h, sizeof h, ptr + o_.ht_qualname, &name, sizeof name) && plausible_refcnt(h[0]) &&
            h[1] == t.meta && name == t.name_ptr) {
            t.checked = epoch_;
            return &t;
        }
        if (uint64_t w = 0; !mem_->get(ptr, w) && mem_->gone()) return &t;  // the process is gone: as for code objects
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
    if (!mem_->read(obj, b.data(), got)) {
        got = l.unicode_state + 4;
        if (!mem_->read(obj, b.data(), got)) return std::nullopt;
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
    } else if (!text.empty() && !mem_->read(obj + data, text.data(), text.size())) {
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
    if (!mem_->read(tuple, h, sizeof h) || !plausible_refcnt(h[0]) || !has_flag(h[1], kFlagTuple)) return std::nullopt;
    if (static_cast<int64_t>(h[2]) < 0) return std::nullopt;
    std::vector<uint64_t> items(std::min<size_t>(h[2], max));
    if (!items.empty() && !mem_->read(tuple + d_.layout.tuple_items, items.data(), items.size() * 8)) return std::nullopt;
    return items;
}

// ---- dicts ----------------------------------------------------------------

// Calls fn(key, value) for the live entries of a PyDictKeysObject; `values`
// is the split table's value array (0: values in the entries).
bool LivePyResolver::Process::keys_items(uint64_t keys, uint64_t values, const ItemFn& fn) {
    uint8_t h[40];
    if (!mem_->read(keys, h, sizeof h)) return false;
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
    if (!mem_->read(entries, e.data(), e.size())) return false;
    if (values != 0 && !mem_->read(values, v.data(), v.size() * 8)) return false;
    for (size_t i = 0; i < n; ++i) {
        uint64_t key = field<uint64_t>(e.data(), static_cast<uint32_t>(i * esize + key_at));
        uint64_t value = values != 0 ? v[i] : field<uint64_t>(e.data(), static_cast<uint32_t>(i * esize + value_at));
        if (key != 0 && value != 0 && !fn(key, value)) break;
    }
    return true;
}

bool LivePyResolver::Process::dict_items(uint64_t dict, const ItemFn& fn) {
    uint64_t h[6] = {};  // refcnt, type, used, version, keys, values
    if (!mem_->read(dict, h, sizeof h) || !plausible_refcnt(h[0]) || !has_flag(h[1], kFlagDict)) return false;
    if (h[2] == 0) return true;  // ma_used: empty (its keys may be the shared empty table, log2 size 0)
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
        if (!mem_->get(obj + kObSize, n)) return 0;
        int64_t size = (t.basicsize + std::abs(n) * t.itemsize + 7) & ~int64_t{7};
        off += size;
    }
    uint64_t dict = 0;
    if (off <= 0 || !mem_->get(obj + static_cast<uint64_t>(off), dict)) return 0;
    return dict;
}

// 3.11: the slot of `name` in the values array of the type's instances (its
// shared keys, ht_cached_keys, in insertion order).
std::optional<uint32_t> LivePyResolver::Process::values_index(uint64_t type_ptr, std::string_view name) {
    const Type* t = type(type_ptr);
    uint64_t keys = 0;
    uint8_t h[32];
    if (d_.layout.minor != 11 || t == nullptr || !(t->flags & kFlagManagedDict) ||
        !mem_->get(type_ptr + o_.ht_cached_keys, keys) || keys == 0 || !mem_->read(keys, h, sizeof h))
        return std::nullopt;
    const uint8_t log2 = h[8], log2_index = h[9], kind = h[10];
    const uint64_t n = std::min<uint64_t>(field<uint64_t>(h, 24), kMaxDictEntries);
    if (log2 < 3 || log2 > 26 || log2_index > log2 + 3 || kind != 2 || n > (1ull << log2)) return std::nullopt;
    std::vector<uint64_t> e(2 * n);  // split keys: (key, NULL) entries
    if (n == 0 || !mem_->read(keys + 32 + (1ull << log2_index), e.data(), e.size() * 8)) return std::nullopt;
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
    if (!mem_->get(ob_type + o_.ht_cached_keys, keys)) return 0;
    if (minor == 11) {  // values at obj - 4 words, or (materialized) the dict at obj - 3
        if (!mem_->get(obj + kManagedValues311, word)) return 0;
        if (word != 0) return find_in(keys, word, 0, name);
    } else if (minor == 12) {  // one word: values tagged with bit 0 (stored as values - 1), or the dict
        if (!mem_->get(obj + kManagedDict, word)) return 0;
        if (word & 1) return find_in(keys, word + 1, 0, name);
        dict = word;
    } else if ((t.flags & kFlagInlineValues) && t.basicsize == kObjectHead) {  // 3.13: after the head, while valid
        uint8_t vh[4] = {};
        uint64_t values = obj + kObjectHead;
        if (!mem_->read(values, vh, sizeof vh)) return 0;
        if (vh[3] != 0) return find_in(keys, values + o_.values_items, 0, name);
    }
    if (dict == 0 && !mem_->get(obj + kManagedDict, dict)) return 0;
    return dict != 0 ? find_in(0, 0, dict, name) : 0;
}

// ---- slots and ints ----------------------------------------------------------

// The value of `name` when the first class of obj's MRO that defines it
// defines it as a __slots__ member: an object member (T_OBJECT_EX) inside the
// instance, named `name` in its PyMemberDef too.
uint64_t LivePyResolver::Process::slot(uint64_t obj, std::string_view name) {
    uint64_t ob_type = 0;
    if (!layout_error_.empty() || !header(obj, ob_type)) return 0;
    const Type* tp = type(ob_type);
    if (tp == nullptr) return 0;
    const int64_t basicsize = tp->basicsize;
    auto mro = tuple_items(tp->mro, kMaxTupleItems);
    for (uint64_t base : mro.value_or(std::vector<uint64_t>{})) {
        const Type* b = type(base);
        if (b == nullptr) return 0;
        if (uint64_t descr = find_in(0, 0, b->dict, name)) return member_value(obj, descr, name, basicsize);
    }
    return 0;
}

uint64_t LivePyResolver::Process::member_value(uint64_t obj, uint64_t descr, std::string_view name, int64_t basicsize) {
    uint64_t d[kDescrMember / 8 + 1] = {};
    if (!mem_->read(descr, d, sizeof d) || !plausible_refcnt(d[0])) return 0;
    const Type* dt = type(d[1]);
    if (dt == nullptr || dt->facts.heap || dt->facts.name != "member_descriptor") return 0;
    uint8_t m[kMemberOffset + 8];
    std::string member_name;
    if (!mem_->read(d[kDescrMember / 8], m, sizeof m) || !mem_->c_string(field<uint64_t>(m, 0), member_name, 256))
        return 0;
    const int64_t offset = field<int64_t>(m, kMemberOffset);
    if (member_name != name || field<int32_t>(m, kMemberType) != kTObjectEx || offset < kObjectHead ||
        offset + 8 > basicsize)
        return 0;
    uint64_t value = 0;
    return mem_->get(obj + static_cast<uint64_t>(offset), value) ? value : 0;
}

std::optional<int64_t> LivePyResolver::Process::small_int(uint64_t obj) { return one_digit(obj, "int"); }

// True and False are ints too (PyLongObject, one digit or none).
std::optional<bool> LivePyResolver::Process::truth(uint64_t obj) {
    auto v = one_digit(obj, "bool");
    return v ? std::optional<bool>(*v != 0) : std::nullopt;
}

// The value of an object of built-in int type `name` (int, bool) that fits one digit.
std::optional<int64_t> LivePyResolver::Process::one_digit(uint64_t obj, std::string_view name) {
    uint64_t h[4] = {};  // refcnt, type, ob_size / lv_tag, digit
    if (!mem_->read(obj, h, sizeof h) || !plausible_refcnt(h[0])) return std::nullopt;
    const Type* t = type(h[1]);
    if (t == nullptr || t->facts.heap || t->facts.name != name || !(t->flags & kFlagLong)) return std::nullopt;
    const auto digit = static_cast<int64_t>(static_cast<uint32_t>(h[3]));
    if (d_.layout.minor <= 11) {
        const auto size = static_cast<int64_t>(h[2]);
        if (size < -1 || size > 1) return std::nullopt;
        return size * digit;
    }
    if (h[2] >= (2u << 3)) return std::nullopt;  // more than one digit
    return (1 - static_cast<int64_t>(h[2] & 3)) * digit;
}

std::optional<std::vector<uint64_t>> LivePyResolver::Process::list_items(uint64_t list, size_t max) {
    uint64_t h[4] = {};  // refcnt, type, ob_size, ob_item
    if (!layout_error_.empty() || !mem_->read(list, h, sizeof h) || !plausible_refcnt(h[0]) ||
        !has_flag(h[1], kFlagList) || static_cast<int64_t>(h[2]) < 0)
        return std::nullopt;
    std::vector<uint64_t> items(std::min<size_t>(h[2], max));
    if (!items.empty() && !mem_->read(h[kListItems / 8], items.data(), items.size() * 8)) return std::nullopt;
    return items;
}

uint64_t LivePyResolver::Process::method_self(uint64_t method) {
    uint64_t h[kMethodSelf / 8 + 1] = {};
    if (!layout_error_.empty() || !mem_->read(method, h, sizeof h) || !plausible_refcnt(h[0])) return 0;
    const Type* t = type(h[1]);
    if (t == nullptr || t->facts.heap || t->facts.name != "method") return 0;
    return h[kMethodSelf / 8];
}

}  // namespace commdbg::python
