// SPDX-License-Identifier: Apache-2.0
// What commdbg reads of an ELF file, with libelf: its function symbols with
// the file offsets a uprobe attaches at, a function's code, and for a reader
// of a process's data (python/) its load segments and data symbols.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "result.hpp"

namespace commdbg::host {

struct ElfSymbol {
    std::string name;          // mangled, without any @VERSION / @@VERSION suffix
    uint64_t vaddr = 0;        // st_value: link-time virtual address
    uint64_t size = 0;         // st_size (may be 0 for hand-written asm)
    uint64_t file_offset = 0;  // vaddr translated through its PT_LOAD; what uprobes take
    bool weak = false;         // STB_WEAK
    bool local = false;        // STB_LOCAL: a static function, name may repeat in the file
    bool dynamic = false;      // present in .dynsym, so it survives stripping
    bool ifunc = false;        // STT_GNU_IFUNC: vaddr is the resolver, not the implementation
};

// A PT_LOAD program header.
struct ElfSegment {
    uint64_t vaddr = 0, memsz = 0, offset = 0;
};

class ElfSymbols {
public:
    // Reads .dynsym and .symtab of `path`.  The file is mmapped, not copied, and
    // released before returning; fails when `path` is missing, not ELF, truncated,
    // or has neither symbol table.
    static Result<ElfSymbols> open(const std::string& path);

    const std::string& path() const { return path_; }
    // Sorted by name.  Aliases (ncclX / pncclX) are separate entries with equal offsets.
    const std::vector<ElfSymbol>& functions() const { return functions_; }
    // Exact mangled name.  When a name repeats (static functions of different
    // translation units) a global or weak definition wins over a local one.
    const ElfSymbol* find(std::string_view name) const;
    // Every entry named `name` (more than one only for repeated local symbols).
    std::vector<const ElfSymbol*> find_all(std::string_view name) const;

private:
    std::string path_;
    std::vector<ElfSymbol> functions_;
};

// Up to `max` bytes of a function's code (its size when smaller), from the
// file: a process's copy may hold a uprobe's int3.
Result<std::vector<uint8_t>> read_function_code(const std::string& path, const ElfSymbol& sym, size_t max);

// The same for many functions of one file, through one descriptor (opened
// at the first read): a plan reads the entry of every symbol it probes.
class CodeReader {
public:
    explicit CodeReader(std::string path) : path_(std::move(path)) {}
    ~CodeReader();
    CodeReader(const CodeReader&) = delete;
    CodeReader& operator=(const CodeReader&) = delete;
    Result<std::vector<uint8_t>> read(const ElfSymbol& sym, size_t max);

private:
    std::string path_;
    int fd_ = -1;
    int open_errno_ = 0;  // the first open's failure, kept: no retry per symbol
};

struct ElfData;
// Where link-time address `vaddr` lies in the file, through the PT_LOAD of
// `elf` that holds it; nullopt outside every one.
std::optional<uint64_t> file_offset_of(const ElfData& elf, uint64_t vaddr);
// `n` bytes (fewer at the end of its segment) at link-time address `vaddr`
// of the file, through the PT_LOAD of `elf` that holds it.
Result<std::vector<uint8_t>> read_code_at(const std::string& path, const ElfData& elf, uint64_t vaddr, size_t n);

// What a reader of a process's data needs of an ELF file beyond its functions.
struct ElfData {
    bool exec = false;               // ET_EXEC: linked at its final address
    std::vector<ElfSegment> loads;   // PT_LOAD, in file order; never empty
    std::map<std::string, uint64_t, std::less<>> symbols;  // of the names asked for, those defined: link-time address
    std::map<std::string, uint64_t, std::less<>> sizes;    // and their st_size
};
// Reads the headers and the symbols of .dynsym and .symtab named in `names`
// (without @VERSION).  Fails as ElfSymbols::open does, but a file with no
// symbol table (a stripped executable) is one without those symbols.
Result<ElfData> read_elf_data(const std::string& path, const std::set<std::string, std::less<>>& names);
// The same, for every defined symbol whose name `want` accepts.
Result<ElfData> read_elf_data(const std::string& path, const std::function<bool(std::string_view)>& want);

struct MapEntry;
// The load bias of `path` in a process whose maps are `maps`, from the
// mapping of the file's first PT_LOAD (0 for an ET_EXEC); nullopt when the
// file is not mapped there.
std::optional<uint64_t> load_bias(const std::vector<MapEntry>& maps, const std::string& path, const ElfData& elf);

// What the dynamic loader writes at a link-time address: the symbol a
// relocation there names ("" for a relative one) and its addend.
struct ElfReloc {
    std::string symbol;  // without @VERSION
    int64_t addend = 0;
    uint32_t type = 0;   // R_X86_64_*
};
// The relocations (SHT_RELA sections) at the addresses asked for; those
// with none are absent.
Result<std::map<uint64_t, ElfReloc>> read_relocations(const std::string& path, const std::set<uint64_t>& at);

// Whether the code at link-time address `addr` of the file is a PLT stub
// whose GOT slot the loader fills with `symbol` (a call or jump there reaches
// that function): the stub's form, and the slot's relocation naming it.
bool is_plt_stub_of(const std::string& path, const ElfData& elf, uint64_t addr, std::string_view symbol);

}  // namespace commdbg::host
