// SPDX-License-Identifier: Apache-2.0
#include "process_group.hpp"

#include <map>
#include <set>

#include "elf_symbols.hpp"

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
            uint32_t d = c[i + 2] | c[i + 3] << 8 | c[i + 4] << 16 | uint32_t(c[i + 5]) << 24;
            return d < 0x1000 ? std::optional<uint32_t>(d) : std::nullopt;
        }
    }
    return std::nullopt;
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
    Result<std::vector<uint8_t>> code(uint64_t vaddr, const std::string& name) {
        for (const auto& s : file_.loads)
            if (vaddr >= s.vaddr && vaddr < s.vaddr + s.memsz) {
                host::ElfSymbol sym;
                sym.name = name, sym.vaddr = vaddr, sym.file_offset = vaddr - s.vaddr + s.offset;
                return host::read_function_code(path_, sym, kCtorBytes);
            }
        return Result<std::vector<uint8_t>>::fail(path_ + ": " + name + " is outside every segment");
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
    return s;
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
    out.file = lk.file();
    return out;
}

}  // namespace commdbg::torch
