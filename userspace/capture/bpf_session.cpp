// SPDX-License-Identifier: Apache-2.0
#include "bpf_session.hpp"

#include <sys/epoll.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "commdbg_bpf.skel.h"

namespace commdbg::capture {

static_assert(sizeof(cd_coarse_slot) == 8 + sizeof(cd_count_val));
static_assert(sizeof(cd_proc_counts) == 32 + CD_COARSE_SLOTS * sizeof(cd_coarse_slot));

void LinkDeleter::operator()(bpf_link* l) const {
    if (l) bpf_link__destroy(l);
}

const char* drop_cause_name(uint32_t cause) {
    switch (cause) {
    case CD_DROP_RINGBUF_FULL: return "ringbuf_full";
    case CD_DROP_COUNTER_FULL: return "counter_map_full";
    case CD_DROP_INFLIGHT_DEEP: return "inflight_too_deep";
    case CD_DROP_COMM_FULL: return "comm_map_full";
    case CD_DROP_DL_EVENT: return "loader_event_lost";
    case CD_DROP_READ_FAULT: return "user_read_fault";
    case CD_DROP_EXIT_LOST: return "return_record_lost";
    case CD_DROP_PROC_EVENT: return "process_event_lost";
    case CD_DROP_COUNTER_SHARE: return "counter_keys_per_process";
    case CD_DROP_UNCOUNTED: return "call_not_counted";
    case CD_DROP_PY_CONTEXT: return "py_context_lost";
    case CD_DROP_FILE_SHARE: return "file_share_per_uid";
    case CD_DROP_FLIGHT_FULL: return "flight_recorder_full";
    case CD_DROP_STOP_REFUSED: return "stop_refused";
    default: return "unknown";
    }
}

std::string bpf_error_message(const std::string& what, int err) {
    err = err < 0 ? -err : err;
    constexpr int kENOTSUPP = 524;  // kernel-internal, no strerror text
    if (err == kENOTSUPP) return what + ": the kernel cannot place a uprobe on that instruction";
    std::string msg = what + ": " + std::strerror(err);
    if ((err == EACCES || err == EINVAL) && geteuid() == 0 && what.find("loading") != std::string::npos)
        msg += " — the kernel's verifier rejected a BPF program (COMMDBG_DEBUG_LIBBPF=1 shows its log); please report it";
    else if (err == EPERM || err == EACCES)
        msg += " — run as root (commdbg needs CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN to load and attach probes)";
    else if (err == ENOSYS || err == EOPNOTSUPP)
        msg += " — this kernel lacks a BPF feature commdbg needs (uprobe_multi links: Linux >= 6.6, BTF)";
    return msg;
}

namespace {

int quiet_print(enum libbpf_print_level level, const char* fmt, va_list args) {
    // libbpf's own chatter only with COMMDBG_DEBUG_LIBBPF=1; our errors carry the message.
    static const bool verbose = getenv("COMMDBG_DEBUG_LIBBPF") != nullptr;
    if (!verbose && level != LIBBPF_WARN) return 0;
    if (!verbose) return 0;
    return vfprintf(stderr, fmt, args);
}

// Call records wake the consumer once the ring buffer is this fraction full
// (bpf/lib/config.h, wakeup_bytes): room for 7/8 more while it wakes.
constexpr size_t kWakeupFraction = 8;

size_t round_ringbuf(size_t bytes) {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t n = page;
    while (n < bytes) n <<= 1;
    return n;
}

}  // namespace

Result<std::unique_ptr<BpfSession>> BpfSession::open(const BpfOptions& opts) {
    using R = Result<std::unique_ptr<BpfSession>>;
    libbpf_set_print(quiet_print);
    std::unique_ptr<BpfSession> s(new BpfSession());
    s->skel_ = commdbg_bpf__open();
    if (!s->skel_) return R::fail(bpf_error_message("commdbg: opening the BPF object", errno));
    s->ringbuf_bytes_ = round_ringbuf(opts.ringbuf_bytes);
    bpf_map__set_max_entries(s->skel_->maps.events, s->ringbuf_bytes_);
    s->skel_->rodata->count_all = opts.count_all ? 1 : 0;
    s->skel_->rodata->count_all_flags = CD_TRACE_COUNT | (opts.flight_recorder ? CD_TRACE_FLIGHT : 0u);
    s->skel_->rodata->scope_cgroup = opts.scope_cgroup_fd >= 0 ? 1 : 0;
    s->skel_->rodata->fine_keys_per_process = opts.counter_keys_per_process;
    s->skel_->rodata->wakeup_bytes = s->ringbuf_bytes_ / kWakeupFraction;
    if (opts.run_stats) s->stats_fd_ = bpf_enable_stats(BPF_STATS_RUN_TIME);
    s->skel_->rodata->test_failed_stops = opts.test_failed_stops;
    s->skel_->rodata->batch_records = opts.batch_records ? 1 : 0;
    s->batch_records_ = opts.batch_records;
    s->flush_at_switch_ = opts.flush_at_switch;
    bpf_program__set_autoload(s->skel_->progs.on_switch, opts.batch_records && opts.flush_at_switch);
    if (!opts.file_prefixes.empty()) {
        if (opts.file_prefixes.size() > CD_FILE_PREFIXES)
            return R::fail("commdbg: " + std::to_string(opts.file_prefixes.size()) +
                           " library names to watch for; the kernel side has room for " +
                           std::to_string(CD_FILE_PREFIXES));
        for (size_t i = 0; i < CD_FILE_PREFIXES; ++i) {
            const std::string p = i < opts.file_prefixes.size() ? opts.file_prefixes[i] : "";
            if (p.size() > CD_FILE_PREFIX_MAX)
                return R::fail("commdbg: library name \"" + p + "\" is longer than the kernel side's " +
                               std::to_string(CD_FILE_PREFIX_MAX) + " characters");
            for (size_t j = 0; j < CD_FILE_PREFIX_MAX; ++j)
                s->skel_->rodata->file_prefix[i][j] = j < p.size() ? p[j] : '\0';
            s->skel_->rodata->file_prefix_len[i] = static_cast<uint32_t>(p.size());
        }
    }
    bpf_program__set_autoload(s->skel_->progs.on_mmap_file, opts.count_all);
    // An exec's new loader: a session's business (commdbgd follows mmap).
    bpf_program__set_autoload(s->skel_->progs.on_exec, !opts.count_all);
    // Attached per library later, never by the skeleton.
    bpf_program__set_autoattach(s->skel_->progs.call_enter, false);
    bpf_program__set_autoattach(s->skel_->progs.call_exit, false);
    bpf_program__set_autoattach(s->skel_->progs.dl_debug_state, false);
    if (int err = commdbg_bpf__load(s->skel_))
        return R::fail(bpf_error_message("commdbg: loading the BPF programs", err));
    if (opts.scope_cgroup_fd >= 0) {
        uint32_t zero = 0;
        uint32_t fd = static_cast<uint32_t>(opts.scope_cgroup_fd);
        if (bpf_map__update_elem(s->skel_->maps.scope, &zero, sizeof(zero), &fd, sizeof(fd), BPF_ANY))
            return R::fail(bpf_error_message("commdbg: setting the scope cgroup", errno));
    }
    std::vector<bpf_program*> tracepoints = {s->skel_->progs.on_fork, s->skel_->progs.on_exit};
    tracepoints.push_back(opts.count_all ? s->skel_->progs.on_mmap_file : s->skel_->progs.on_exec);
    for (bpf_program* p : tracepoints) {
        bpf_link* l = bpf_program__attach(p);
        if (!l)
            return R::fail(bpf_error_message(std::string("commdbg: attaching ") + bpf_program__name(p), errno));
        if (p == s->skel_->progs.on_mmap_file) s->mmap_hook_.reset(l);
        else s->tracepoints_.emplace_back(l);
    }
    s->rb_ = ring_buffer__new(bpf_map__fd(s->skel_->maps.events), &BpfSession::on_ring_record, s.get(), nullptr);
    if (!s->rb_) return R::fail(bpf_error_message("commdbg: opening the ring buffer", errno));
    return R(std::move(s));
}

BpfSession::~BpfSession() {
    if (stats_fd_ >= 0) close(stats_fd_);
    if (rb_) ring_buffer__free(rb_);
    mmap_hook_.reset();  // first: nothing is stopped once the rest goes
    tracepoints_.clear();
    if (skel_) commdbg_bpf__destroy(skel_);
}

int BpfSession::on_ring_record(void* ctx, void* data, size_t size) noexcept {
    // Called from libbpf's C frames: nothing may unwind through them.  The
    // session's and the daemon's handlers are noexcept and count what they
    // cannot handle; any other handler (a benchmark's) loses the record.
    auto* self = static_cast<BpfSession*>(ctx);
    std::span<const uint8_t> bytes(static_cast<const uint8_t*>(data), size);
    try {
        if (!self->handler_) return 0;
        // A thread's batch (bpf/lib/batch.h): its call records one by one.
        cd_header h;
        if (size >= sizeof(h)) std::memcpy(&h, data, sizeof(h));
        if (size < sizeof(h) || h.kind != CD_EV_BATCH) {
            self->handler_(bytes);
            return 0;
        }
        for (size_t at = sizeof(h); at + sizeof(cd_call) <= size && at + sizeof(cd_call) <= h.size;
             at += sizeof(cd_call))
            self->handler_(bytes.subspan(at, sizeof(cd_call)));
    } catch (...) {
    }
    return 0;
}

int BpfSession::poll(int timeout_ms, const std::function<void()>& woken) {
    // A wait that timed out still reads what is there: records below the
    // wake-up watermark never end it early.
    epoll_event ev[4];
    if (epoll_wait(ring_buffer__epoll_fd(rb_), ev, 4, timeout_ms) < 0) return -errno;
    if (woken) woken();
    return ring_buffer__consume(rb_);
}

Result<bool> BpfSession::start_batching() {
    if (!batch_records_ || batching_) return batching_;
    if (flush_at_switch_) {
        bpf_link* l = bpf_program__attach(skel_->progs.on_switch);
        if (!l) {
            batch_records_ = false;  // not again
            return Result<bool>::fail(bpf_error_message("commdbg: attaching on_switch (records are sent one by one)",
                                                        errno));
        }
        tracepoints_.emplace_back(l);
    }
    __atomic_store_n(&skel_->bss->batching, 1u, __ATOMIC_SEQ_CST);
    batching_ = true;
    return true;
}

void BpfSession::set_armed(bool on) {
    // The programs read it on their next call: one store opens or closes the
    // window for every attached symbol at once.
    __atomic_store_n(&skel_->bss->armed, on ? 1u : 0u, __ATOMIC_SEQ_CST);
}

void BpfSession::traced_changed() {
    // After the map's change: threads that cached their process's flags
    // read them again (bpf/lib/process.h, traced_gen).
    __atomic_add_fetch(&skel_->data->traced_gen, 1u, __ATOMIC_SEQ_CST);
}

bool BpfSession::armed() const { return __atomic_load_n(&skel_->bss->armed, __ATOMIC_SEQ_CST) != 0; }

Result<bool> BpfSession::trace_process(uint32_t tgid, uint32_t flags) {
    if (bpf_map__update_elem(skel_->maps.traced, &tgid, sizeof(tgid), &flags, sizeof(flags), BPF_ANY))
        return Result<bool>::fail(bpf_error_message("commdbg: adding pid " + std::to_string(tgid) + " to the trace filter", errno));
    traced_changed();
    // Its own counters, where no other process can take their room; kept if
    // it has them already (the kernel may have been first).
    static const cd_proc_counts zero{};
    bpf_map__update_elem(skel_->maps.proc_counts, &tgid, sizeof(tgid), &zero, sizeof(zero), BPF_NOEXIST);
    return true;
}

void BpfSession::untrace_process(uint32_t tgid) {
    bpf_map__delete_elem(skel_->maps.traced, &tgid, sizeof(tgid), 0);
    traced_changed();
}

Result<bool> BpfSession::set_python(uint32_t tgid, const cd_py_cfg& cfg) {
    if (bpf_map__update_elem(skel_->maps.py_procs, &tgid, sizeof(tgid), &cfg, sizeof(cfg), BPF_ANY))
        return Result<bool>::fail(bpf_error_message("commdbg: enabling Python stacks for pid " + std::to_string(tgid), errno));
    // Then the trace flag that makes the kernel look (the map first: a flag
    // without a config would only cost a failed lookup).
    uint32_t flags = 0;
    if (bpf_map__lookup_elem(skel_->maps.traced, &tgid, sizeof(tgid), &flags, sizeof(flags), 0) == 0 &&
        !(flags & CD_TRACE_PYTHON)) {
        flags |= CD_TRACE_PYTHON;
        bpf_map__update_elem(skel_->maps.traced, &tgid, sizeof(tgid), &flags, sizeof(flags), BPF_EXIST);
        traced_changed();
    }
    return true;
}

Result<bool> BpfSession::set_torch(uint32_t tgid, const cd_torch_cfg& cfg) {
    if (bpf_map__update_elem(skel_->maps.torch_procs, &tgid, sizeof(tgid), &cfg, sizeof(cfg), BPF_ANY))
        return Result<bool>::fail(bpf_error_message("commdbg: enabling tensor shapes for pid " + std::to_string(tgid), errno));
    return true;
}

void BpfSession::clear_torch(uint32_t tgid) {
    bpf_map__delete_elem(skel_->maps.torch_procs, &tgid, sizeof(tgid), 0);
}

void BpfSession::clear_python(uint32_t tgid) {
    bpf_map__delete_elem(skel_->maps.py_procs, &tgid, sizeof(tgid), 0);
    set_py_codes(tgid, nullptr);
}

void BpfSession::set_py_codes(uint32_t tgid, const cd_py_codes* codes) {
    if (codes == nullptr)
        bpf_map__delete_elem(skel_->maps.py_codes, &tgid, sizeof(tgid), 0);
    else
        bpf_map__update_elem(skel_->maps.py_codes, &tgid, sizeof(tgid), codes, sizeof(*codes), BPF_ANY);
}

bool BpfSession::scope_open(uint32_t tgid, uint64_t self) const {
    cd_scope_key k{tgid, 0, self};
    uint64_t ts = 0;
    return bpf_map__lookup_elem(skel_->maps.open_scopes, &k, sizeof(k), &ts, sizeof(ts), 0) == 0;
}

bool BpfSession::is_traced(uint32_t tgid) const {
    uint32_t flags = 0;
    return bpf_map__lookup_elem(skel_->maps.traced, &tgid, sizeof(tgid), &flags, sizeof(flags), 0) == 0;
}

namespace {

template <typename K, typename V>
std::vector<std::pair<K, V>> dump_map(const bpf_map* map) {
    std::vector<std::pair<K, V>> out;
    K key{}, next{};
    const K* prev = nullptr;
    while (bpf_map__get_next_key(map, prev, &next, sizeof(K)) == 0) {
        V val{};
        if (bpf_map__lookup_elem(map, &next, sizeof(K), &val, sizeof(V), 0) == 0) out.emplace_back(next, val);
        key = next;
        prev = &key;
    }
    return out;
}

}  // namespace

CounterSnapshot BpfSession::counter_snapshot() const {
    CounterSnapshot out;
    for (auto& [k, v] : dump_map<cd_count_key, cd_count_val>(skel_->maps.counters)) out.entries.push_back({k, v, false});
    for (auto& [tgid, pc] : dump_map<uint32_t, cd_proc_counts>(skel_->maps.proc_counts)) {
        out.loss[tgid] = {pc.fine_keys, pc.breakdown_lost, pc.uncounted};
        for (const cd_coarse_slot& s : pc.coarse) {
            if (s.sym_plus1 == 0 || s.val.calls == 0) continue;
            cd_count_key k{};
            k.tgid = tgid;
            k.sym = s.sym_plus1 - 1;
            k.dtype = CD_DTYPE_NONE;
            out.entries.push_back({k, s.val, true});
        }
    }
    return out;
}

void BpfSession::each_thread(const std::function<void(uint32_t tid, const cd_thread&)>& fn) const {
    uint32_t key = 0, next = 0;
    const uint32_t* prev = nullptr;
    auto st = std::make_unique<cd_thread>();  // ~3 KiB: not on the stack
    while (bpf_map__get_next_key(skel_->maps.threads, prev, &next, sizeof(next)) == 0) {
        key = next;
        prev = &key;
        if (bpf_map__lookup_elem(skel_->maps.threads, &key, sizeof(key), st.get(), sizeof(*st), 0) == 0) fn(key, *st);
    }
}

std::vector<CallEnter> BpfSession::open_calls() const {
    std::vector<CallEnter> out;
    each_thread([&](uint32_t tid, const cd_thread& st) {
        for (uint32_t i = 0; i < st.depth && i < CD_MAX_INFLIGHT; ++i) {
            const cd_inflight& s = st.inflight[i];
            if (!(s.flags & CD_TRACE_RECORDS) || s.entry_sent) continue;  // sent: the model has it
            call_entry_fields(s, s.ckey.tgid, tid, s.ts, out.emplace_back());
        }
    });
    std::sort(out.begin(), out.end(), [](const CallEnter& a, const CallEnter& b) { return a.ts_ns < b.ts_ns; });
    return out;
}

std::vector<cd_call> BpfSession::pending_batches() const {
    std::vector<cd_call> out;
    each_thread([&](uint32_t, const cd_thread& st) {
        // [0, n) are whole: n grows after a record is written.
        for (uint32_t i = 0; i < st.batch.n && i < CD_BATCH; ++i) out.push_back(st.batch.calls[i]);
    });
    return out;
}

std::vector<CommEntry> BpfSession::comms() const {
    std::vector<CommEntry> out;
    for (auto& [k, v] : dump_map<cd_comm_key, cd_comm_val>(skel_->maps.comms)) out.push_back({k, v});
    return out;
}

uint64_t BpfSession::drops_of(uint32_t cause) const {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0 || cause >= CD_DROP_MAX) return 0;
    std::vector<uint64_t> per_cpu(static_cast<size_t>(ncpu));
    if (bpf_map__lookup_elem(skel_->maps.drops, &cause, sizeof(cause), per_cpu.data(), per_cpu.size() * sizeof(uint64_t),
                             0))
        return 0;
    uint64_t n = 0;
    for (uint64_t v : per_cpu) n += v;
    return n;
}

std::array<uint64_t, CD_DROP_MAX> BpfSession::drops() const {
    std::array<uint64_t, CD_DROP_MAX> out{};
    for (uint32_t i = 0; i < CD_DROP_MAX; ++i) out[i] = drops_of(i);
    return out;
}

namespace {
struct FileKey {
    uint64_t dev, ino;
};
// The kernel's dev_t packs major:minor as 12:20 bits, not glibc's layout.
FileKey kernel_file_key(uint64_t st_dev, uint64_t inode) {
    return {(static_cast<uint64_t>(major(st_dev)) << 20) | minor(st_dev), inode};
}
}  // namespace

bool BpfSession::mark_known_file(uint64_t st_dev, uint64_t inode) {
    FileKey k = kernel_file_key(st_dev, inode);
    uint32_t one = 1;
    if (bpf_map__update_elem(skel_->maps.known_files, &k, sizeof(k), &one, sizeof(one), BPF_ANY) != 0) {
        known_files_full_ = known_files_full_ || errno == E2BIG;
        return false;
    }
    known_files_.insert({k.dev, k.ino});
    return true;
}

void BpfSession::forget_known_file(uint64_t st_dev, uint64_t inode) {
    FileKey k = kernel_file_key(st_dev, inode);
    bpf_map__delete_elem(skel_->maps.known_files, &k, sizeof(k), 0);
    if (known_files_.erase({k.dev, k.ino})) known_files_full_ = false;
}

size_t BpfSession::known_files_capacity() const { return bpf_map__max_entries(skel_->maps.known_files); }

void BpfSession::set_uid_capped(uint32_t uid, bool capped) {
    uint32_t one = 1;
    if (capped) bpf_map__update_elem(skel_->maps.capped_uids, &uid, sizeof(uid), &one, sizeof(one), BPF_ANY);
    else bpf_map__delete_elem(skel_->maps.capped_uids, &uid, sizeof(uid), 0);
}

void BpfSession::set_others_capped(bool capped) {
    __atomic_store_n(&skel_->bss->others_capped, capped ? 1u : 0u, __ATOMIC_SEQ_CST);
}

void BpfSession::stop_stopping_at_new_files() {
    __atomic_store_n(&skel_->data->stop_on_new_file, 0u, __ATOMIC_SEQ_CST);
    mmap_hook_.reset();
}

void BpfSession::resumed(uint32_t tgid) { bpf_map__delete_elem(skel_->maps.stopped_pids, &tgid, sizeof(tgid), 0); }

int BpfSession::stopped_pids_fd() const { return bpf_map__fd(skel_->maps.stopped_pids); }

uint64_t BpfSession::ringbuf_drops_of(uint32_t tgid) const {
    uint64_t v = 0;
    bpf_map__lookup_elem(skel_->maps.proc_drops, &tgid, sizeof(tgid), &v, sizeof(v), 0);
    return v;
}

std::optional<BpfSession::FlightComm> BpfSession::flight_of(uint32_t tgid, uint64_t comm) const {
    const cd_flight_key key{tgid, 0, comm};
    auto value = std::make_unique<cd_flight>();  // 16 KiB: not on the stack
    if (bpf_map__lookup_elem(skel_->maps.flight, &key, sizeof(key), value.get(), sizeof(cd_flight), 0) != 0)
        return std::nullopt;
    FlightComm c;
    c.comm = comm;
    c.seq = value->seq;
    // Oldest first: the slots after the newest one's, then up to it.
    for (uint64_t s = c.seq > CD_FLIGHT_SLOTS ? c.seq - CD_FLIGHT_SLOTS + 1 : 1; s <= c.seq; ++s) {
        const cd_flight_entry& e = value->e[(s - 1) % CD_FLIGHT_SLOTS];
        if (e.seq == s) c.last.push_back(e);  // else overwritten or being written: not shown
    }
    return c;
}

// Keys only: a recorder's value is 16 KiB.
std::vector<cd_flight_key> BpfSession::flight_keys(uint32_t tgid) const {
    std::vector<cd_flight_key> keys;
    cd_flight_key key{}, next{};
    for (const cd_flight_key* prev = nullptr;
         bpf_map__get_next_key(skel_->maps.flight, prev, &next, sizeof(next)) == 0; prev = &key) {
        key = next;
        if (key.tgid == tgid) keys.push_back(key);
    }
    return keys;
}

std::vector<BpfSession::FlightComm> BpfSession::flight(uint32_t tgid) const {
    std::vector<FlightComm> out;
    for (const cd_flight_key& k : flight_keys(tgid))
        if (auto c = flight_of(k.tgid, k.comm)) out.push_back(std::move(*c));
    return out;
}

void BpfSession::forget_process(uint32_t tgid) {
    for (const cd_flight_key& k : flight_keys(tgid)) bpf_map__delete_elem(skel_->maps.flight, &k, sizeof(k), 0);
    bpf_map__delete_elem(skel_->maps.proc_drops, &tgid, sizeof(tgid), 0);
    bpf_map__delete_elem(skel_->maps.proc_counts, &tgid, sizeof(tgid), 0);
    for (auto& [k, v] : dump_map<cd_count_key, cd_count_val>(skel_->maps.counters))
        if (k.tgid == tgid) bpf_map__delete_elem(skel_->maps.counters, &k, sizeof(k), 0);
    for (auto& e : comms())
        if (e.key.tgid == tgid) bpf_map__delete_elem(skel_->maps.comms, &e.key, sizeof(e.key), 0);
}

bpf_program* BpfSession::enter_program() const { return skel_->progs.call_enter; }
bpf_program* BpfSession::exit_program() const { return skel_->progs.call_exit; }
bpf_program* BpfSession::dl_program() const { return skel_->progs.dl_debug_state; }

std::vector<ProgramStats> BpfSession::program_stats() const {
    std::vector<ProgramStats> out;
    bpf_program* p = nullptr;
    bpf_object__for_each_program(p, skel_->obj) {
        int fd = bpf_program__fd(p);
        if (fd < 0) continue;  // not loaded (autoload off)
        bpf_prog_info info{};
        uint32_t len = sizeof(info);
        ProgramStats s{bpf_program__name(p)};
        if (bpf_prog_get_info_by_fd(fd, &info, &len) == 0)
            s.verified_insns = info.verified_insns, s.runs = info.run_cnt, s.run_ns = info.run_time_ns;
        out.push_back(std::move(s));
    }
    return out;
}

ProbeHits BpfSession::probe_hits() const {
    ProbeHits h;
    h.counted = stats_fd_ >= 0;
    if (!h.counted) return h;
    for (const ProgramStats& s : program_stats()) {
        uint64_t* runs = s.name == "call_enter"       ? &h.entries
                         : s.name == "call_exit"      ? &h.returns
                         : s.name == "dl_debug_state" ? &h.loader
                                                      : nullptr;
        if (!runs) continue;  // the tracepoints: forks, exits, mmaps, not traps
        *runs = s.runs;
        h.run_ns += s.run_ns;
    }
    return h;
}

std::vector<std::pair<std::string, uint32_t>> BpfSession::verified_insns() const {
    std::vector<std::pair<std::string, uint32_t>> out;
    for (const ProgramStats& s : program_stats()) out.emplace_back(s.name, s.verified_insns);
    return out;
}

}  // namespace commdbg::capture
