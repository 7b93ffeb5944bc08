// SPDX-License-Identifier: Apache-2.0
// discover_python: finds the interpreter's ELF among the process's mappings,
// its version, the thread-state key and glibc's key slots; the layout table
// and its checks are py_layouts.cpp's.
#include "python_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <set>

#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "py_layouts.hpp"
#include "remote_memory.hpp"
#include "text.hpp"
#include "x86_decode.hpp"

namespace commdbg::python {

Result<KeyLoad> decode_key_load(const std::vector<uint8_t>& c, uint64_t vaddr) {
    using R = Result<KeyLoad>;
    const arch::FirstCall call = arch::decode_to_first_call(c, vaddr);
    if (call.stop == arch::FirstCall::Stop::unknown_instruction) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "an instruction it does not decode (byte 0x%02x at +%zu)", call.byte, call.at);
        return R::fail(std::string("PyGILState_GetThisThreadState has ") + buf);
    }
    if (call.stop == arch::FirstCall::Stop::no_call)
        return R::fail("PyGILState_GetThisThreadState: no call taking the key within the decoded bytes");
    // The call (or tail call) takes the key, or the Py_tss_t holding it, in rdi.
    const arch::RegVal& rdi = call.rdi;
    if (rdi.kind != arch::RegVal::pointer && rdi.kind != arch::RegVal::int_at)
        return R::fail("PyGILState_GetThisThreadState: the first call's argument is not a load relative to a symbol");
    KeyLoad out;
    out.via_got = rdi.via_got;
    out.got_slot = rdi.slot;
    out.target = rdi.addr;
    out.is_tss_pointer = rdi.kind == arch::RegVal::pointer;
    out.absolute = rdi.absolute;
    return out;
}

namespace {

using namespace discovery;

// The interpreter's ELF as this process reads it, and where it is loaded.
struct Found {
    host::MappedFile file;
    host::ElfData elf;
    uint64_t bias = 0;
};

PyDiscovery fail(Status s, std::string why) {
    PyDiscovery d;
    d.status = s;
    d.reason = std::move(why);
    return d;
}

// Gone, a zombie, or past the start of do_exit (PF_EXITING in stat's flags),
// every thread of it: its memory map may already be torn down, so nothing
// read is evidence.  A main thread that exited while others run on is not.
bool process_gone(int pid, const std::string& proc_root) {
    return !host::live_thread(pid, proc_root);
}

// An error that happened because the process went away says so.
PyDiscovery read_failure(int pid, const std::string& proc_root, std::string why) {
    if (process_gone(pid, proc_root))
        return fail(Status::error, "process " + std::to_string(pid) + " exited during Python discovery");
    return fail(Status::error, std::move(why));
}

// The files that may hold the interpreter: libpython3.X.so* first (the
// executable is then a launcher), then the executable.
std::vector<host::MappedFile> candidate_files(int pid, const std::vector<host::MapEntry>& maps,
                                              const std::string& proc_root) {
    char exe[4096];
    std::string exe_link = host::memory_dir(pid, proc_root) + "/exe";
    ssize_t n = readlink(exe_link.c_str(), exe, sizeof exe - 1);
    std::string exe_path = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
    auto files = mapped_files(maps, pid, [&](std::string_view p) {
        return host::basename_of(p).starts_with("libpython") || p == exe_path;
    }, proc_root);
    std::stable_partition(files.begin(), files.end(), [](const host::MappedFile& f) {
        return host::basename_of(f.path).starts_with("libpython");
    });
    return files;
}

// The first candidate that defines _PyRuntime; nullopt when none does, a
// failure when none does and one could not be read (a libpython we could
// not read is not evidence of "no python").
Result<std::optional<Found>> find_interpreter(int pid, const std::vector<host::MapEntry>& maps,
                                              const std::string& proc_root) {
    static const std::set<std::string, std::less<>> wanted = {"_PyRuntime", "PyCode_Type", "_Py_NoneStruct",
                                                              "PyCell_Type", "Py_Version"};
    std::string err;
    for (const host::MappedFile& f : candidate_files(pid, maps, proc_root)) {
        auto elf = host::read_elf_data(f.open_path, wanted);
        if (!elf) {
            err = elf.error();
            continue;
        }
        if (elf->symbols.count("_PyRuntime") == 0) continue;
        auto bias = host::load_bias(maps, f.path, *elf);
        if (!bias) {
            err = f.path + ": cannot find the mapping of its first segment in /proc/" + std::to_string(pid) + "/maps";
            continue;
        }
        return std::optional<Found>(Found{f, std::move(*elf), *bias});
    }
    if (!err.empty()) return Result<std::optional<Found>>::fail(err);
    return std::optional<Found>();
}

// "3.11" from python3.11 / libpython3.11.so.1.0; `t` set for a free-threaded name.
std::optional<std::pair<int, int>> version_from_name(const std::string& path, bool& t) {
    std::string b(host::basename_of(path));
    auto at = b.find("python3.");
    if (at == std::string::npos) return std::nullopt;
    size_t i = at + 8, j = i;
    while (j < b.size() && std::isdigit(static_cast<unsigned char>(b[j]))) ++j;
    if (j == i) return std::nullopt;
    t = j < b.size() && b[j] == 't';
    return std::make_pair(3, std::stoi(b.substr(i, j - i)));
}

// Fills version_hex / major / minor from Py_Version (3.11+) or the file name.
Step find_version(const Found& f, host::ProcessMemory& mem, PyDiscovery& d, Status& status) {
    bool free_threaded_name = false;
    auto by_name = version_from_name(f.file.path, free_threaded_name);
    status = Status::unsupported;
    if (free_threaded_name)
        return Step::fail(f.file.path + " is a free-threaded CPython build: not supported (use a default GIL build)");
    PyLayout& l = d.layout;
    if (auto v = f.elf.symbols.find("Py_Version"); v != f.elf.symbols.end()) {
        if (auto r = read_field(mem, f.bias + v->second, l.version_hex, "Py_Version"); !r) {
            status = Status::error;
            return r;
        }
        l.major = static_cast<uint8_t>(l.version_hex >> 24), l.minor = static_cast<uint8_t>(l.version_hex >> 16);
        d.info.version = std::to_string(l.major) + "." + std::to_string(l.minor) + "." +
                         std::to_string((l.version_hex >> 8) & 0xff);
        if (by_name && (by_name->first != l.major || by_name->second != l.minor))
            return Step::fail(f.file.path + ": Py_Version says " + d.info.version + " but the file name another version");
    } else if (by_name) {
        l.major = 3, l.minor = static_cast<uint8_t>(by_name->second);
        l.version_hex = (3u << 24) | (static_cast<uint32_t>(l.minor) << 16);
        d.info.version = "3." + std::to_string(l.minor);
        d.notes.push_back("version " + d.info.version + " from the file name (no Py_Version before 3.11)");
    } else {
        return Step::fail(f.file.path + ": cannot tell the CPython version (no Py_Version, no version in the file name)");
    }
    if (l.major != 3 || l.minor < 10 || l.minor > 13)
        return Step::fail("CPython " + d.info.version + " is not supported (supported: 3.10, 3.11, 3.12, 3.13)");
    if (l.minor >= 11 && l.minor <= 13 && ((l.version_hex >> 4) & 0xf) != 0xf)
        d.notes.push_back("pre-release CPython " + d.info.version + ": layout checked against the target, not tested");
    status = Status::supported;
    return true;
}

// How PyGILState_GetThisThreadState loads the autoTSSkey, from its code.
Result<KeyLoad> key_load_of(const Found& f) {
    using R = Result<KeyLoad>;
    auto syms = host::ElfSymbols::open(f.file.open_path);
    if (!syms.ok()) return R::fail(syms.error());
    const host::ElfSymbol* fn = syms->find("PyGILState_GetThisThreadState");
    if (fn == nullptr) return R::fail(f.file.path + " has no PyGILState_GetThisThreadState: not a CPython this tool knows");
    auto code = read_function_code(f.file.open_path, *fn, 64);
    if (!code) return R::fail(code.error());
    auto k = decode_key_load(*code, fn->vaddr);
    if (!k) return R::fail(k.error() + " — this build is not supported");
    return k;
}

// Locates the autoTSSkey from PyGILState_GetThisThreadState and reads it.
Step find_key(const Found& f, host::ProcessMemory& mem, PyDiscovery& d, Status& st) {
    st = Status::unsupported;
    auto k = key_load_of(f);
    if (!k) return Step::fail(k.error());
    uint64_t runtime_link = f.elf.symbols.at("_PyRuntime");
    uint64_t target = k->target;
    if (k->absolute && f.bias != 0)
        return Step::fail("PyGILState_GetThisThreadState passes an immediate, but the interpreter is relocated (bias " +
                          hex(f.bias) + "): not an address — this build is not supported");
    if (k->via_got) {
        uint64_t got = 0;
        if (auto r = read_field(mem, f.bias + k->got_slot, got, "the GOT slot of _PyRuntime"); !r) return as_error(r, st);
        if (got != f.bias + runtime_link)
            return Step::fail("PyGILState_GetThisThreadState reads its key relative to " + hex(got) + ", not _PyRuntime");
        target = runtime_link + k->target;
    }
    uint64_t tss_link = k->is_tss_pointer ? target : target - 4;  // Py_tss_t {int initialised; key}
    if (tss_link < runtime_link || tss_link - runtime_link > 0x100000)
        return Step::fail("PyGILState_GetThisThreadState's key is not inside _PyRuntime — this build is not supported");
    d.info.tss_addr = f.bias + tss_link;
    d.layout.key_addr = d.info.tss_addr + 4;
    int32_t tss[2] = {0, 0};
    if (auto r = read_field(mem, d.info.tss_addr, tss, "the autoTSSkey"); !r) return as_error(r, st);
    if (tss[0] != 1 || tss[1] < 0)
        return as_error(Step::fail("the interpreter's thread-state key is not initialised yet — retry once Python has started"), st);
    d.layout.key = static_cast<uint32_t>(tss[1]);
    return true;
}

// glibc's key slots from one libc's pthread_getspecific; nullopt when the
// file has none (libpthread of glibc 2.34+ is a stub).
Result<std::optional<TlsSlots>> tls_slots_of(const host::MappedFile& f) {
    using R = Result<std::optional<TlsSlots>>;
    auto syms = host::ElfSymbols::open(f.open_path);
    const host::ElfSymbol* fn = syms.ok() ? syms->find("pthread_getspecific") : nullptr;
    if (fn == nullptr) return std::optional<TlsSlots>();
    auto code = read_function_code(f.open_path, *fn, 64);
    if (!code) return R::fail(code.error());
    auto slots = arch::getspecific_slots(*code);
    if (!slots) return R::fail(slots.error());
    return std::optional<TlsSlots>(*slots);
}

// glibc's key slots, from the libc mapped in the target.
void find_tls_slots(int pid, const std::vector<host::MapEntry>& maps, const std::string& proc_root, PyDiscovery& d) {
    auto libs = mapped_files(maps, pid, [](std::string_view p) {
        std::string_view b = host::basename_of(p);
        return b.starts_with("libc.so") || b.starts_with("libc-") || b.starts_with("libpthread");
    }, proc_root);
    std::string why = "no libc mapped";
    for (const host::MappedFile& f : libs) {
        auto t = tls_slots_of(f);
        if (!t) why = t.error();
        if (!t || !*t) continue;
        const TlsSlots& slots = **t;
        d.layout.tls_base = slots.base, d.layout.tls_stride = slots.stride, d.layout.tls_data = slots.data;
        d.layout.tls_keys = slots.keys, d.layout.tls_derived = 1;
        return;
    }
    d.layout.tls_base = 0x310, d.layout.tls_stride = 16, d.layout.tls_data = 8, d.layout.tls_keys = 32;
    d.notes.push_back("glibc key slots not decoded (" + why +
                      "); using glibc 2.36's layout — the thread_id check rejects a wrong slot");
}

// The addresses of the interpreter's symbols; false when it lacks one it must have.
bool take_symbols(const Found& found, PyDiscovery& d) {
    PyLayout& l = d.layout;
    const auto& s = found.elf.symbols;
    l.runtime_addr = found.bias + s.at("_PyRuntime");
    if (s.count("PyCode_Type") == 0 || s.count("_Py_NoneStruct") == 0) return false;
    l.code_type_addr = found.bias + s.at("PyCode_Type"), l.none_addr = found.bias + s.at("_Py_NoneStruct");
    if (auto it = s.find("PyCell_Type"); it != s.end()) l.cell_type_addr = found.bias + it->second;
    return true;
}

// The layout of the interpreter `found`, checked against the target.
PyDiscovery layout_of(int pid, const Found& found, const std::vector<host::MapEntry>& maps,
                      const std::string& proc_root) {
    host::ProcessMemory mem(pid);
    PyDiscovery d;
    d.info.file = found.file.path, d.info.open_path = found.file.open_path, d.info.load_bias = found.bias;
    d.info.shared_library = host::basename_of(found.file.path).starts_with("libpython");
    if (!take_symbols(found, d))
        return fail(Status::unsupported, found.file.path + " lacks PyCode_Type or _Py_NoneStruct in its symbols");
    PyLayout& l = d.layout;
    Status st;
    auto failed = [&](Status why, std::string e) {
        return why == Status::error ? read_failure(pid, proc_root, std::move(e)) : fail(why, std::move(e));
    };
    if (auto r = find_version(found, mem, d, st); !r) return failed(st, r.error());
    fill_table(l);
    if (auto r = find_key(found, mem, d, st); !r) return failed(st, r.error());
    if (auto r = check_code_members(mem, d, st); !r) return failed(st, r.error());
    if (l.minor == 13) {
        if (auto r = apply_debug_offsets(mem, d, st); !r) return failed(st, r.error());
    }
    find_tls_slots(pid, maps, proc_root, d);
    if (l.key >= l.tls_keys)
        d.notes.push_back("autoTSSkey " + std::to_string(l.key) + " is past glibc's first key block: use the thread list");
    d.status = Status::supported;
    return d;
}

PyDiscovery discover(int pid, const std::string& proc_root) {
    if (process_gone(pid, proc_root))
        return fail(Status::error, "process " + std::to_string(pid) + " does not exist or has exited");
    auto maps = host::read_maps(pid, proc_root);
    if (!maps.ok()) return read_failure(pid, proc_root, maps.error());
    auto found = find_interpreter(pid, *maps, proc_root);
    if (!found || !*found) {
        if (process_gone(pid, proc_root)) return read_failure(pid, proc_root, "");
        if (!found) return fail(Status::error, "cannot inspect the process's CPython: " + found.error());
        return fail(Status::not_python, "not a CPython process");
    }
    return layout_of(pid, **found, *maps, proc_root);
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

}  // namespace commdbg::python
