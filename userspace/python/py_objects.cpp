// SPDX-License-Identifier: Apache-2.0
// The resolver: a Process per pid, their byte accounting and the check of a
// target's object layout; the readers are in py_object_reads.cpp,
// py_frames.cpp and py_module_tree.cpp.
#include "py_objects.hpp"

#include "py_layouts.hpp"
#include "py_process.hpp"

namespace commdbg::python {
namespace pyobj {

ObjLayout obj_layout(int minor) {
    switch (minor) {
    case 10: return {888, 864, 872, 120, 0, 0};
    case 11: return {904, 864, 872, 136, 184, 0};
    case 12: return {920, 872, 880, 136, 192, 0};
    default: return {928, 872, 880, 136, 200, 8};
    }
}

namespace {

// PyMemberDef tables: name -> offset.
std::map<std::string, int64_t> members_of(host::RemoteMemory& mem, uint64_t type) {
    std::map<std::string, int64_t> found;
    uint64_t members = 0;
    if (!mem.get(type + kTpMembers, members)) return found;
    for (int i = 0; i < 64; ++i) {
        discovery::MemberDef m{};
        if (!mem.get(members + sizeof m * static_cast<uint64_t>(i), m) || m.name == 0) break;
        std::string name;
        if (mem.c_string(m.name, name, 64)) found[name] = m.offset;
    }
    return found;
}

}  // namespace

Result<bool> check_object_layout(host::RemoteMemory& mem, const PyLayout& l, const ObjLayout& o, uint64_t type_type) {
    using R = Result<bool>;
    int64_t size = 0;
    if (!mem.get(type_type + kTpBasicsize, size)) return R::fail("cannot read PyType_Type");
    if (size != o.heap_type_size)
        return R::fail("heap types are " + std::to_string(size) + " bytes, the verified table says " +
                       std::to_string(o.heap_type_size));
    const std::map<std::string, int64_t> want = {{"__basicsize__", kTpBasicsize}, {"__itemsize__", kTpItemsize},
                                                 {"__flags__", l.tp_flags},       {"__base__", kTpBase},
                                                 {"__dictoffset__", kTpDictoffset}, {"__mro__", kTpMro}};
    auto got = members_of(mem, type_type);
    for (const auto& [name, off] : want) {
        auto it = got.find(name);
        // 3.12+ serve __mro__ by a getter (static types keep theirs elsewhere): heap types' tp_mro stays.
        if (it == got.end() && name == "__mro__" && l.minor >= 12) continue;
        if (it == got.end() || it->second != off) return R::fail("type." + name + " is not at " + std::to_string(off));
    }
    auto code = members_of(mem, l.code_type_addr);
    if (auto it = code.find("co_linetable"); it == code.end() || it->second != o.code_linetable)
        return R::fail("co_linetable is not at " + std::to_string(o.code_linetable));
    if (o.code_adaptive != 0) {
        if (!mem.get(l.code_type_addr + kTpBasicsize, size) || size != o.code_adaptive)
            return R::fail("co_code_adaptive is not at " + std::to_string(o.code_adaptive));
    }
    return true;
}

}  // namespace pyobj

using namespace pyobj;

LivePyResolver::Process::Process(PyDiscovery d, std::unique_ptr<host::RemoteMemory> mem, Account account)
    : d_(std::move(d)), mem_(std::move(mem)), account_(account) {
    if (!d_.ok()) return;
    o_ = obj_layout(d_.layout.minor);
    if (!mem_->get(d_.layout.code_type_addr + d_.layout.ob_type, type_type_) || !arch::is_user_address(type_type_)) {
        layout_error_ = "cannot read PyCode_Type's type";
        type_type_ = 0;
        return;
    }
    if (auto ok = check_object_layout(*mem_, d_.layout, o_, type_type_); !ok) layout_error_ = ok.error();
}

bool LivePyResolver::Process::charge(size_t n) {
    if (bytes_ + n > account_.per_process || !account_.budget->take(n)) return false;
    bytes_ += n;
    return true;
}

void LivePyResolver::Process::release(size_t n) {
    bytes_ -= n;
    account_.budget->give(n);
}

// ---- the resolver -----------------------------------------------------------

PyCacheBudget& PyCacheBudget::program_wide() {
    static PyCacheBudget budget(limits::kPyCacheBytesTotal);
    return budget;
}

bool PyCacheBudget::take(size_t n) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
        if (n > total_ || used > total_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
}

LivePyResolver::LivePyResolver(std::string proc_root, size_t per_process, PyCacheBudget& budget)
    : proc_root_(std::move(proc_root)), per_process_(per_process), budget_(budget) {}
LivePyResolver::~LivePyResolver() = default;

LivePyResolver::Process& LivePyResolver::process(uint32_t pid) {
    auto it = procs_.find(pid);
    if (it == procs_.end())
        adopt(pid, discover_python(static_cast<int>(pid), proc_root_)), it = procs_.find(pid);
    return *it->second;
}

void LivePyResolver::adopt(uint32_t pid, const PyDiscovery& d) {
    adopt(pid, d, std::make_unique<host::ProcessMemory>(static_cast<int>(pid)));
}

void LivePyResolver::adopt(uint32_t pid, const PyDiscovery& d, std::unique_ptr<host::RemoteMemory> mem) {
    procs_.erase(pid);  // its bytes go back before the new one takes any
    procs_[pid] = std::make_unique<Process>(d, std::move(mem), Process::Account{per_process_, &budget_, &stats_[pid]});
}

PyCacheStats LivePyResolver::cache_stats(uint32_t pid) const {
    auto it = stats_.find(pid);
    PyCacheStats s = it != stats_.end() ? it->second : PyCacheStats{};
    auto p = procs_.find(pid);
    s.bytes = p != procs_.end() ? p->second->bytes() : 0;
    return s;
}

std::optional<std::string> LivePyResolver::cache_note(uint32_t pid) const {
    const PyCacheStats s = cache_stats(pid);
    if (!s.lossy()) return std::nullopt;
    std::string what;
    auto add = [&](uint64_t n, const char* text) {
        if (n != 0) what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + text;
    };
    add(s.unnamed_frames, "frames left <unknown>");
    add(s.unread_types, "types not read (their modules unnamed)");
    add(s.dropped_labels, "record_function labels dropped");
    add(s.evicted_trees, "module trees evicted and walked again");
    add(s.cut_walks, "module tree walks cut short (modules past them are <unknown>)");
    auto size = [](size_t n) { return n >= (1u << 20) ? std::to_string(n >> 20) + " MiB" : std::to_string(n >> 10) + " KiB"; };
    return "Python names of pid " + std::to_string(pid) + " reached the resolver's memory bound (" + size(per_process_) +
           " per process, " + size(budget_.total()) + " in all): " + what;
}

void LivePyResolver::drop_stats(uint32_t pid) {
    procs_.erase(pid);  // first: it counts into its entry
    stats_.erase(pid);
}

const PyDiscovery& LivePyResolver::discovery(uint32_t pid) { return process(pid).discovery(); }

std::string LivePyResolver::object_layout_error(uint32_t pid) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.layout_error() : p.discovery().reason;
}

std::optional<uint32_t> LivePyResolver::values_index(uint32_t pid, uint64_t type_ptr, std::string_view name) {
    return process(pid).values_index(type_ptr, name);
}

const PyFrameInfo& LivePyResolver::frame(uint32_t pid, const cd_py_frame& f) {
    Process& p = process(pid);
    p.set_epoch(epoch_);
    return p.frame(f);
}

uint64_t LivePyResolver::stack(uint32_t pid, uint32_t tid, std::span<const cd_py_frame> raw,
                               std::vector<const PyFrameInfo*>& out) {
    Process& p = process(pid);
    p.set_epoch(epoch_);
    return p.stack(tid, raw, out);
}

std::optional<std::string> LivePyResolver::module_path(uint32_t pid, uint64_t root, uint64_t module) {
    return process(pid).module_path(root, module);
}

void LivePyResolver::forget(uint32_t pid) { procs_.erase(pid); }

void LivePyResolver::begin_batch() {
    ++epoch_;
    for (auto& [pid, p] : procs_) p->revalidate_used(epoch_);
}

void LivePyResolver::take_code_tables(const std::function<void(uint32_t, const cd_py_codes&)>& fn) {
    for (auto& [pid, p] : procs_)
        if (p->code_table().take_changed()) fn(pid, p->code_table().slots());
}

std::optional<PyTypeFacts> LivePyResolver::type(uint32_t pid, uint64_t type_ptr) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.type_facts(type_ptr) : std::nullopt;
}

uint64_t LivePyResolver::attr(uint32_t pid, uint64_t obj, std::string_view name) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.attr(obj, name) : 0;
}

std::optional<std::string> LivePyResolver::str(uint32_t pid, uint64_t obj) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.str(obj) : std::nullopt;
}

uint64_t LivePyResolver::type_of(uint32_t pid, uint64_t obj) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.type_of(obj) : 0;
}

bool LivePyResolver::dict_items(uint32_t pid, uint64_t dict, const std::function<bool(uint64_t, uint64_t)>& fn) {
    Process& p = process(pid);
    return p.discovery().ok() && p.items_of(dict, fn);
}

std::optional<std::vector<uint64_t>> LivePyResolver::tuple_items(uint32_t pid, uint64_t tuple, size_t max) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.tuple_of(tuple, max) : std::nullopt;
}

uint64_t LivePyResolver::slot(uint32_t pid, uint64_t obj, std::string_view name) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.slot(obj, name) : 0;
}

std::optional<int64_t> LivePyResolver::small_int(uint32_t pid, uint64_t obj) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.small_int(obj) : std::nullopt;
}

std::optional<bool> LivePyResolver::truth(uint32_t pid, uint64_t obj) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.truth(obj) : std::nullopt;
}

std::optional<std::vector<uint64_t>> LivePyResolver::list_items(uint32_t pid, uint64_t list, size_t max) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.list_items(list, max) : std::nullopt;
}

uint64_t LivePyResolver::method_self(uint32_t pid, uint64_t method) {
    Process& p = process(pid);
    return p.discovery().ok() ? p.method_self(method) : 0;
}

}  // namespace commdbg::python
