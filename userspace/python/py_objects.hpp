// SPDX-License-Identifier: Apache-2.0
// The live PyContextResolver: names the frames the kernel captured by reading
// the target's own objects (code objects, types, instance dicts) through
// host::RemoteMemory, per CPython version (3.10-3.13, x86-64, GIL builds).
// Every read is bounded and checked; a pointer that no longer holds what it
// held (a freed code object, a reused address) resolves to "<unknown>" or to
// what it holds now, re-validated, never to stale or garbage text.  What is
// cached is bounded in bytes (PyCacheBudget): a target of any shape cannot
// make the resolver (the root daemon) hold more.
// Not thread-safe: one caller (the record model's thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "limits.hpp"
#include "py_code_table.hpp"
#include "py_context.hpp"
#include "python_runtime.hpp"
#include "remote_memory.hpp"

namespace commdbg::python {

// Characters of a str read from a target (co_qualname, co_filename, labels,
// dict keys); longer strings are cut there.
inline constexpr size_t kPyMaxString = 512;
// Bytes of a module path ("encoder.blocks.1.mixer"); a longer one keeps its
// innermost names after a leading "…".
inline constexpr size_t kPyMaxModulePath = 4096;

// The bytes the caches of all resolvers sharing it hold together (atomic:
// commdbgd's sessions each run a resolver on their own thread).
class PyCacheBudget {
public:
    explicit PyCacheBudget(size_t total) : total_(total) {}
    // The one every resolver uses unless given another: limits::kPyCacheBytesTotal.
    static PyCacheBudget& program_wide();
    // Takes `n` bytes if they fit under the total.
    bool take(size_t n);
    void give(size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
    size_t used() const { return used_.load(std::memory_order_relaxed); }
    size_t total() const { return total_; }

private:
    size_t total_;
    std::atomic<size_t> used_{0};
};

// A process's share of the caches, and what the bound cost it.  The losses
// outlive forget() (a process that exited is reported after).
struct PyCacheStats {
    size_t bytes = 0;             // held now for the process (accounted: strings, tables, entries)
    uint64_t unnamed_frames = 0;  // frames left "<unknown>": their code object or entry found no room
    uint64_t unread_types = 0;    // types not kept: their objects read as unknown (a module's class)
    uint64_t dropped_labels = 0;  // record_function labels not kept (the frame is kept without)
    uint64_t evicted_trees = 0;   // module trees dropped for room (walked again when asked, within their rate)
    uint64_t cut_walks = 0;       // module tree walks stopped at the bound: modules past them are "<unknown>"
    bool lossy() const { return unnamed_frames + unread_types + dropped_labels + evicted_trees + cut_walks != 0; }
};

// What the model needs to know of a type.
struct PyTypeFacts {
    std::string name;        // ht_qualname for heap types ("Encoder.Block"), else tp_name ("int")
    bool heap = false;       // a class (Py_TPFLAGS_HEAPTYPE), not a static C type
    bool is_module = false;  // its MRO holds torch.nn.modules.module.Module
};

class LivePyResolver final : public PyContextResolver {
public:
    // `proc_root` as for discover_python (tests point it elsewhere).  Each
    // process's caches hold at most `per_process` bytes, all of them
    // together what `budget` allows: past either, new entries are refused
    // (module trees: the least recently used is evicted first) and counted.
    explicit LivePyResolver(std::string proc_root = "/proc", size_t per_process = limits::kPyCacheBytesPerProcess,
                            PyCacheBudget& budget = PyCacheBudget::program_wide());
    ~LivePyResolver() override;
    LivePyResolver(const LivePyResolver&) = delete;
    LivePyResolver& operator=(const LivePyResolver&) = delete;

    const PyFrameInfo& frame(uint32_t pid, const cd_py_frame& f) override;
    uint64_t stack(uint32_t pid, uint32_t tid, std::span<const cd_py_frame> raw,
                   std::vector<const PyFrameInfo*>& out) override;
    std::optional<std::string> module_path(uint32_t pid, uint64_t root, uint64_t module) override;
    void forget(uint32_t pid) override;
    // A new batch of records (one ring-buffer poll): code objects and classes
    // are re-validated against the target once per batch, not once per frame
    // (two system calls a frame made a deep stack cost more to name than to
    // capture).  A code object freed and its address reused within one batch
    // keeps its old name for the rest of that batch.  The code objects the
    // last batch named are re-validated here, together: one system call
    // per IOV_MAX of them.
    void begin_batch();
    // The kinds of the code objects named so far (py_code_table.hpp), for
    // each process whose table changed since the last call: the kernel then
    // reads `self`'s type only where a record can use it.
    void take_code_tables(const std::function<void(uint32_t pid, const cd_py_codes&)>& fn);

    // Hands over a discovery already made (the session discovers each
    // process once for the kernel's walker); otherwise the first use of a
    // pid runs discover_python.  Either way, a failure is kept, not retried.
    // adopt() drops what was cached for pid, as forget() does.
    void adopt(uint32_t pid, const PyDiscovery& d);
    // The same with the memory it is read from (the fuzz target's image;
    // otherwise host::ProcessMemory).
    void adopt(uint32_t pid, const PyDiscovery& d, std::unique_ptr<host::RemoteMemory> mem);
    const PyDiscovery& discovery(uint32_t pid);
    // Empty when types and instance attributes can be read; otherwise why
    // not (the frames still get their code objects' names).
    std::string object_layout_error(uint32_t pid);

    // The reads frame() and module_path() are made of.
    std::optional<PyTypeFacts> type(uint32_t pid, uint64_t type_ptr);
    // An instance attribute's object (the instance's dict or inline values,
    // not the class's): 0 when there is none or it cannot be read.
    uint64_t attr(uint32_t pid, uint64_t obj, std::string_view name);
    // CPython 3.11: the index of attribute `name` in the inline values of
    // the type's instances (split keys), which the kernel reads a
    // record_function's label from; nullopt elsewhere.
    std::optional<uint32_t> values_index(uint32_t pid, uint64_t type_ptr, std::string_view name);
    // A str object's text as UTF-8, at most kPyMaxString characters.
    std::optional<std::string> str(uint32_t pid, uint64_t obj);
    // The reads other layers make of a live object (torch/: a module's
    // parameters): its type (0: not a readable object); a dict's entries,
    // at most kMaxDictEntries (fn returns false to stop; false: not a dict);
    // a tuple's first `max` items; the value of an attribute its class keeps
    // in a __slots__ member (the member descriptor found through the MRO
    // and checked: 0 when there is none); an int that fits one digit; a bool.
    uint64_t type_of(uint32_t pid, uint64_t obj);
    bool dict_items(uint32_t pid, uint64_t dict, const std::function<bool(uint64_t key, uint64_t value)>& fn);
    std::optional<std::vector<uint64_t>> tuple_items(uint32_t pid, uint64_t tuple, size_t max);
    uint64_t slot(uint32_t pid, uint64_t obj, std::string_view name);
    std::optional<int64_t> small_int(uint32_t pid, uint64_t obj);
    std::optional<bool> truth(uint32_t pid, uint64_t obj);  // True or False; nullopt for anything else
    // A list's first `max` items; the object a bound method is bound to
    // (its __self__: 0 for anything but a method object).
    std::optional<std::vector<uint64_t>> list_items(uint32_t pid, uint64_t list, size_t max);
    uint64_t method_self(uint32_t pid, uint64_t method);

    // What pid's caches hold and what their bound cost it (zeros: never seen).
    PyCacheStats cache_stats(uint32_t pid) const;
    // A line for the process's report when the bound cost it names, else nullopt.
    std::optional<std::string> cache_note(uint32_t pid) const;
    // Forgets pid and its loss counts too (the session forgets the process).
    void drop_stats(uint32_t pid);
    size_t per_process_bytes() const { return per_process_; }

private:
    class Process;
    Process& process(uint32_t pid);
    std::string proc_root_;
    size_t per_process_;
    PyCacheBudget& budget_;
    uint64_t epoch_ = 1;
    std::unordered_map<uint32_t, PyCacheStats> stats_;  // node-stable: each Process counts into its own
    std::unordered_map<uint32_t, std::unique_ptr<Process>> procs_;
};

// The line of the instruction at byte `offset` of a code object's bytecode,
// from its co_linetable (the 3.10 format when minor == 10, else 3.11+'s):
// firstlineno when offset < 0 or the table gives no line for it.
uint32_t py_line_of(int minor, std::string_view linetable, uint32_t firstlineno, int64_t offset);

}  // namespace commdbg::python
