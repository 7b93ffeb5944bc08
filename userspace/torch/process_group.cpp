// SPDX-License-Identifier: Apache-2.0
#include "process_group.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "elf_symbols.hpp"
#include "x86_decode.hpp"

namespace commdbg::torch {
namespace {

// The Itanium C++ ABI: a single-inheritance class's typeinfo is a
// __si_class_type_info whose base typeinfo pointer follows its vtable
// pointer and name.
constexpr uint64_t kSiBaseAt = 16;
constexpr std::string_view kSiTypeInfo = "_ZTVN10__cxxabiv120__si_class_type_infoE";
constexpr int kMaxBases = 4;
constexpr size_t kCtorBytes = 96;

// `mov %esi,D(%rdi)` / `mov %edx,D(%rdi)` (89 /r without REX, ModRM mod 01
// or 10, rm %rdi): where a constructor stores its first and second int.
std::optional<uint32_t> store_of(const std::vector<uint8_t>& c, uint8_t reg) {
    for (size_t i = 0; i + 2 < c.size(); ++i) {
        if (c[i] != 0x89 || (i > 0 && (c[i - 1] & 0xf0) == 0x40)) continue;
        const uint8_t m = c[i + 1];
        if ((m & 7) != 7 || ((m >> 3) & 7) != reg) continue;
        if ((m >> 6) == 1) return c[i + 2] < 0x80 ? std::optional<uint32_t>(c[i + 2]) : std::nullopt;
        if ((m >> 6) == 2 && i + 5 < c.size()) {
            const auto d = static_cast<uint32_t>(arch::rel32_at(c, i + 2));
            return d < 0x1000 ? std::optional<uint32_t>(d) : std::nullopt;
        }
    }
    return std::nullopt;
}

constexpr std::string_view kReduceOpVtable = "_ZTVN4c10d8ReduceOpE";
constexpr std::string_view kGlooBroadcast =
    "_ZN4c10d16ProcessGroupGloo9broadcastERSt6vectorIN2at6TensorESaIS3_EERKNS_16BroadcastOptionsE";
constexpr std::string_view kGlooReduce =
    "_ZN4c10d16ProcessGroupGloo6reduceERSt6vectorIN2at6TensorESaIS3_EERKNS_13ReduceOptionsE";
constexpr std::string_view kGlooGather =
    "_ZN4c10d16ProcessGroupGloo6gatherERSt6vectorIS1_IN2at6TensorESaIS3_EESaIS5_EERS5_RKNS_13GatherOptionsE";
constexpr std::string_view kGlooScatter =
    "_ZN4c10d16ProcessGroupGloo7scatterERSt6vectorIN2at6TensorESaIS3_EERS1_IS5_SaIS5_EERKNS_14ScatterOptionsE";
constexpr size_t kPrologueBytes = 256;
constexpr uint32_t kRelative = 8;  // R_X86_64_RELATIVE

using arch::bytes_at;
using arch::rel32_at;
using arch::skip_endbr64;

// ReduceOp's complete-object destructor, the only form taken: [endbr64]
// `mov d32(%rip),%rax` (its vtable, from the GOT); `add $S,%rdi`;
// `add $0x10,%rax`; `mov %rax,-S(%rdi)` (the vtable pointer stored);
// `jmp`/`call rel32` (the member at +S destroyed).  S and the callee.
std::optional<std::pair<uint32_t, uint64_t>> reduce_op_dtor(const std::vector<uint8_t>& c, uint64_t vaddr) {
    const size_t i = skip_endbr64(c);
    if (!bytes_at(c, i, {0x48, 0x8b, 0x05, -1, -1, -1, -1, 0x48, 0x83, 0xc7, -1, 0x48, 0x83, 0xc0, 0x10, 0x48, 0x89,
                         0x47, -1}))
        return std::nullopt;
    const uint8_t s = c[i + 10];
    if (s == 0 || s >= 0x80 || static_cast<uint8_t>(-s) != c[i + 18]) return std::nullopt;
    const size_t call = i + 19;
    if (!bytes_at(c, call, {-1, -1, -1, -1, -1}) || (c[call] != 0xe9 && c[call] != 0xe8)) return std::nullopt;
    return std::make_pair(uint32_t{s}, vaddr + call + 5 + static_cast<int64_t>(rel32_at(c, call + 1)));
}

// `lock subl|subq $1,8(%rax)` at `at`: the count's width (4 or 8).
std::optional<uint32_t> locked_decrement_width(const std::vector<uint8_t>& c, size_t at) {
    if (bytes_at(c, at, {0xf0, 0x83, 0x68, 0x08, 0x01})) return 4;
    if (bytes_at(c, at, {0xf0, 0x48, 0x83, 0x68, 0x08, 0x01})) return 8;
    return std::nullopt;
}

// An intrusive_ptr's release: [endbr64] `mov (%rdi),%rax`; `test %rax,%rax`;
// `je rel8`; `lock subl|subq $1,8(%rax)`.  The count's width (4 or 8).
std::optional<uint32_t> refcount_width(const std::vector<uint8_t>& c) {
    const size_t i = skip_endbr64(c);
    if (!bytes_at(c, i, {0x48, 0x8b, 0x07, 0x48, 0x85, 0xc0, 0x74, -1})) return std::nullopt;
    return locked_decrement_width(c, i + 8);
}

// ReduceOp's destructor with the release inlined (libtorch_python's copy):
// [endbr64] `mov d32(%rip),%rax`; `add $0x10,%rax`; `mov %rax,(%rdi)`;
// `mov S(%rdi),%rax`; `test %rax,%rax`; `je rel8`; `lock sub $1,8(%rax)`.
// S and the count's width.
std::optional<std::pair<uint32_t, uint32_t>> reduce_op_dtor_inlined(const std::vector<uint8_t>& c) {
    const size_t i = skip_endbr64(c);
    if (!bytes_at(c, i, {0x48, 0x8b, 0x05, -1, -1, -1, -1, 0x48, 0x83, 0xc0, 0x10, 0x48, 0x89, 0x07, 0x48, 0x8b, 0x47,
                         -1, 0x48, 0x85, 0xc0, 0x74, -1}))
        return std::nullopt;
    const uint8_t s = c[i + 17];
    auto width = locked_decrement_width(c, i + 23);
    if (s == 0 || s >= 0x80 || !width) return std::nullopt;
    return std::make_pair(uint32_t{s}, *width);
}

// N4c10d16ProcessGroupGlooE -> c10d::ProcessGroupGloo
std::string demangle_nested(std::string_view m) {
    std::string out;
    m = m.substr(1, m.size() - 2);
    while (!m.empty()) {
        size_t n = 0, i = 0;
        while (i < m.size() && m[i] >= '0' && m[i] <= '9') n = n * 10 + size_t(m[i++] - '0');
        if (i == 0 || i + n > m.size()) return std::string(m);
        out += (out.empty() ? "" : "::") + std::string(m.substr(i, n));
        m.remove_prefix(i + n);
    }
    return out;
}

// The symbols asked for, read in as few passes over the file as the chain needs.
class Lookup {
public:
    explicit Lookup(std::string path) : path_(std::move(path)) {}
    Result<std::optional<uint64_t>> find(const std::string& name, const std::set<std::string, std::less<>>& also) {
        using R = Result<std::optional<uint64_t>>;
        if (!asked_.count(name)) {
            std::set<std::string, std::less<>> want = also;
            want.insert(name);
            auto d = host::read_elf_data(path_, want);
            if (!d) return R::fail(d.error());
            for (const auto& w : want) asked_.insert(w);
            for (auto& [k, v] : d->symbols) found_[k] = v;
            file_ = std::move(*d);
        }
        auto it = found_.find(name);
        return it == found_.end() ? std::optional<uint64_t>() : std::optional<uint64_t>(it->second);
    }
    // The file's headers, as the last pass read them.
    const host::ElfData& file() const { return file_; }
    Result<std::vector<uint8_t>> code(uint64_t vaddr, const std::string& name, size_t bytes = kCtorBytes) {
        auto c = host::read_code_at(path_, file_, vaddr, bytes);
        if (!c) return Result<std::vector<uint8_t>>::fail(c.error() + " (" + name + ")");
        return c;
    }

private:
    std::string path_;
    std::set<std::string, std::less<>> asked_;
    std::map<std::string, uint64_t, std::less<>> found_;
    host::ElfData file_;
};

// Every name the chain of one class may need at its first two levels, asked
// for in the first pass.
std::set<std::string, std::less<>> first_pass() {
    std::set<std::string, std::less<>> s;
    for (std::string_view c : kGroupClasses)
        for (std::string_view base : {c, std::string_view("N4c10d7BackendE")}) {
            std::string b(base);
            s.insert("_ZTV" + b), s.insert("_ZTI" + b), s.insert("_Z" + b.substr(0, b.size() - 1) + "C2Eii");
        }
    s.insert(std::string(kReduceOpVtable));
    for (std::string_view m : {kGlooBroadcast, kGlooReduce, kGlooGather, kGlooScatter}) s.insert(std::string(m));
    return s;
}

// ReduceOpLayout (process_group.hpp): an error only when the file cannot be
// read; `why` when its code has another shape.
Result<std::optional<ReduceOpLayout>> derive_reduce_op(Lookup& lk, const std::string& path,
                                                       const std::set<std::string, std::less<>>& also,
                                                       std::string& why) {
    using R = Result<std::optional<ReduceOpLayout>>;
    auto vt = lk.find(std::string(kReduceOpVtable), also);
    if (!vt) return R::fail(vt.error());
    if (!*vt) {
        why = path + " has no vtable for c10d::ReduceOp";
        return std::optional<ReduceOpLayout>();
    }
    const uint64_t slot = **vt + kVtableAddressPoint;  // its first virtual function: the destructor
    auto rel = host::read_relocations(path, {slot});
    if (!rel) return R::fail(rel.error());
    auto d1 = rel->find(slot);
    if (d1 == rel->end() || d1->second.type != kRelative || d1->second.addend <= 0) {
        why = "c10d::ReduceOp's vtable does not point to its destructor in " + path;
        return std::optional<ReduceOpLayout>();
    }
    const auto dtor_at = static_cast<uint64_t>(d1->second.addend);
    auto code = lk.code(dtor_at, "c10d::ReduceOp::~ReduceOp()");
    if (!code) return R::fail(code.error());
    // S: where supplement_ is; the width of the counts of what it points to.
    std::optional<std::pair<uint32_t, uint32_t>> member = reduce_op_dtor_inlined(*code);
    if (auto dtor = member ? std::nullopt : reduce_op_dtor(*code, dtor_at)) {
        auto release = lk.code(dtor->second, "the destructor of c10d::ReduceOp::supplement_");
        auto width = release ? refcount_width(*release) : std::nullopt;
        if (width) member.emplace(dtor->first, *width);
    }
    if (!member) {
        why = "c10d::ReduceOp's destructor has another shape in " + path;
        return std::optional<ReduceOpLayout>();
    }
    const uint32_t op_at = 8 + 2 * member->second;
    if (((op_at + 1 + 7) & ~7u) != member->first) {
        why = "c10d::ReduceOp's member after op_ is not where its layout puts it in " + path;
        return std::optional<ReduceOpLayout>();
    }
    return std::optional<ReduceOpLayout>(ReduceOpLayout{slot, op_at, member->first + 8});
}

// Where ProcessGroupGloo's `method` finds opts.rootRank, opts arriving in
// register `opts` (broadcast, reduce: `(std::vector<at::Tensor>&, const
// XOptions&)`, returning intrusive_ptr<Work> in memory, so `this` in %rsi
// and opts in %rcx; gather, scatter take two vectors: opts in %r8): its
// first call is `assertRootRank(..., opts.rootRank, size_)`, whose second
// argument is loaded from opts and whose third from `this` at size_
// (`size_at`, from the constructor).  nullopt when its entry has another shape.
Result<std::optional<uint32_t>> derive_root_at(Lookup& lk, std::string_view method, int opts, uint32_t size_at,
                                               const std::set<std::string, std::less<>>& also) {
    using R = Result<std::optional<uint32_t>>;
    auto at = lk.find(std::string(method), also);
    if (!at) return R::fail(at.error());
    if (!*at) return std::optional<uint32_t>();
    auto code = lk.code(**at, std::string(method), kPrologueBytes);
    if (!code) return R::fail(code.error());
    auto regs = arch::entry_values_at_first_call(*code);
    if (!regs) return std::optional<uint32_t>();
    const arch::EntryValue root = (*regs)[arch::kRsi], size = (*regs)[arch::kRdx];
    if (root.from != opts || !root.loaded || root.disp < 0 || root.disp > 0xff ||
        size != arch::EntryValue{arch::kRsi, true, size_at})
        return std::optional<uint32_t>();
    return std::optional<uint32_t>(static_cast<uint32_t>(root.disp));
}

// RootLayout (process_group.hpp), from ProcessGroupGloo's own code; a
// ReduceOptions' root must lie just past the ReduceOp that opens it.
Result<RootLayout> derive_roots(Lookup& lk, const GroupClasses& g, const std::set<std::string, std::less<>>& also) {
    using R = Result<RootLayout>;
    RootLayout out;
    auto gloo = std::find_if(g.classes.begin(), g.classes.end(),
                             [](const GroupClass& c) { return c.name == "c10d::ProcessGroupGloo"; });
    if (gloo == g.classes.end() || !gloo->size) {
        out.why_not = "no c10d::ProcessGroupGloo with a known size_ to read its checks of a root";
        return out;
    }
    std::optional<uint32_t> at[4];
    const std::pair<std::string_view, int> methods[4] = {
        {kGlooBroadcast, arch::kRcx}, {kGlooReduce, arch::kRcx}, {kGlooGather, arch::kR8}, {kGlooScatter, arch::kR8}};
    for (int i = 0; i < 4; ++i) {
        auto a = derive_root_at(lk, methods[i].first, methods[i].second, *gloo->size, also);
        if (!a) return R::fail(a.error());
        at[i] = *a;
    }
    // One offset for the three options that open with rootRank's struct
    // (the kernel cannot tell them apart), only where all three agree.
    if (at[0] && at[0] == at[2] && at[0] == at[3]) out.broadcast = at[0];
    if (at[1] && g.reduce_op && *at[1] == g.reduce_op->size) out.reduce = at[1];
    if (!out.broadcast || !out.reduce)
        out.why_not = !out.broadcast ? "ProcessGroupGloo's broadcast, gather and scatter do not all check "
                                       "opts.rootRank against size_ first, at one offset"
                                     : "ProcessGroupGloo::reduce does not check opts.rootRank against size_ first, "
                                       "just past its ReduceOp";
    return out;
}

Result<std::optional<GroupClass>> derive(Lookup& lk, const std::string& path, std::string_view mangled,
                                         const std::set<std::string, std::less<>>& also) {
    using R = Result<std::optional<GroupClass>>;
    GroupClass g;
    g.name = demangle_nested(mangled);
    auto vt = lk.find("_ZTV" + std::string(mangled), also);
    if (!vt) return R::fail(vt.error());
    if (!*vt) return std::optional<GroupClass>();
    g.vtable = **vt + kVtableAddressPoint;
    std::string cls(mangled);
    for (int depth = 0; depth < kMaxBases; ++depth) {
        const std::string ctor = "_Z" + cls.substr(0, cls.size() - 1) + "C2Eii";
        auto at = lk.find(ctor, also);
        if (!at) return R::fail(at.error());
        if (*at) {
            auto code = lk.code(**at, ctor);
            if (!code) return R::fail(code.error());
            auto rank = store_of(*code, 6), size = store_of(*code, 2);
            if (rank && size && *rank != *size) g.rank = rank, g.size = size;
            else g.why_no_rank = demangle_nested(cls) + "(int, int)'s code has another shape";
            return std::optional<GroupClass>(std::move(g));
        }
        auto ti = lk.find("_ZTI" + cls, also);
        if (!ti) return R::fail(ti.error());
        if (!*ti) {
            g.why_no_rank = path + " has no typeinfo for " + demangle_nested(cls);
            return std::optional<GroupClass>(std::move(g));
        }
        auto rel = host::read_relocations(path, {**ti, **ti + kSiBaseAt});
        if (!rel) return R::fail(rel.error());
        auto kind = rel->find(**ti), base = rel->find(**ti + kSiBaseAt);
        if (kind == rel->end() || kind->second.symbol != kSiTypeInfo || base == rel->end() ||
            !base->second.symbol.starts_with("_ZTIN") || base->second.addend != 0) {
            g.why_no_rank = demangle_nested(cls) + " is not a class with one named base in " + path;
            return std::optional<GroupClass>(std::move(g));
        }
        cls = base->second.symbol.substr(4);
    }
    g.why_no_rank = "no (int rank, int size) constructor above " + g.name;
    return std::optional<GroupClass>(std::move(g));
}

}  // namespace

std::optional<std::string_view> c10d_reduce_op_name(uint32_t op) {
    static constexpr std::string_view kNames[] = {"sum", "avg", "product", "min", "max",
                                                  "band", "bor", "bxor", "premul_sum"};
    if (op >= std::size(kNames)) return std::nullopt;
    return kNames[op];
}

Result<GroupClasses> derive_group_classes(const std::string& path) {
    using R = Result<GroupClasses>;
    Lookup lk(path);
    const auto also = first_pass();
    GroupClasses out;
    for (std::string_view c : kGroupClasses) {
        auto g = derive(lk, path, c, also);
        if (!g) return R::fail(g.error());
        if (*g) out.classes.push_back(std::move(**g));
    }
    auto op = derive_reduce_op(lk, path, also, out.why_no_reduce_op);
    if (!op) return R::fail(op.error());
    out.reduce_op = *op;
    auto roots = derive_roots(lk, out, also);
    if (!roots) return R::fail(roots.error());
    out.roots = std::move(*roots);
    out.file = lk.file();
    return out;
}

Result<ReduceOpFacts> derive_reduce_op_facts(const std::string& path) {
    using R = Result<ReduceOpFacts>;
    Lookup lk(path);
    ReduceOpFacts out;
    auto op = derive_reduce_op(lk, path, {}, out.why_no_reduce_op);
    if (!op) return R::fail(op.error());
    out.reduce_op = *op;
    out.file = lk.file();
    return out;
}

}  // namespace commdbg::torch
