// SPDX-License-Identifier: Apache-2.0
#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "x86_decode.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace commdbg::host {
namespace {

// Owns the fd and the libelf handle so every early return releases both.
class ElfHandle {
public:
    ~ElfHandle() {
        if (elf_) elf_end(elf_);
        if (fd_ >= 0) ::close(fd_);
    }
    int fd_ = -1;
    Elf* elf_ = nullptr;
};

// A symbol as found in one table; the name points into the mmapped string table.
struct Candidate {
    std::string_view name;
    uint64_t vaddr;
    uint64_t size;
    bool weak, local, dynamic, ifunc;
};

std::string libelf_error() {
    const char* msg = elf_errmsg(-1);
    return msg ? msg : "unknown libelf error";
}

bool libelf_ready() {
    static std::once_flag once;
    static bool ok = false;
    std::call_once(once, [] { ok = elf_version(EV_CURRENT) != EV_NONE; });
    return ok;
}

std::string_view strip_version(std::string_view name) {
    // .symtab keeps "foo@@VER" / "foo@VER" for symbols defined with .symver.
    auto at = name.find('@');
    return at == std::string_view::npos ? name : name.substr(0, at);
}

int visibility(const Candidate& c) { return c.local ? 0 : c.weak ? 1 : 2; }

bool is_defined_function(const GElf_Sym& sym) {
    int type = GELF_ST_TYPE(sym.st_info);
    if (type != STT_FUNC && type != STT_GNU_IFUNC) return false;
    if (sym.st_value == 0) return false;
    return sym.st_shndx != SHN_UNDEF && sym.st_shndx != SHN_ABS && sym.st_shndx != SHN_COMMON;
}

// Calls take(sym, name, dynamic) for the named symbols of one table that
// want(sym) asks for, names without their @VERSION.
template <typename Want, typename Take>
Result<bool> visit_table(const std::string& path, Elf* elf, Elf_Scn* scn, const GElf_Shdr& shdr, Want want,
                         Take take) {
    const char* table = shdr.sh_type == SHT_DYNSYM ? ".dynsym" : ".symtab";
    if (shdr.sh_entsize == 0) return Result<bool>::fail(path + ": " + table + " has entry size 0 (corrupt ELF)");
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) {
        return Result<bool>::fail(path + ": cannot read " + table + ": " + libelf_error() +
                                  " — the file is truncated or corrupt; re-copy or reinstall it");
    }
    size_t count = shdr.sh_size / shdr.sh_entsize;
    bool dynamic = shdr.sh_type == SHT_DYNSYM;
    for (size_t i = 1; i < count; ++i) {  // entry 0 is the reserved null symbol
        GElf_Sym sym;
        if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) break;
        if (!want(sym)) continue;
        const char* raw = elf_strptr(elf, shdr.sh_link, sym.st_name);
        if (raw == nullptr || *raw == '\0') continue;
        std::string_view name = strip_version(raw);
        if (!name.empty()) take(sym, name, dynamic);
    }
    return true;
}

// Visits .dynsym, then .symtab (so a name present in both is first seen
// dynamic); true when the file has either.
template <typename Want, typename Take>
Result<bool> visit_symbols(const std::string& path, Elf* elf, Want want, Take take) {
    bool have_table = false;
    for (Elf64_Word kind : {SHT_DYNSYM, SHT_SYMTAB}) {
        Elf_Scn* scn = nullptr;
        while ((scn = elf_nextscn(elf, scn)) != nullptr) {
            GElf_Shdr shdr;
            if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != kind) continue;
            have_table = true;
            if (auto r = visit_table(path, elf, scn, shdr, want, take); !r) return r;
        }
    }
    return have_table;
}

// Opens `path` for reading into `h`: its size when it is a non-empty regular
// file.
Result<uint64_t> open_file(const std::string& path, ElfHandle& h) {
    using R = Result<uint64_t>;
    h.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (h.fd_ < 0) {
        int err = errno;
        std::string why = std::strerror(err);
        if (err == ENOENT) return R::fail(path + ": no such file — check the path");
        if (err == EACCES) return R::fail(path + ": permission denied — run as root or make it readable");
        return R::fail(path + ": cannot open: " + why);
    }
    struct stat st {};
    if (fstat(h.fd_, &st) != 0) return R::fail(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return R::fail(path + ": not a regular file — pass an ELF shared library or executable");
    auto file_size = static_cast<uint64_t>(st.st_size);
    if (file_size == 0) return R::fail(path + ": not an ELF file (empty file)");
    return file_size;
}

// What the ELF header says that a reader needs.
struct Headers {
    size_t phnum = 0;   // program headers
    bool exec = false;  // ET_EXEC: linked at its final address
};

// Section headers usually sit at the very end, so a cut-short copy loses
// them first; say "truncated" rather than the misleading "stripped".  Checked
// on the raw header because libelf quietly reports 0 sections in that case.
bool section_headers_cut(const GElf_Ehdr& ehdr, uint64_t file_size) {
    uint64_t sh_entries = std::max<uint64_t>(ehdr.e_shnum, 1);  // 0 = count stored in section 0
    return ehdr.e_shoff != 0 && (ehdr.e_shoff > file_size ||
                                 (file_size - ehdr.e_shoff) / std::max<uint64_t>(ehdr.e_shentsize, 1) < sh_entries);
}

// Starts libelf on the open file and checks its headers are whole.
Result<Headers> begin_elf(const std::string& path, ElfHandle& h, uint64_t file_size) {
    using R = Result<Headers>;
    // READ_MMAP: sections are read in place from a private mapping, so a 200 MB
    // libnccl costs page faults on the symbol tables only.
    h.elf_ = elf_begin(h.fd_, ELF_C_READ_MMAP, nullptr);
    if (h.elf_ == nullptr) {
        return R::fail(path + ": not a valid ELF file (" + libelf_error() +
                       ") — it is truncated or corrupt; re-copy or reinstall it");
    }
    if (elf_kind(h.elf_) != ELF_K_ELF)
        return R::fail(path + ": not an ELF file (no ELF magic) — pass a shared library or executable");
    GElf_Ehdr ehdr;
    if (gelf_getehdr(h.elf_, &ehdr) == nullptr) return R::fail(path + ": truncated or corrupt ELF header: " + libelf_error());
    if (section_headers_cut(ehdr, file_size)) {
        return R::fail(path + ": truncated ELF (section headers end past the file's " + std::to_string(file_size) +
                       " bytes) — re-copy or reinstall it");
    }
    Headers out;
    out.exec = ehdr.e_type == ET_EXEC;
    size_t shnum = 0;
    if (elf_getshdrnum(h.elf_, &shnum) != 0 || elf_getphdrnum(h.elf_, &out.phnum) != 0) {
        return R::fail(path + ": corrupt ELF header tables: " + libelf_error() +
                       " — the file is truncated or corrupt; re-copy or reinstall it");
    }
    return out;
}

// The PT_LOAD segments, which translate a symbol's address to a file offset.
Result<std::vector<ElfSegment>> read_loads(const std::string& path, Elf* elf, size_t phnum) {
    using R = Result<std::vector<ElfSegment>>;
    std::vector<ElfSegment> loads;
    for (size_t i = 0; i < phnum; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr)
            return R::fail(path + ": cannot read program header " + std::to_string(i) + ": " + libelf_error());
        if (ph.p_type == PT_LOAD) loads.push_back({ph.p_vaddr, ph.p_memsz, ph.p_offset});
    }
    if (loads.empty()) {
        return R::fail(path + ": no loadable segments (a relocatable .o or core file?) — "
                              "pass a linked shared library or executable");
    }
    return loads;
}

// Opens `path` into `h`, checks its headers and reads its load segments:
// an ElfData without symbols yet.
Result<ElfData> open_elf(const std::string& path, ElfHandle& h) {
    using R = Result<ElfData>;
    if (!libelf_ready()) return R::fail("libelf: elf_version failed: " + libelf_error());
    auto size = open_file(path, h);
    if (!size) return R::fail(size.error());
    auto headers = begin_elf(path, h, *size);
    if (!headers) return R::fail(headers.error());
    auto loads = read_loads(path, h.elf_, headers->phnum);
    if (!loads) return R::fail(loads.error());
    ElfData out;
    out.exec = headers->exec;
    out.loads = std::move(*loads);
    return out;
}

// Every defined function of .dynsym and .symtab.
Result<std::vector<Candidate>> read_functions(const std::string& path, Elf* elf) {
    using R = Result<std::vector<Candidate>>;
    std::vector<Candidate> cands;
    auto have_table = visit_symbols(path, elf, is_defined_function,
                                    [&](const GElf_Sym& sym, std::string_view name, bool dynamic) {
        int bind = GELF_ST_BIND(sym.st_info);
        cands.push_back({name, sym.st_value, sym.st_size, bind == STB_WEAK, bind == STB_LOCAL, dynamic,
                         GELF_ST_TYPE(sym.st_info) == STT_GNU_IFUNC});
    });
    if (!have_table) return R::fail(have_table.error());
    if (!*have_table) {
        return R::fail(path + ": no symbol table (stripped?) — use an unstripped build, "
                              "or one that exports its functions in .dynsym");
    }
    return cands;
}

// One ElfSymbol per distinct (name, address), sorted by name, with its file
// offset; symbols outside every PT_LOAD are left out (nothing to probe).
std::vector<ElfSymbol> merge_candidates(std::vector<Candidate>& cands, const std::vector<ElfSegment>& loads) {
    // Same name at the same address in both tables is one symbol; aliases
    // (different names, one address) and repeated static names stay apart.
    std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
        if (a.name != b.name) return a.name < b.name;
        return a.vaddr < b.vaddr;
    });

    std::vector<ElfSymbol> functions;
    functions.reserve(cands.size());
    for (size_t i = 0; i < cands.size();) {
        Candidate c = cands[i];
        size_t j = i + 1;
        for (; j < cands.size() && cands[j].name == c.name && cands[j].vaddr == c.vaddr; ++j) {
            const Candidate& d = cands[j];
            c.dynamic |= d.dynamic;
            c.size = std::max(c.size, d.size);
            // Keep the most visible binding (global > weak > local) of the copies.
            if (visibility(d) > visibility(c)) {
                c.weak = d.weak;
                c.local = d.local;
            }
        }
        i = j;
        auto seg = std::find_if(loads.begin(), loads.end(), [&](const ElfSegment& s) {
            return c.vaddr >= s.vaddr && c.vaddr - s.vaddr < s.memsz;
        });
        if (seg == loads.end()) continue;  // not mapped at run time: nothing to probe
        functions.push_back(ElfSymbol{std::string(c.name), c.vaddr, c.size, c.vaddr - seg->vaddr + seg->offset,
                                      c.weak, c.local, c.dynamic, c.ifunc});
    }
    return functions;
}

}  // namespace

Result<ElfSymbols> ElfSymbols::open(const std::string& path) {
    using R = Result<ElfSymbols>;
    ElfHandle h;
    auto file = open_elf(path, h);
    if (!file) return R::fail(file.error());
    auto cands = read_functions(path, h.elf_);
    if (!cands) return R::fail(cands.error());
    ElfSymbols out;
    out.path_ = path;
    out.functions_ = merge_candidates(*cands, file->loads);
    return out;
}

Result<ElfData> read_elf_data(const std::string& path, const std::set<std::string, std::less<>>& names) {
    return read_elf_data(path, [&](std::string_view name) { return names.count(name) != 0; });
}

Result<ElfData> read_elf_data(const std::string& path, const std::function<bool(std::string_view)>& want) {
    using R = Result<ElfData>;
    ElfHandle h;
    auto out = open_elf(path, h);
    if (!out) return out;
    auto defined = [](const GElf_Sym& s) { return s.st_shndx != SHN_UNDEF && s.st_value != 0; };
    auto have_table = visit_symbols(path, h.elf_, defined, [&](const GElf_Sym& s, std::string_view name, bool) {
        if (!want(name)) return;
        out->symbols.emplace(std::string(name), s.st_value);
        out->sizes.emplace(std::string(name), s.st_size);
    });
    if (!have_table) return R::fail(have_table.error());
    return out;  // no symbol table: no symbols, as for a stripped executable
}

std::optional<uint64_t> load_bias(const std::vector<MapEntry>& maps, const std::string& path, const ElfData& elf) {
    const ElfSegment& first = elf.loads.front();
    uint64_t off = first.offset & ~0xfffull, va = first.vaddr & ~0xfffull;
    for (const MapEntry& e : maps) {
        if (e.path == path && e.offset == off) return elf.exec ? 0 : e.start - va;
    }
    return std::nullopt;
}

Result<std::map<uint64_t, ElfReloc>> read_relocations(const std::string& path, const std::set<uint64_t>& at) {
    using R = Result<std::map<uint64_t, ElfReloc>>;
    ElfHandle h;
    auto file = open_elf(path, h);
    if (!file) return R::fail(file.error());
    std::map<uint64_t, ElfReloc> out;
    Elf_Scn* scn = nullptr;
    while ((scn = elf_nextscn(h.elf_, scn)) != nullptr) {
        GElf_Shdr shdr;
        if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_RELA || shdr.sh_entsize == 0) continue;
        Elf_Data* data = elf_getdata(scn, nullptr);
        Elf_Scn* symscn = elf_getscn(h.elf_, shdr.sh_link);
        GElf_Shdr symhdr;
        if (data == nullptr || symscn == nullptr || gelf_getshdr(symscn, &symhdr) == nullptr)
            return R::fail(path + ": a relocation section cannot be read: " + libelf_error());
        Elf_Data* syms = elf_getdata(symscn, nullptr);
        const size_t n = shdr.sh_size / shdr.sh_entsize;
        for (size_t i = 0; i < n; ++i) {
            GElf_Rela r;
            if (gelf_getrela(data, static_cast<int>(i), &r) == nullptr) break;
            if (!at.count(r.r_offset)) continue;
            ElfReloc rel;
            rel.addend = r.r_addend;
            rel.type = static_cast<uint32_t>(GELF_R_TYPE(r.r_info));
            GElf_Sym sym;
            if (GELF_R_SYM(r.r_info) != 0 && syms != nullptr &&
                gelf_getsym(syms, static_cast<int>(GELF_R_SYM(r.r_info)), &sym) != nullptr) {
                const char* name = elf_strptr(h.elf_, symhdr.sh_link, sym.st_name);
                std::string_view nm = name ? name : "";
                rel.symbol = std::string(nm.substr(0, nm.find('@')));
            }
            out[r.r_offset] = std::move(rel);
        }
    }
    return out;
}

Result<std::vector<uint8_t>> read_function_code(const std::string& path, const ElfSymbol& sym, size_t max) {
    return CodeReader(path).read(sym, max);
}

CodeReader::~CodeReader() {
    if (fd_ >= 0) ::close(fd_);
}

Result<std::vector<uint8_t>> CodeReader::read(const ElfSymbol& sym, size_t max) {
    using R = Result<std::vector<uint8_t>>;
    if (fd_ < 0 && open_errno_ == 0) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) open_errno_ = errno;
    }
    if (fd_ < 0) return R::fail(path_ + ": cannot open: " + std::strerror(open_errno_));
    if (sym.size != 0) max = std::min<size_t>(max, sym.size);
    std::vector<uint8_t> out(max, 0);
    ssize_t got = pread(fd_, out.data(), max, static_cast<off_t>(sym.file_offset));
    if (got <= 0) return R::fail(path_ + ": cannot read " + sym.name + "'s code");
    out.resize(static_cast<size_t>(got));
    return out;
}

namespace {
const ElfSegment* segment_of(const ElfData& elf, uint64_t vaddr) {
    for (const auto& seg : elf.loads)
        if (vaddr >= seg.vaddr && vaddr < seg.vaddr + seg.memsz) return &seg;
    return nullptr;
}
}  // namespace

std::optional<uint64_t> file_offset_of(const ElfData& elf, uint64_t vaddr) {
    const ElfSegment* seg = segment_of(elf, vaddr);
    return seg ? std::optional<uint64_t>(seg->offset + (vaddr - seg->vaddr)) : std::nullopt;
}

Result<std::vector<uint8_t>> read_code_at(const std::string& path, const ElfData& elf, uint64_t vaddr, size_t n) {
    const ElfSegment* seg = segment_of(elf, vaddr);
    if (!seg)
        return Result<std::vector<uint8_t>>::fail(path + ": address " + std::to_string(vaddr) +
                                                  " is outside every segment");
    ElfSymbol at{"", vaddr, std::min<uint64_t>(n, seg->vaddr + seg->memsz - vaddr), seg->offset + (vaddr - seg->vaddr)};
    return read_function_code(path, at, n);
}

std::vector<const ElfSymbol*> ElfSymbols::find_all(std::string_view name) const {
    auto lo = std::lower_bound(functions_.begin(), functions_.end(), name,
                               [](const ElfSymbol& s, std::string_view n) { return s.name < n; });
    std::vector<const ElfSymbol*> out;
    for (auto it = lo; it != functions_.end() && it->name == name; ++it) out.push_back(&*it);
    return out;
}

const ElfSymbol* ElfSymbols::find(std::string_view name) const {
    auto lo = std::lower_bound(functions_.begin(), functions_.end(), name,
                               [](const ElfSymbol& s, std::string_view n) { return s.name < n; });
    const ElfSymbol* best = nullptr;
    for (auto it = lo; it != functions_.end() && it->name == name; ++it) {
        if (best == nullptr || (best->local && !it->local)) best = &*it;
    }
    return best;
}

bool is_plt_stub_of(const std::string& path, const ElfData& elf, uint64_t addr, std::string_view symbol) {
    auto stub = read_code_at(path, elf, addr, 16);
    auto slot = stub ? arch::plt_slot(*stub, addr) : std::nullopt;
    if (!slot) return false;
    auto rel = read_relocations(path, {*slot});
    return rel && rel->count(*slot) && rel->at(*slot).symbol == symbol;
}

}  // namespace commdbg::host
