// SPDX-License-Identifier: Apache-2.0
// Resolves probe specs against the library files a process maps and attaches
// one uprobe_multi link per (spec, file), deduplicated by device+inode, plus
// the loader probe that tells us when new libraries appear.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bpf_session.hpp"
#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "probe_spec.hpp"
#include "result.hpp"
#include "symbol_table.hpp"

namespace commdbg::capture {

struct AttachedFile {
    std::string spec;
    std::string path;  // as the process maps it
    uint64_t dev = 0;
    uint64_t inode = 0;
    size_t entry_probes = 0;
    size_t return_probes = 0;
};

struct ScanResult {
    size_t new_files = 0;               // (spec, file) pairs attached by this scan
    std::vector<std::pair<uint64_t, uint64_t>> attached_files;  // (dev, inode) of the files attached
    size_t files_over_limit = 0;        // new named files left alone: ScanLimits::max_new_files reached
    std::vector<std::string> libraries; // files the process maps that a spec names
    std::vector<std::string> notes;     // skipped symbols, unreadable files, ...
    // Where the process's dynamic loader keeps `_r_debug.r_state` (glibc's
    // <link.h>: RT_ADD while an object is being mapped, RT_CONSISTENT once
    // done); none when its loader exports no `_r_debug`.
    std::optional<uint64_t> loader_state;
};

// What one scan may attach: at most max_new_files new library files (the
// rest are left for a later scan, counted in files_over_limit), and none
// more once *cancel is set (a daemon shutting down).
struct ScanLimits {
    size_t max_new_files = SIZE_MAX;  // new named files read (attached or not)
    const std::atomic<bool>* cancel = nullptr;
};

class ProbeAttacher {
public:
    ProbeAttacher(BpfSession& bpf, SymbolTable& symbols, std::vector<ProbeSpec> specs)
        : bpf_(bpf), symbols_(symbols), specs_(std::move(specs)) {}
    ~ProbeAttacher();  // entry links before the return links attached before them
    ProbeAttacher(const ProbeAttacher&) = delete;
    ProbeAttacher& operator=(const ProbeAttacher&) = delete;

    // Attaches to every library file `pid` maps that a spec names and that is
    // not attached yet, and to its dynamic loader.  Fails only when the
    // process cannot be read at all (gone, permission).
    Result<ScanResult> scan_process(int pid, const ScanLimits& limits = {});

    // Loader probe on the interpreter `exe` will run under, before it runs.
    Result<bool> attach_loader_for(const std::string& exe);

    const std::vector<AttachedFile>& files() const { return files_; }
    // Detaches every spec from the files `unused` picks (say, deleted and
    // mapped by nobody): a node where each job brings its own NCCL must not
    // accumulate links.  Returns what was detached.
    std::vector<AttachedFile> detach_files(const std::function<bool(const AttachedFile&)>& unused);
    const std::vector<ProbeSpec>& specs() const { return specs_; }
    // Links made from now on fire in process `pid` only (-1: every process
    // that maps the file): the kernel puts the breakpoints in that process's
    // memory alone, so a bystander mapping the same file pays no trap.
    void only_in_process(int pid) { pid_filter_ = pid; }
    bool in_one_process() const { return pid_filter_ >= 0; }

    // Offsets + cookies for one spec on one file, without attaching (tests, bench).
    struct Plan {
        std::vector<unsigned long> offsets;
        std::vector<__u64> cookies;
        std::vector<unsigned long> ret_offsets;
        std::vector<__u64> ret_cookies;
        std::vector<std::string> missing;  // exact names not in the file
        std::vector<std::string> notes;    // what derivations said of the probes they placed
        size_t skipped = 0;                // symbols found that the spec's `skip` left out
        size_t elsewhere = 0;              // rules whose probes another file of the spec holds
    };
    static Result<Plan> plan(const ProbeSpec& spec, const std::string& file, SymbolTable& symbols);
    // The same on a file already read; `demangled` (one slot per function,
    // filled on demand) lets several specs on one file demangle it once.
    static Plan plan(const ProbeSpec& spec, const host::ElfSymbols& elf, SymbolTable& symbols,
                     std::vector<std::string>& demangled);

private:
    Result<size_t> attach_multi(bpf_program* prog, const host::MappedFile& f, std::vector<unsigned long> offsets,
                                std::vector<__u64> cookies, bool retprobe, std::vector<std::string>& notes);
    Result<bool> attach_loader(const std::string& path, uint64_t dev, uint64_t inode);
    void drop_filter_without_main_thread(int pid, std::vector<std::string>& notes);
    bool looks_at(std::string_view path) const;
    std::optional<uint64_t> loader_state(const std::vector<host::MapEntry>& maps, const host::MappedFile& f,
                                         const std::pair<uint64_t, uint64_t>& key);
    // A loader file's headers and its two symbols, read once per file; the
    // entry also says the file's probe was tried (attach_loader reads first).
    struct LoaderElf {
        std::optional<host::ElfData> elf;
        std::string error;  // why elf is not there
    };
    const LoaderElf& loader_elf(const std::string& path, const std::pair<uint64_t, uint64_t>& key);
    static void destroy_last_first(std::vector<LinkPtr>& links);

    BpfSession& bpf_;
    SymbolTable& symbols_;
    std::vector<ProbeSpec> specs_;
    int pid_filter_ = -1;  // only_in_process
    std::set<std::pair<uint64_t, uint64_t>> seen_;         // files looked at (dev, inode)
    // Per loader file probed (or tried: attach_loader), read once: its
    // PT_LOADs and the link-time addresses of `_dl_debug_state` (the probe)
    // and `_r_debug` (a stop's r_state).
    std::map<std::pair<uint64_t, uint64_t>, LoaderElf> loader_elf_;
    std::vector<AttachedFile> files_;
    std::vector<LinkPtr> links_;  // loader probes
    std::map<std::pair<uint64_t, uint64_t>, std::vector<LinkPtr>> file_links_;  // per library file
};

}  // namespace commdbg::capture
