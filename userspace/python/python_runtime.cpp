// SPDX-License-Identifier: Apache-2.0
#include "python_runtime.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <optional>
#include <set>

#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "text.hpp"

namespace commdbg {
namespace {

using Status = PyDiscovery::Status;

// ---- the target's memory -------------------------------------------------

class TargetMemory {
public:
    explicit TargetMemory(int pid) : pid_(pid) {}
    // An error message, or empty when all `n` bytes were read.
    std::string read(uint64_t addr, void* out, size_t n, const char* what) const {
        iovec local{out, n};
        iovec remote{reinterpret_cast<void*>(addr), n};
        ssize_t got = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
        if (got == static_cast<ssize_t>(n)) return {};
        int err = got < 0 ? errno : EFAULT;
        std::string at = std::string(what) + " at " + hex(addr);
        if (err == ESRCH) return "process " + std::to_string(pid_) + " exited while reading " + at;
        if (err == EPERM) {
            return "cannot read the memory of process " + std::to_string(pid_) + ": permission denied (ptrace access) — " +
                   access_denied_advice(own_creds());
        }
        return "cannot read " + at + " in process " + std::to_string(pid_) + ": " + std::strerror(err) +
               " — the interpreter's memory is not laid out as expected";
    }
    template <typename T>
    std::string get(uint64_t addr, T& out, const char* what) const {
        return read(addr, &out, sizeof out, what);
    }
    // A NUL-terminated string of at most `max` bytes; an error message, or empty.
    std::string c_string(uint64_t addr, std::string& out, size_t max, const char* what) const {
        std::array<char, 128> buf{};
        max = std::min(max, buf.size() - 1);
        // Read byte-wise on failure: the string may end just before an unmapped page.
        if (read(addr, buf.data(), max, what).empty()) {
            out.assign(buf.data(), strnlen(buf.data(), max));
            return {};
        }
        out.clear();
        for (size_t i = 0; i < max; ++i) {
            char c = 0;
            if (std::string err = get(addr + i, c, what); !err.empty()) return err;
            if (c == '\0') return {};
            out.push_back(c);
        }
        return {};
    }
    int pid() const { return pid_; }

private:
    int pid_;
};

// ---- ELF: data symbols and load segments --------------------------------

struct Load {
    uint64_t vaddr, offset;
};

// What we need of the interpreter's ELF beyond its functions (ElfSymbols
// lists functions only): the type, the first PT_LOAD and data symbols.
struct ElfData {
    bool exec = false;  // ET_EXEC: linked at its final address
    std::optional<Load> first_load;
    std::map<std::string, uint64_t, std::less<>> symbols;  // wanted names only
};

std::string read_elf_data(const std::string& path, const std::set<std::string, std::less<>>& wanted, ElfData& out) {
    if (elf_version(EV_CURRENT) == EV_NONE) return "libelf: elf_version failed";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return path + ": cannot open: " + std::strerror(errno);
    Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    GElf_Ehdr eh;
    std::string err;
    size_t phnum = 0;
    if (elf == nullptr || gelf_getehdr(elf, &eh) == nullptr || elf_getphdrnum(elf, &phnum) != 0) {
        err = path + ": not a readable ELF file";
    } else {
        out.exec = eh.e_type == ET_EXEC;
        for (size_t i = 0; i < phnum && !out.first_load; ++i) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD)
                out.first_load = Load{ph.p_vaddr, ph.p_offset};
        }
        Elf_Scn* scn = nullptr;
        while ((scn = elf_nextscn(elf, scn)) != nullptr) {
            GElf_Shdr sh;
            if (gelf_getshdr(scn, &sh) == nullptr || (sh.sh_type != SHT_DYNSYM && sh.sh_type != SHT_SYMTAB)) continue;
            Elf_Data* data = elf_getdata(scn, nullptr);
            size_t n = sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
            for (size_t i = 1; data != nullptr && i < n; ++i) {
                GElf_Sym s;
                if (gelf_getsym(data, static_cast<int>(i), &s) == nullptr) break;
                if (s.st_shndx == SHN_UNDEF || s.st_value == 0) continue;
                const char* name = elf_strptr(elf, sh.sh_link, s.st_name);
                if (name == nullptr) continue;
                std::string_view bare(name);
                bare = bare.substr(0, bare.find('@'));
                if (wanted.count(bare) != 0) out.symbols.emplace(std::string(bare), s.st_value);
            }
        }
    }
    if (elf != nullptr) elf_end(elf);
    ::close(fd);
    return err;
}

// Up to `n` bytes of a function, from the file (the target's copy may hold a
// uprobe's int3).
std::string read_function(const std::string& path, const ElfSymbol& sym, size_t n, std::vector<uint8_t>& out) {
    if (sym.size != 0) n = std::min<size_t>(n, sym.size);
    out.assign(n, 0);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return path + ": cannot open: " + std::strerror(errno);
    ssize_t got = pread(fd, out.data(), n, static_cast<off_t>(sym.file_offset));
    ::close(fd);
    if (got <= 0) return path + ": cannot read " + sym.name + "'s code";
    out.resize(static_cast<size_t>(got));
    return {};
}

// ---- a bounded x86-64 decoder for the key load ---------------------------

// What a register holds, as far as the decoder follows it.
struct RegVal {
    enum Kind { unknown, got_value, pointer, int_at } kind = unknown;
    bool via_got = false;
    uint64_t slot = 0;  // GOT slot (via_got)
    uint64_t addr = 0;  // link-time address, or offset from *slot (via_got)
};

struct ModRm {
    int mod, reg, rm;
    size_t len;      // modrm + displacement bytes
    int64_t disp;
    bool rip;        // [rip + disp32]
};

bool parse_modrm(const std::vector<uint8_t>& c, size_t at, int rex, ModRm& m) {
    if (at >= c.size()) return false;
    uint8_t b = c[at];
    m.mod = b >> 6;
    m.reg = ((b >> 3) & 7) | ((rex & 4) ? 8 : 0);
    m.rm = (b & 7) | ((rex & 1) ? 8 : 0);
    m.rip = m.mod == 0 && (b & 7) == 5;
    if (m.mod != 3 && (b & 7) == 4) return false;  // SIB: not a form these functions use
    size_t dl = m.rip || m.mod == 2 ? 4 : m.mod == 1 ? 1 : 0;
    if (at + 1 + dl > c.size()) return false;
    m.disp = 0;
    if (dl == 1) m.disp = static_cast<int8_t>(c[at + 1]);
    if (dl == 4) {
        int32_t d;
        std::memcpy(&d, &c[at + 1], 4);
        m.disp = d;
    }
    m.len = 1 + dl;
    return true;
}

// The address an operand names, from the register file; false when unknown.
bool memory_operand(const ModRm& m, uint64_t next_ip, const std::array<RegVal, 16>& regs, RegVal& where) {
    if (m.rip) {
        where = RegVal{RegVal::pointer, false, 0, next_ip + static_cast<uint64_t>(m.disp)};
        return true;
    }
    const RegVal& base = regs[m.rm];
    if (m.mod == 3 || base.kind != RegVal::got_value) return false;
    where = RegVal{RegVal::pointer, true, base.slot, static_cast<uint64_t>(m.disp)};
    return true;
}

std::string unknown_at(const std::vector<uint8_t>& c, size_t at) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "an instruction it does not decode (byte 0x%02x at +%zu)", at < c.size() ? c[at] : 0,
                  at);
    return buf;
}

// One instruction that moves a value: mov/lea forms.  Returns its length, 0 if not one.
size_t step_move(const std::vector<uint8_t>& c, size_t i, int rex, uint64_t vaddr, std::array<RegVal, 16>& regs) {
    uint8_t op = c[i];
    ModRm m{};
    if ((op != 0x8b && op != 0x8d && op != 0x89) || !parse_modrm(c, i + 1, rex, m)) return 0;
    size_t len = 1 + m.len;
    uint64_t next_ip = vaddr + i + len;
    bool wide = (rex & 8) != 0;
    if (op == 0x89) {  // mov reg -> r/m: register copies only
        if (m.mod != 3 || !wide) return 0;
        regs[m.rm] = regs[m.reg];
        return len;
    }
    RegVal where;
    if (!memory_operand(m, next_ip, regs, where)) return 0;
    if (op == 0x8d) {  // lea: the register holds the address itself
        if (!wide) return 0;
        regs[m.reg] = where;
    } else if (wide && !where.via_got && m.rip) {  // mov r64, [rip+d]: a GOT slot's value
        regs[m.reg] = RegVal{RegVal::got_value, true, where.addr, 0};
    } else if (!wide) {  // mov r32, [...]: an int, the key itself
        regs[m.reg] = where;
        regs[m.reg].kind = RegVal::int_at;
    } else {
        return 0;
    }
    return len;
}

// Instructions with no effect on the registers followed: compares, tests,
// pushes, conditional branches (the fall-through path reads the key).
size_t step_neutral(const std::vector<uint8_t>& c, size_t i, int rex) {
    uint8_t op = c[i];
    ModRm m{};
    if (op == 0x83 && parse_modrm(c, i + 1, rex, m) && ((c[i + 1] >> 3) & 7) == 7) return 2 + m.len;  // cmp $imm8
    if (op == 0x85 && parse_modrm(c, i + 1, rex, m) && m.mod == 3) return 1 + m.len;                   // test r,r
    if ((op >= 0x50 && op <= 0x57) || (op >= 0x58 && op <= 0x5f)) return 1;                          // push/pop
    if (op >= 0x70 && op <= 0x7f && i + 1 < c.size()) return 2;                                       // jcc rel8
    if (op == 0x0f && i + 5 < c.size() && c[i + 1] >= 0x80 && c[i + 1] <= 0x8f) return 6;             // jcc rel32
    return 0;
}

}  // namespace

std::string decode_key_load(const std::vector<uint8_t>& c, uint64_t vaddr, KeyLoad& out) {
    std::array<RegVal, 16> regs{};
    size_t i = 0;
    if (c.size() >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) i = 4;  // endbr64
    for (int n = 0; n < 16 && i < c.size(); ++n) {
        int rex = (c[i] & 0xf0) == 0x40 ? c[i] & 0x0f : 0;
        size_t start = i;
        if (rex) ++i;
        if (i >= c.size()) break;
        if (c[i] == 0xe8 || c[i] == 0xe9) {  // the call (or tail call) that takes the key in rdi
            const RegVal& rdi = regs[7];
            if (rdi.kind != RegVal::pointer && rdi.kind != RegVal::int_at)
                return "PyGILState_GetThisThreadState: the first call's argument is not a load relative to a symbol";
            out.via_got = rdi.via_got;
            out.got_slot = rdi.slot;
            out.target = rdi.addr;
            out.is_tss_pointer = rdi.kind == RegVal::pointer;
            return {};
        }
        size_t len = step_move(c, i, rex, vaddr, regs);
        if (len == 0) len = step_neutral(c, i, rex);
        if (len == 0) return "PyGILState_GetThisThreadState has " + unknown_at(c, start);
        i += len;
    }
    return "PyGILState_GetThisThreadState: no call taking the key within the decoded bytes";
}

std::string decode_getspecific(const std::vector<uint8_t>& c, TlsSlots& out) {
    // glibc 2.34+ (also 2.36 here): cmp $31,%edi; ja slow; mov %edi,%eax;
    // add $A,%rax; shl $S,%rax; add %fs:0x10,%rax; mov D(%rax),%rdx.
    static const int16_t shape[] = {0x83, 0xff, -1, 0x77, -1, 0x89, 0xf8, 0x48, 0x83, 0xc0, -1, 0x48,
                                    0xc1, 0xe0, -1, 0x64, 0x48, 0x03, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00,
                                    0x48, 0x8b, 0x50, -1};
    size_t i = 0;
    if (c.size() >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) i = 4;
    constexpr size_t n = sizeof shape / sizeof shape[0];
    if (c.size() < i + n) return "pthread_getspecific is shorter than glibc's fast path";
    std::vector<uint8_t> imm;
    for (size_t k = 0; k < n; ++k) {
        if (shape[k] < 0) {
            imm.push_back(c[i + k]);
        } else if (c[i + k] != shape[k]) {
            return "pthread_getspecific is not glibc's fast path (byte 0x" + hex(c[i + k]).substr(2) + " at +" +
                   std::to_string(i + k) + ")";
        }
    }
    uint32_t shift = imm[3];
    if (shift > 8 || imm[2] > 0x7f || imm[4] > 0x7f) return "pthread_getspecific: implausible slot arithmetic";
    out.keys = imm[0] + 1u;
    out.stride = 1u << shift;
    out.base = static_cast<uint32_t>(imm[2]) << shift;
    out.data = imm[4];
    return {};
}

namespace {

// ---- the verified per-version table (python.md) --------------------------

void fill_table(PyLayout& l) {
    l.ob_type = 8, l.tp_name = 24, l.tp_flags = 168, l.tuple_items = 24, l.cell_contents = 16;
    l.unicode_length = 16, l.unicode_state = 32, l.ts_next = 8;
    switch (l.minor) {
    case 10:
        l.ts_frame = 24, l.ts_thread_id = 176, l.frame_code = 32, l.frame_previous = 24;
        l.frame_localsplus = 352, l.frame_instr = 96, l.code_localsplusnames = 72;
        l.unicode_ascii_data = 48, l.unicode_compact_data = 72, l.rt_interpreters_head = 32;
        l.interp_threads_head = 8;
        break;
    case 11:
        l.ts_frame = 56, l.ts_frame_inner = 8, l.ts_thread_id = 152, l.ts_native_thread_id = 160;
        l.frame_code = 32, l.frame_previous = 48, l.frame_localsplus = 72, l.frame_owner = 69;
        l.frame_instr = 56, l.code_localsplusnames = 96, l.unicode_ascii_data = 48;
        l.unicode_compact_data = 72, l.rt_interpreters_head = 40, l.interp_threads_head = 16;
        l.ts_datastack = 296;
        break;
    default:  // 12, 13
        l.ts_frame = l.minor == 12 ? 56 : 72, l.ts_frame_inner = l.minor == 12 ? 0 : kPyNoOffset;
        l.ts_thread_id = l.minor == 12 ? 136 : 152, l.ts_native_thread_id = l.minor == 12 ? 144 : 160;
        l.frame_code = 0, l.frame_previous = 8, l.frame_localsplus = 72, l.frame_owner = 70;
        l.frame_owner_cstack = 3, l.frame_instr = 56, l.code_localsplusnames = 96;
        l.unicode_ascii_data = 40, l.unicode_compact_data = 56;
        l.rt_interpreters_head = l.minor == 12 ? 40 : 632, l.interp_threads_head = l.minor == 12 ? 72 : 7344;
        l.skip_none_code = l.minor == 13;
        l.ts_datastack = 232;
        break;
    }
}

// The code-object offsets python.md verified, by member name.
std::map<std::string, uint32_t> expected_code_members(int minor) {
    if (minor == 10)
        return {{"co_argcount", 16}, {"co_flags", 36}, {"co_firstlineno", 40}, {"co_filename", 104}, {"co_name", 112}};
    std::map<std::string, uint32_t> m = {{"co_argcount", minor == 11 ? 56u : 52u},
                                         {"co_flags", 48},
                                         {"co_firstlineno", minor == 11 ? 72u : 68u},
                                         {"co_filename", 112},
                                         {"co_name", 120},
                                         {"co_qualname", 128}};
    return m;
}

// ---- steps of discovery --------------------------------------------------

struct Found {
    MappedFile file;
    ElfData elf;
    uint64_t bias = 0;
};

PyDiscovery fail(Status s, std::string why) {
    PyDiscovery d;
    d.status = s;
    d.reason = std::move(why);
    return d;
}

// Gone, a zombie, or past the start of do_exit (PF_EXITING in stat's flags):
// its memory map may already be torn down, so nothing read is evidence.
bool process_gone(int pid, const std::string& proc_root) {
    auto st = read_stat(pid, proc_root);
    return !st || st->state == 'Z' || st->state == 'X' || st->exiting();
}

// An error that happened because the process went away says so.
PyDiscovery read_failure(int pid, const std::string& proc_root, std::string why) {
    if (process_gone(pid, proc_root))
        return fail(Status::error, "process " + std::to_string(pid) + " exited during Python discovery");
    return fail(Status::error, std::move(why));
}

std::string basename_of(const std::string& p) {
    auto s = p.rfind('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

// The load bias of `path` from the mapping of its first PT_LOAD.
std::optional<uint64_t> load_bias(const std::vector<MapEntry>& maps, const std::string& path, const ElfData& elf) {
    if (!elf.first_load) return std::nullopt;
    uint64_t off = elf.first_load->offset & ~0xfffull, va = elf.first_load->vaddr & ~0xfffull;
    for (const MapEntry& e : maps) {
        if (e.path == path && e.offset == off) return elf.exec ? 0 : e.start - va;
    }
    return std::nullopt;
}

// libpython3.X.so* first (the executable is then a launcher), then the executable.
std::optional<Found> find_interpreter(int pid, const std::vector<MapEntry>& maps, const std::string& proc_root,
                                      std::string& err) {
    char exe[4096];
    std::string exe_link = proc_root + "/" + std::to_string(pid) + "/exe";
    ssize_t n = readlink(exe_link.c_str(), exe, sizeof exe - 1);
    std::string exe_path = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
    auto files = mapped_files(maps, pid, [&](std::string_view p) {
        return basename_of(std::string(p)).rfind("libpython", 0) == 0 || p == exe_path;
    }, proc_root);
    std::stable_partition(files.begin(), files.end(), [](const MappedFile& f) {
        return basename_of(f.path).rfind("libpython", 0) == 0;
    });
    static const std::set<std::string, std::less<>> wanted = {"_PyRuntime", "PyCode_Type", "_Py_NoneStruct",
                                                              "PyCell_Type", "Py_Version"};
    for (const MappedFile& f : files) {
        Found c{f, {}, 0};
        if (std::string e = read_elf_data(f.open_path, wanted, c.elf); !e.empty()) {
            err = e;
            continue;
        }
        if (c.elf.symbols.count("_PyRuntime") == 0) continue;
        auto bias = load_bias(maps, f.path, c.elf);
        if (!bias) {
            err = f.path + ": cannot find the mapping of its first segment in /proc/" + std::to_string(pid) + "/maps";
            continue;
        }
        c.bias = *bias;
        return c;
    }
    return std::nullopt;
}

// "3.11" from python3.11 / libpython3.11.so.1.0; `t` set for a free-threaded name.
std::optional<std::pair<int, int>> version_from_name(const std::string& path, bool& t) {
    std::string b = basename_of(path);
    auto at = b.find("python3.");
    if (at == std::string::npos) return std::nullopt;
    size_t i = at + 8, j = i;
    while (j < b.size() && std::isdigit(static_cast<unsigned char>(b[j]))) ++j;
    if (j == i) return std::nullopt;
    t = j < b.size() && b[j] == 't';
    return std::make_pair(3, std::stoi(b.substr(i, j - i)));
}

// Fills version_hex / major / minor; an unsupported result's reason, or empty.
std::string find_version(const Found& f, const TargetMemory& mem, PyDiscovery& d, Status& status) {
    bool free_threaded_name = false;
    auto by_name = version_from_name(f.file.path, free_threaded_name);
    status = Status::unsupported;
    if (free_threaded_name) return f.file.path + " is a free-threaded CPython build: not supported (use a default GIL build)";
    PyLayout& l = d.layout;
    if (auto v = f.elf.symbols.find("Py_Version"); v != f.elf.symbols.end()) {
        if (std::string e = mem.get(f.bias + v->second, l.version_hex, "Py_Version"); !e.empty()) {
            status = Status::error;
            return e;
        }
        l.major = static_cast<uint8_t>(l.version_hex >> 24), l.minor = static_cast<uint8_t>(l.version_hex >> 16);
        d.info.version = std::to_string(l.major) + "." + std::to_string(l.minor) + "." +
                         std::to_string((l.version_hex >> 8) & 0xff);
        if (by_name && (by_name->first != l.major || by_name->second != l.minor))
            return f.file.path + ": Py_Version says " + d.info.version + " but the file name another version";
    } else if (by_name) {
        l.major = 3, l.minor = static_cast<uint8_t>(by_name->second);
        l.version_hex = (3u << 24) | (static_cast<uint32_t>(l.minor) << 16);
        d.info.version = "3." + std::to_string(l.minor);
        d.notes.push_back("version " + d.info.version + " from the file name (no Py_Version before 3.11)");
    } else {
        return f.file.path + ": cannot tell the CPython version (no Py_Version, no version in the file name)";
    }
    if (l.major != 3 || l.minor < 10 || l.minor > 13)
        return "CPython " + d.info.version + " is not supported (supported: 3.10, 3.11, 3.12, 3.13)";
    if (l.minor >= 11 && l.minor <= 13 && ((l.version_hex >> 4) & 0xf) != 0xf)
        d.notes.push_back("pre-release CPython " + d.info.version + ": layout checked against the target, not tested");
    status = Status::supported;
    return {};
}

// A failure to read memory (the process may be gone), not a layout we refuse.
std::string as_error(std::string e, Status& st) {
    st = Status::error;
    return e;
}

// Locates the autoTSSkey from PyGILState_GetThisThreadState and reads it.
std::string find_key(const Found& f, const TargetMemory& mem, PyDiscovery& d, Status& st) {
    st = Status::unsupported;
    auto syms = ElfSymbols::open(f.file.open_path);
    if (!syms.ok()) return syms.error();
    const ElfSymbol* fn = syms->find("PyGILState_GetThisThreadState");
    if (fn == nullptr) return f.file.path + " has no PyGILState_GetThisThreadState: not a CPython this tool knows";
    std::vector<uint8_t> code;
    if (std::string e = read_function(f.file.open_path, *fn, 64, code); !e.empty()) return e;
    KeyLoad k;
    if (std::string e = decode_key_load(code, fn->vaddr, k); !e.empty()) return e + " — this build is not supported";
    uint64_t runtime_link = f.elf.symbols.at("_PyRuntime");
    uint64_t target = k.target;
    if (k.via_got) {
        uint64_t got = 0;
        if (std::string e = mem.get(f.bias + k.got_slot, got, "the GOT slot of _PyRuntime"); !e.empty()) return as_error(e, st);
        if (got != f.bias + runtime_link)
            return "PyGILState_GetThisThreadState reads its key relative to " + hex(got) + ", not _PyRuntime";
        target = runtime_link + k.target;
    }
    uint64_t tss_link = k.is_tss_pointer ? target : target - 4;  // Py_tss_t {int initialised; key}
    if (tss_link < runtime_link || tss_link - runtime_link > 0x100000)
        return "PyGILState_GetThisThreadState's key is not inside _PyRuntime — this build is not supported";
    d.info.tss_addr = f.bias + tss_link;
    d.layout.key_addr = d.info.tss_addr + 4;
    int32_t tss[2] = {0, 0};
    if (std::string e = mem.get(d.info.tss_addr, tss, "the autoTSSkey"); !e.empty()) return as_error(e, st);
    if (tss[0] != 1 || tss[1] < 0)
        return as_error("the interpreter's thread-state key is not initialised yet — retry once Python has started", st);
    d.layout.key = static_cast<uint32_t>(tss[1]);
    return {};
}

// Reads PyCode_Type.tp_members and checks it against the verified table.
std::string check_code_members(const TargetMemory& mem, PyDiscovery& d, Status& st) {
    st = Status::unsupported;
    PyLayout& l = d.layout;
    uint64_t name_ptr = 0, members = 0;
    std::string tp_name;
    if (std::string e = mem.get(l.code_type_addr + l.tp_name, name_ptr, "PyCode_Type.tp_name"); !e.empty()) return as_error(e, st);
    if (std::string e = mem.c_string(name_ptr, tp_name, 32, "PyCode_Type's name"); !e.empty()) return as_error(e, st);
    if (tp_name != "code") return "PyCode_Type's tp_name is \"" + tp_name + "\", not \"code\": unknown type layout";
    if (std::string e = mem.get(l.code_type_addr + 240, members, "PyCode_Type.tp_members"); !e.empty()) return as_error(e, st);
    std::map<std::string, uint32_t> found;
    for (int i = 0; i < 64; ++i) {
        struct {
            uint64_t name;
            int32_t type;
            int32_t pad;
            int64_t offset;
            int32_t flags;
            int32_t pad2;
            uint64_t doc;
        } m{};
        static_assert(sizeof m == 40, "PyMemberDef on x86-64");
        if (std::string e = mem.get(members + 40ull * static_cast<uint64_t>(i), m, "a PyMemberDef"); !e.empty()) return as_error(e, st);
        if (m.name == 0) break;
        std::string name;
        if (std::string e = mem.c_string(m.name, name, 64, "a member name"); !e.empty()) return as_error(e, st);
        if (m.offset >= 0 && m.offset < 4096) found[name] = static_cast<uint32_t>(m.offset);
    }
    for (const auto& [name, want] : expected_code_members(l.minor)) {
        auto it = found.find(name);
        if (it == found.end()) return "PyCode_Type has no member " + name + ": unknown code-object layout";
        if (it->second != want)
            return "code-object " + name + " is at " + std::to_string(it->second) + ", the verified table says " +
                   std::to_string(want) + ": this build's layout differs, not supported";
    }
    l.code_argcount = found["co_argcount"], l.code_flags = found["co_flags"];
    l.code_firstlineno = found["co_firstlineno"], l.code_filename = found["co_filename"];
    l.code_name = found["co_name"];
    if (l.minor >= 11) l.code_qualname = found["co_qualname"];
    return {};
}

// 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h of 3.13), the
// fields used here; every field is a uint64_t.
struct DebugOffsets313 {
    char cookie[8];
    uint64_t version, free_threaded;
    uint64_t rt_size, rt_finalizing, rt_interpreters_head;
    uint64_t is_size, is_id, is_next, is_threads_head, is_rest[9];
    uint64_t ts_size, ts_prev, ts_next, ts_interp, ts_current_frame, ts_thread_id, ts_native_thread_id,
        ts_datastack_chunk, ts_status;
    uint64_t fr_size, fr_previous, fr_executable, fr_instr_ptr, fr_localsplus, fr_owner;
    uint64_t co_size, co_filename, co_name, co_qualname, co_linetable, co_firstlineno, co_argcount,
        co_localsplusnames, co_localspluskinds, co_code_adaptive;
    uint64_t ob_size, ob_type;
    uint64_t tp_size, tp_name, tp_repr, tp_flags;
    uint64_t tu_size, tu_ob_item, tu_ob_size;
    uint64_t rest[14];
    uint64_t un_size, un_state, un_length, un_asciiobject_size;
    uint64_t gc_size, gc_collecting;
};
static_assert(sizeof(DebugOffsets313) == 584, "3.13.0's _Py_DebugOffsets");

// Takes one offset from _Py_DebugOffsets, noting where it differs from the table.
void take(uint32_t& field, uint64_t v, const char* name, PyDiscovery& d) {
    if (v > 0xffff) return;
    if (field != v) d.notes.push_back(std::string("_Py_DebugOffsets: ") + name + " is " + std::to_string(v) +
                                      " (table: " + std::to_string(field) + ")");
    field = static_cast<uint32_t>(v);
}

std::string apply_debug_offsets(const TargetMemory& mem, PyDiscovery& d, Status& status) {
    DebugOffsets313 o{};
    PyLayout& l = d.layout;
    status = Status::error;
    if (std::string e = mem.get(l.runtime_addr, o, "_Py_DebugOffsets"); !e.empty()) return e;
    status = Status::unsupported;
    if (std::memcmp(o.cookie, "xdebugpy", 8) != 0) return "3.13 without the _Py_DebugOffsets cookie: unknown layout";
    if (o.free_threaded != 0) return "free-threaded CPython 3.13t: not supported (use a default GIL build)";
    if ((o.version >> 16) != (l.version_hex >> 16)) return "_Py_DebugOffsets' version is " + hex(o.version);
    if (o.co_qualname != l.code_qualname || o.co_firstlineno != l.code_firstlineno || o.co_argcount != l.code_argcount)
        return "_Py_DebugOffsets' code-object offsets disagree with PyCode_Type.tp_members: not supported";
    take(l.rt_interpreters_head, o.rt_interpreters_head, "interpreters.head", d);
    take(l.interp_threads_head, o.is_threads_head, "threads.head", d);
    take(l.ts_next, o.ts_next, "tstate.next", d);
    take(l.ts_frame, o.ts_current_frame, "tstate.current_frame", d);
    take(l.ts_thread_id, o.ts_thread_id, "tstate.thread_id", d);
    take(l.ts_native_thread_id, o.ts_native_thread_id, "tstate.native_thread_id", d);
    take(l.ts_datastack, o.ts_datastack_chunk, "tstate.datastack_chunk", d);
    take(l.frame_previous, o.fr_previous, "frame.previous", d);
    take(l.frame_code, o.fr_executable, "frame.f_executable", d);
    take(l.frame_instr, o.fr_instr_ptr, "frame.instr_ptr", d);
    take(l.frame_localsplus, o.fr_localsplus, "frame.localsplus", d);
    take(l.frame_owner, o.fr_owner, "frame.owner", d);
    take(l.code_localsplusnames, o.co_localsplusnames, "co_localsplusnames", d);
    take(l.ob_type, o.ob_type, "ob_type", d);
    take(l.tp_name, o.tp_name, "tp_name", d);
    take(l.tp_flags, o.tp_flags, "tp_flags", d);
    take(l.tuple_items, o.tu_ob_item, "tuple ob_item", d);
    take(l.unicode_state, o.un_state, "unicode state", d);
    take(l.unicode_length, o.un_length, "unicode length", d);
    take(l.unicode_ascii_data, o.un_asciiobject_size, "compact ASCII data", d);
    d.info.debug_offsets = true;
    status = Status::supported;
    return {};
}

// glibc's key slots, from the libc mapped in the target.
void find_tls_slots(int pid, const std::vector<MapEntry>& maps, const std::string& proc_root, PyDiscovery& d) {
    auto libs = mapped_files(maps, pid, [](std::string_view p) {
        std::string b = basename_of(std::string(p));
        return b.rfind("libc.so", 0) == 0 || b.rfind("libc-", 0) == 0 || b.rfind("libpthread", 0) == 0;
    }, proc_root);
    std::string why = "no libc mapped";
    for (const MappedFile& f : libs) {
        auto syms = ElfSymbols::open(f.open_path);
        const ElfSymbol* fn = syms.ok() ? syms->find("pthread_getspecific") : nullptr;
        if (fn == nullptr) continue;
        std::vector<uint8_t> code;
        TlsSlots t;
        why = read_function(f.open_path, *fn, 64, code);
        if (why.empty()) why = decode_getspecific(code, t);
        if (!why.empty()) continue;
        d.layout.tls_base = t.base, d.layout.tls_stride = t.stride, d.layout.tls_data = t.data;
        d.layout.tls_keys = t.keys, d.layout.tls_derived = 1;
        return;
    }
    d.layout.tls_base = 0x310, d.layout.tls_stride = 16, d.layout.tls_data = 8, d.layout.tls_keys = 32;
    d.notes.push_back("glibc key slots not decoded (" + why +
                      "); using glibc 2.36's layout — the thread_id check rejects a wrong slot");
}

}  // namespace

namespace {

PyDiscovery discover(int pid, const std::string& proc_root) {
    if (process_gone(pid, proc_root))
        return fail(Status::error, "process " + std::to_string(pid) + " does not exist or has exited");
    auto maps = read_maps(pid, proc_root);
    if (!maps.ok()) return read_failure(pid, proc_root, maps.error());
    std::string elf_err;
    auto found = find_interpreter(pid, *maps, proc_root, elf_err);
    if (!found) {
        if (process_gone(pid, proc_root)) return read_failure(pid, proc_root, "");
        // A libpython we could not read is not evidence of "no python".
        if (!elf_err.empty()) return fail(Status::error, "cannot inspect the process's CPython: " + elf_err);
        return fail(Status::not_python, "not a CPython process");
    }
    TargetMemory mem(pid);
    PyDiscovery d;
    d.info.file = found->file.path, d.info.open_path = found->file.open_path, d.info.load_bias = found->bias;
    d.info.shared_library = basename_of(found->file.path).rfind("libpython", 0) == 0;
    PyLayout& l = d.layout;
    const auto& s = found->elf.symbols;
    l.runtime_addr = found->bias + s.at("_PyRuntime");
    if (s.count("PyCode_Type") == 0 || s.count("_Py_NoneStruct") == 0)
        return fail(Status::unsupported, found->file.path + " lacks PyCode_Type or _Py_NoneStruct in its symbols");
    l.code_type_addr = found->bias + s.at("PyCode_Type"), l.none_addr = found->bias + s.at("_Py_NoneStruct");
    if (auto it = s.find("PyCell_Type"); it != s.end()) l.cell_type_addr = found->bias + it->second;
    Status st;
    auto failed = [&](Status why, std::string e) {
        return why == Status::error ? read_failure(pid, proc_root, std::move(e)) : fail(why, std::move(e));
    };
    if (std::string e = find_version(*found, mem, d, st); !e.empty()) return failed(st, e);
    fill_table(l);
    if (std::string e = find_key(*found, mem, d, st); !e.empty()) return failed(st, e);
    if (std::string e = check_code_members(mem, d, st); !e.empty()) return failed(st, e);
    if (l.minor == 13) {
        if (std::string e = apply_debug_offsets(mem, d, st); !e.empty()) return failed(st, e);
    }
    find_tls_slots(pid, *maps, proc_root, d);
    if (l.key >= l.tls_keys)
        d.notes.push_back("autoTSSkey " + std::to_string(l.key) + " is past glibc's first key block: use the thread list");
    d.status = Status::supported;
    return d;
}

}  // namespace

PyDiscovery discover_python(int pid, const std::string& proc_root) {
    PyDiscovery d = discover(pid, proc_root);
    // A process dying mid-way unmaps libpython or fails a read: "not python"
    // or "unsupported" would then be a wrong story.
    if (!d.ok() && process_gone(pid, proc_root) && d.reason.find("exited") == std::string::npos)
        return fail(Status::error, "process " + std::to_string(pid) + " exited during Python discovery");
    return d;
}

}  // namespace commdbg
