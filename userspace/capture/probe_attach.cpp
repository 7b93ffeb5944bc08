// SPDX-License-Identifier: Apache-2.0
#include "probe_attach.hpp"

#include "x86_decode.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "arch.hpp"
#include "demangle.hpp"
#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "regular_file.hpp"

namespace commdbg::capture {

namespace {

bool is_loader_path(std::string_view path) {
    std::string_view b = host::basename_of(path);
    return b.starts_with("ld-linux") || b.starts_with("ld64.so") || b.starts_with("ld-musl");
}

// PT_INTERP of an executable, or "" when it has none (static, script, unreadable).
std::string read_interp(const std::string& exe) {
    int fd = ::open(exe.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    elf_version(EV_CURRENT);
    std::string interp;
    if (Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr)) {
        size_t n = 0;
        if (elf_getphdrnum(e, &n) == 0) {
            for (size_t i = 0; i < n; ++i) {
                GElf_Phdr ph;
                if (!gelf_getphdr(e, static_cast<int>(i), &ph) || ph.p_type != PT_INTERP) continue;
                size_t size = 0;
                char* raw = elf_rawfile(e, &size);
                if (raw && ph.p_offset + ph.p_filesz <= size && ph.p_filesz > 1)
                    interp.assign(raw + ph.p_offset, ph.p_filesz - 1);
            }
        }
        elf_end(e);
    }
    ::close(fd);
    return interp;
}

// Where in `sym` its probe goes: the entry, but for a module entry (a
// function whose arguments nobody reads, called on every nn.Module call) the
// first instruction the kernel emulates when only set-up precedes it, which
// saves the out-of-line single step of the entry's `sub` (bench_module_enter).
// Where a rule's probe on `sym` goes, past its entry: a module entry's on the
// function's first call (arch::emulated_first_call), any other past a leading
// endbr64 where the kernel then emulates the instruction it traps on
// (arch::single_trap_entry): one exception instead of two.  Both keep the
// entry's registers and stack.
uint64_t attach_offset(host::CodeReader& code, const host::ElfSymbol& sym, const SymbolInfo& info) {
    auto c = code.read(sym, 32);
    if (!c) return 0;
    if (info.role == CD_ROLE_MODULE_ENTER)
        if (auto call = arch::emulated_first_call(*c)) return *call;
    return arch::single_trap_entry(*c);
}

// Whether a file beside the library at `path` holds what `c` looks for
// (read through /proc/PID/root where the library is).
bool condition_holds(const FileCondition& c, const std::string& path) {
    const std::string dir = path.substr(0, path.rfind('/') + 1);
    return std::any_of(c.paths.begin(), c.paths.end(), [&](const std::string& p) {
        return host::regular_file_contains(dir + p, c.contains, FileCondition::kMaxBytes);
    });
}

// The rules of `spec` that apply to the library at `path` ("if_file" /
// "unless_file"): each distinct condition is read once.
std::vector<const SymbolRule*> rules_for(const ProbeSpec& spec, const std::string& path) {
    std::vector<std::pair<const FileCondition*, bool>> read;
    std::vector<const SymbolRule*> out;
    for (const auto& rule : spec.symbols) {
        if (rule.when) {
            const FileCondition& c = *rule.when;
            auto it = std::find_if(read.begin(), read.end(), [&](const auto& r) {
                return r.first->paths == c.paths && r.first->contains == c.contains;
            });
            if (it == read.end()) it = read.insert(read.end(), {&c, condition_holds(c, path)});
            if (it->second == c.unless) continue;
        }
        out.push_back(&rule);
    }
    return out;
}

// What the plan of `spec` on the file at `path` tells the user; false when
// it probes nothing there.
bool note_plan(const ProbeSpec& spec, const std::string& path, const ProbeAttacher::Plan& plan,
               std::vector<std::string>& notes) {
    for (const auto& m : plan.missing)
        notes.push_back("spec " + spec.name + ": " + path + " has no symbol " + m + " (older library?) — not probed");
    for (const auto& n : plan.notes) notes.push_back("spec " + spec.name + ": " + n);
    if (!plan.offsets.empty()) return true;
    if (plan.elsewhere && plan.missing.empty()) return false;  // probed in another of its files
    notes.push_back("spec " + spec.name + ": " +
                    (plan.skipped ? "none of its " + std::to_string(plan.skipped) + " symbols in " + path +
                                        " is probed: " + spec.skip_why
                                  : "no symbol of the spec in " + path + " — nothing probed"));
    return false;
}

// Threads that detach a shutting-down attacher's files at once.
constexpr size_t kDetachThreads = 32;

}  // namespace

Result<ProbeAttacher::Plan> ProbeAttacher::plan(const ProbeSpec& spec, const std::string& file, SymbolTable& symbols) {
    auto elf = host::ElfSymbols::open(file);
    if (!elf) return Result<Plan>::fail(elf.error());
    std::vector<std::string> demangled;
    return plan(spec, *elf, symbols, demangled);
}

ProbeAttacher::Plan ProbeAttacher::plan(const ProbeSpec& spec, const host::ElfSymbols& elf, SymbolTable& symbols,
                                        std::vector<std::string>& demangled) {
    Plan p;
    std::map<uint64_t, uint64_t> by_offset;  // first rule to claim an address wins
    std::set<uint64_t> skipped;              // addresses `skip` left out
    std::set<uint64_t> claimed;              // entries a rule took (aliases share one)
    host::CodeReader code(elf.path());
    auto add = [&](const SymbolRule& rule, const host::ElfSymbol& sym, const std::string& demangled) {
        if (sym.ifunc || claimed.count(sym.file_offset)) return;
        SymbolInfo info = rule.info;
        info.name = derive_name(rule, sym.name, demangled);
        if (spec.skip && spec.skip(info)) {
            skipped.insert(sym.file_offset);
            return;
        }
        if (spec.c10d_tensors) info.tensor_params = c10d_tensor_params(demangled);
        claimed.insert(sym.file_offset);
        uint32_t id = symbols.intern(info);
        by_offset[sym.file_offset + attach_offset(code, sym, info)] = make_cookie(id, *symbols.find(id));
    };
    const std::vector<const SymbolRule*> rules = rules_for(spec, elf.path());
    bool any_pattern = false;
    for (const SymbolRule* rp : rules) {
        const SymbolRule& rule = *rp;
        if (rule.match.empty()) {
            any_pattern = true;
            continue;
        }
        if (const host::ElfSymbol* s = elf.find(rule.match)) {
            add(rule, *s, rule.match);
            continue;
        }
        DerivedSites d = spec.derive ? spec.derive(elf.path(), rule.match) : DerivedSites{};
        p.elsewhere += d.elsewhere;
        if (d.at.empty() && !d.elsewhere) p.missing.push_back(d.note.empty() ? rule.match : rule.match + " (" + d.note + ")");
        if (!d.at.empty() && !d.note.empty()) p.notes.push_back(d.note);
        for (const host::ElfSymbol& s : d.at) add(rule, s, rule.match);
    }
    if (any_pattern) {
        const auto& funcs = elf.functions();
        demangled.resize(funcs.size());
        for (size_t i = 0; i < funcs.size(); ++i) {
            const host::ElfSymbol& sym = funcs[i];
            std::string& d = demangled[i];
            for (const SymbolRule* rp : rules) {
                const SymbolRule& rule = *rp;
                if (!rule.match.empty()) continue;
                if (d.empty()) d = host::demangle(sym.name);
                if ((!rule.glob.empty() && glob_match(rule.glob, d)) ||
                    (rule.regex && rule.regex->partial_match(d))) {
                    add(rule, sym, d);
                    break;
                }
            }
        }
    }
    for (const auto& [off, cookie] : by_offset) {
        p.offsets.push_back(off);
        p.cookies.push_back(cookie);
        if (CD_COOKIE_RET(cookie)) {
            p.ret_offsets.push_back(off);
            p.ret_cookies.push_back(cookie);
        }
    }
    p.skipped = skipped.size();
    return p;
}

// Only the files a spec names, and loaders, are looked at (each a stat or
// more): a torch process maps hundreds, and its import alone is a few
// hundred loader changes, each a scan.
bool ProbeAttacher::looks_at(std::string_view path) const {
    if (is_loader_path(path)) return true;
    for (const auto& spec : specs_)
        if (spec.matches_library(path)) return true;
    return false;
}

// The kernel's filter matches the memory of the pid's main thread, which a
// main thread that has exited (others running on) no longer has: links made
// with it would never fire.
void ProbeAttacher::drop_filter_without_main_thread(int pid, std::vector<std::string>& notes) {
    if (pid_filter_ != pid || host::live_thread(pid) == pid) return;
    pid_filter_ = -1;
    notes.push_back("pid " + std::to_string(pid) +
                    ": its main thread has exited while other threads run on; the kernel's per-process probe "
                    "filter would miss them, so probes from now on are in every process that maps a probed file, "
                    "as without --no-follow");
}

Result<ScanResult> ProbeAttacher::scan_process(int pid, const ScanLimits& limits) {
    auto maps = host::read_maps(pid);
    if (!maps) return Result<ScanResult>::fail(maps.error());
    ScanResult out;
    drop_filter_without_main_thread(pid, out.notes);
    size_t examined = 0;  // new named files read, attached or not
    auto files = mapped_files(*maps, pid, [this](std::string_view path) { return looks_at(path); });
    for (const auto& f : files) {
        if (f.path.empty() || f.path[0] != '/') continue;
        auto key = std::make_pair(f.dev, f.inode);
        if (is_loader_path(f.path)) {
            if (!loader_elf_.count(key)) {
                auto r = attach_loader(f.open_path, f.dev, f.inode);
                if (!r) out.notes.push_back(r.error());
            }
            out.loader_state = loader_state(*maps, f, key);
            continue;
        }
        bool named = false;
        for (const auto& spec : specs_) named = named || spec.matches_library(f.path);
        if (named) out.libraries.push_back(f.path);
        if (!named || seen_.count(key)) continue;
        if (examined >= limits.max_new_files || (limits.cancel && *limits.cancel)) {
            ++out.files_over_limit;  // not seen: a later scan (another user's) may take it
            continue;
        }
        seen_.insert(key);
        ++examined;
        bool failed = false;  // an error, not a file without the spec's symbols
        // Read (and demangle) the file once for all the specs that name it.
        auto elf = host::ElfSymbols::open(f.open_path);
        std::vector<std::string> demangled;
        for (const auto& spec : specs_) {
            if (!spec.matches_library(f.path)) continue;
            if (!elf) {
                out.notes.push_back("spec " + spec.name + ": " + elf.error() + " — skipped");
                failed = true;
                continue;
            }
            auto plan = ProbeAttacher::plan(spec, *elf, symbols_, demangled);
            if (!note_plan(spec, f.path, plan, out.notes)) continue;
            AttachedFile af{spec.name, f.path, f.dev, f.inode, 0, 0};
            // Return probes first.  An exit whose entry was not seen finds no
            // in-flight state and is ignored; an entry whose return probe is
            // not there yet would leave its thread's in-flight stack one
            // deeper (a hot loop, attached to, filled it within ~1 ms and
            // then lost returns: errors, durations).  Detach goes the other
            // way round (links are destroyed last first).
            auto& links = file_links_[{f.dev, f.inode}];
            const size_t before = links.size();
            if (!plan.ret_offsets.empty()) {
                auto ret = attach_multi(bpf_.exit_program(), f, plan.ret_offsets, plan.ret_cookies, true, out.notes);
                if (ret) af.return_probes = ret.value();
                else out.notes.push_back("spec " + spec.name + ": return probes: " + ret.error());
            }
            auto entry = attach_multi(bpf_.enter_program(), f, plan.offsets, plan.cookies, false, out.notes);
            if (!entry) {
                out.notes.push_back("spec " + spec.name + ": " + entry.error());
                links.resize(before);  // its return probes too
                failed = true;
                continue;
            }
            af.entry_probes = entry.value();
            bpf_.mark_known_file(f.dev, f.inode);
            files_.push_back(std::move(af));
            ++out.new_files;
            if (out.attached_files.empty() || out.attached_files.back() != key) out.attached_files.push_back(key);
        }
        // A failed attach is tried again at the next scan, not given up for good.
        if (failed) seen_.erase(key);
    }
    return out;
}

void ProbeAttacher::destroy_last_first(std::vector<LinkPtr>& links) {
    while (!links.empty()) links.pop_back();
}

ProbeAttacher::~ProbeAttacher() {
    // Each link's release waits on the kernel's uprobe grace period (~50 ms
    // on a loaded VM here): one after another, a daemon holding a few
    // hundred files took 15 s to stop.  From several threads the waits
    // overlap; each file's links still go last first.
    std::vector<std::vector<LinkPtr>*> files;
    for (auto& [key, links] : file_links_) files.push_back(&links);
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next++) < files.size();) destroy_last_first(*files[i]);
    };
    std::vector<std::thread> threads;
    try {
        for (size_t t = 1; t < std::min<size_t>(kDetachThreads, files.size()); ++t) threads.emplace_back(work);
    } catch (const std::system_error&) {
        // fewer threads: this one does the rest
    }
    work();
    for (auto& t : threads) t.join();
}

Result<size_t> ProbeAttacher::attach_multi(bpf_program* prog, const host::MappedFile& f,
                                           std::vector<unsigned long> offsets, std::vector<__u64> cookies,
                                           bool retprobe, std::vector<std::string>& notes) {
    auto try_attach = [&](const unsigned long* offs, const __u64* cks, size_t n) -> bpf_link* {
        LIBBPF_OPTS(bpf_uprobe_multi_opts, o, .offsets = offs, .cookies = cks, .cnt = n, .retprobe = retprobe);
        return bpf_program__attach_uprobe_multi(prog, pid_filter_, f.open_path.c_str(), nullptr, &o);
    };
    auto& links = file_links_[{f.dev, f.inode}];
    if (bpf_link* l = try_attach(offsets.data(), cookies.data(), offsets.size())) {
        links.emplace_back(l);
        return offsets.size();
    }
    int err = errno;
    // One instruction the kernel cannot probe (a lock prefix, say) fails the
    // whole link: find the culprits one by one and attach the rest.
    std::vector<unsigned long> ok_offsets;
    std::vector<__u64> ok_cookies;
    for (size_t i = 0; i < offsets.size(); ++i) {
        if (bpf_link* l = try_attach(&offsets[i], &cookies[i], 1)) {
            bpf_link__destroy(l);
            ok_offsets.push_back(offsets[i]);
            ok_cookies.push_back(cookies[i]);
        } else {
            const SymbolInfo* s = symbols_.from_cookie(cookies[i]);
            notes.push_back(bpf_error_message(std::string(retprobe ? "return probe" : "probe") + " on " +
                                                  (s ? s->name : "?") + " in " + f.path,
                                              errno) +
                            " — that symbol is not traced");
        }
    }
    if (ok_offsets.empty()) return Result<size_t>::fail(bpf_error_message("attaching to " + f.path, err));
    bpf_link* l = try_attach(ok_offsets.data(), ok_cookies.data(), ok_offsets.size());
    if (!l) return Result<size_t>::fail(bpf_error_message("attaching to " + f.path, errno));
    links.emplace_back(l);
    return ok_offsets.size();
}

std::optional<uint64_t> ProbeAttacher::loader_state(const std::vector<host::MapEntry>& maps,
                                                    const host::MappedFile& f,
                                                    const std::pair<uint64_t, uint64_t>& key) {
    const LoaderElf& le = loader_elf(f.open_path, key);
    if (!le.elf) return std::nullopt;
    auto sym = le.elf->symbols.find("_r_debug");
    if (sym == le.elf->symbols.end()) return std::nullopt;  // musl: every stop is scanned
    auto bias = host::load_bias(maps, f.path, *le.elf);
    if (!bias) return std::nullopt;
    return *bias + sym->second + offsetof(struct r_debug, r_state);
}

const ProbeAttacher::LoaderElf& ProbeAttacher::loader_elf(const std::string& path,
                                                          const std::pair<uint64_t, uint64_t>& key) {
    auto it = loader_elf_.find(key);
    if (it != loader_elf_.end()) return it->second;
    LoaderElf le;
    auto elf = host::read_elf_data(path, std::set<std::string, std::less<>>{"_dl_debug_state", "_r_debug"});
    if (elf) le.elf = std::move(*elf);
    else le.error = elf.error();
    return loader_elf_.emplace(key, std::move(le)).first->second;
}

Result<bool> ProbeAttacher::attach_loader(const std::string& path, uint64_t dev, uint64_t inode) {
    const LoaderElf& le = loader_elf(path, {dev, inode});
    if (!le.elf) return Result<bool>::fail("loader " + path + ": " + le.error + " — libraries loaded later may be missed");
    auto sym = le.elf->symbols.find("_dl_debug_state");
    std::optional<uint64_t> offset;
    if (sym != le.elf->symbols.end()) offset = host::file_offset_of(*le.elf, sym->second);
    if (!offset)
        return Result<bool>::fail("loader " + path +
                                  ": no _dl_debug_state symbol — libraries loaded later may be missed");
    LIBBPF_OPTS(bpf_uprobe_opts, o);
    bpf_link* l = bpf_program__attach_uprobe_opts(bpf_.dl_program(), pid_filter_, path.c_str(), *offset, &o);
    if (!l) return Result<bool>::fail(bpf_error_message("loader probe on " + path, errno));
    links_.emplace_back(l);
    return true;
}

Result<bool> ProbeAttacher::attach_loader_for(const std::string& exe) {
    std::string interp = read_interp(exe);
    if (interp.empty()) interp = arch::kDefaultLoaderPath;
    struct stat st {};
    if (::stat(interp.c_str(), &st) != 0)
        return Result<bool>::fail("loader " + interp + ": " + std::strerror(errno));
    if (loader_elf_.count({st.st_dev, st.st_ino})) return true;
    return attach_loader(interp, st.st_dev, st.st_ino);
}

std::vector<AttachedFile> ProbeAttacher::detach_files(const std::function<bool(const AttachedFile&)>& unused) {
    std::vector<AttachedFile> gone;
    std::erase_if(files_, [&](const AttachedFile& f) {
        if (!unused(f)) return false;
        if (auto it = file_links_.find({f.dev, f.inode}); it != file_links_.end()) {
            destroy_last_first(it->second);
            file_links_.erase(it);
        }
        seen_.erase({f.dev, f.inode});
        gone.push_back(f);
        return true;
    });
    return gone;
}

}  // namespace commdbg::capture
