// SPDX-License-Identifier: Apache-2.0
// RAII over the loaded BPF object: maps, the ring buffer and the programs that
// other components attach.  Nothing here knows about specs or processes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "events.hpp"
#include "limits.hpp"
#include "result.hpp"

struct commdbg_bpf;
struct ring_buffer;
struct bpf_program;
struct bpf_link;

namespace commdbg::capture {

struct BpfOptions {
    size_t ringbuf_bytes = 8u << 20;  // rounded up to a power of two >= one page
    // commdbgd: count every process calling a probed symbol (not only traced
    // ones) and stop a process that maps a libnccl file not probed yet.
    bool count_all = false;
    int scope_cgroup_fd = -1;  // with count_all: only processes in this cgroup v2 subtree
    // Fine (symbol, communicator, datatype) keys one process may hold in the
    // node-wide counter map; past them its calls are counted per symbol only.
    uint32_t counter_keys_per_process = limits::kDefaultCounterKeysPerProcess;
    // count_all: the flight recorder for the processes it adopts too.
    bool flight_recorder = true;
    // count_all: the beginnings of the file names whose first mapping stops
    // a process until they are probed (file_prefixes_of); empty: libnccl's.
    std::vector<std::string> file_prefixes;
    // Tests only (commdbgd reads COMMDBG_TEST_FAILED_STOPS): the first so
    // many stops for a new file are taken as refused by the kernel.
    uint32_t test_failed_stops = 0;
    // Turn the kernel's BPF run statistics on while the session lives
    // (bpf_enable_stats: every program on the host counts its runs then, at
    // two clock reads a run), so probe_hits() can say how often the probes
    // fired.  `--cost` asks for it.
    bool run_stats = false;
    // Records without context may go out in per-thread batches
    // (bpf/lib/batch.h), once start_batching() is called: a session with
    // records.  flush_at_switch: a thread leaving its CPU sends its batch
    // (the on_switch program, at every context switch of the host); off only
    // in tests of the window-end read (pending_batches).
    bool batch_records = false;
    bool flush_at_switch = true;
};

// One exact kernel counter.  coarse: the process's own per-symbol counter,
// for calls whose fine key was refused (comm 0, dtype CD_DTYPE_NONE: unknown).
struct CounterEntry {
    cd_count_key key;
    cd_count_val val;
    bool coarse = false;
};

// What a process's counters lost, from its cd_proc_counts.
struct CounterLoss {
    uint64_t fine_keys = 0;       // fine keys it holds
    uint64_t breakdown_lost = 0;  // calls counted without communicator and datatype
    uint64_t uncounted = 0;       // calls not counted (not collectives, or no coarse slot left)
};

struct CounterSnapshot {
    std::vector<CounterEntry> entries;      // fine and coarse, every process
    std::map<uint32_t, CounterLoss> loss;   // by tgid, processes that have counters
};

struct CommEntry {
    cd_comm_key key;
    cd_comm_val val;
};

// One loaded program's verifier work and, while the kernel's BPF stats are
// enabled (bpf_enable_stats), its runs and the time they took.
struct ProgramStats {
    std::string name;
    uint32_t verified_insns = 0;
    uint64_t runs = 0, run_ns = 0;
};

// How often the session's uprobes fired while the kernel's run statistics
// were on: each hit is a trap in the thread that made the call, in every
// process that maps a probed file, traced or not (a uprobe belongs to the
// file); `run_ns` is what commdbg's programs took of them.
struct ProbeHits {
    bool counted = false;  // false: bpf_enable_stats was refused, nothing below is known
    uint64_t entries = 0, returns = 0, loader = 0, run_ns = 0;
    bool one_process = false;  // the probes are in the traced process alone (ProbeAttacher::only_in_process)
};

struct LinkDeleter {
    void operator()(bpf_link* l) const;
};
using LinkPtr = std::unique_ptr<bpf_link, LinkDeleter>;

class BpfSession {
public:
    using EventHandler = std::function<void(std::span<const uint8_t>)>;

    // Loads the programs and attaches the process fork/exit tracepoints.
    static Result<std::unique_ptr<BpfSession>> open(const BpfOptions& opts);
    ~BpfSession();
    BpfSession(const BpfSession&) = delete;
    BpfSession& operator=(const BpfSession&) = delete;

    Result<bool> trace_process(uint32_t tgid, uint32_t flags);
    void untrace_process(uint32_t tgid);
    bool is_traced(uint32_t tgid) const;
    // How the kernel walks `tgid`'s Python frames (records of py_stack
    // symbols then carry its stack); cleared when it exits.
    Result<bool> set_python(uint32_t tgid, const cd_py_cfg& cfg);
    void clear_python(uint32_t tgid);
    // How the kernel reads tgid's tensors and process groups (torch_procs).
    Result<bool> set_torch(uint32_t tgid, const cd_torch_cfg& cfg);
    void clear_torch(uint32_t tgid);
    // The kinds of `tgid`'s code objects (events.h, cd_py_codes); null: none
    // (every frame's type is read).  Best effort: a full map costs reads.
    void set_py_codes(uint32_t tgid, const cd_py_codes* codes);
    // A USER_SCOPE RecordFunction `self` of `tgid` has begun and not ended:
    // its Python record_function object still lives.
    bool scope_open(uint32_t tgid, uint64_t self) const;

    void set_event_handler(EventHandler h) { handler_ = std::move(h); }
    // Delivers ready records to the handler; returns how many, or -errno.
    // Call records do not wake it until the buffer is 1/8 full: within
    // timeout_ms it still delivers what is there.  `woken` runs once the
    // wait is over, before the first record is delivered.
    int poll(int timeout_ms, const std::function<void()>& woken = {});

    // Calls are counted and recorded only while armed (off at open): set
    // once every link of a window is attached, cleared before the first is
    // detached, so every symbol's window opens and closes at one instant.
    void set_armed(bool on);
    bool armed() const;

    // Fine and coarse entries: the per-symbol sums of a process are exact.
    std::vector<CounterEntry> counters() const { return counter_snapshot().entries; }
    CounterSnapshot counter_snapshot() const;
    std::vector<CommEntry> comms() const;
    // The flight recorder of `tgid`: per communicator (its comm slot's
    // value), the last CD_FLIGHT_SLOTS collectives, oldest first.
    struct FlightComm {
        uint64_t comm = 0;
        uint64_t seq = 0;  // collectives entered there so far
        std::vector<cd_flight_entry> last;
    };
    std::vector<FlightComm> flight(uint32_t tgid) const;
    // One communicator's (one map lookup); nullopt: it recorded nothing.
    std::optional<FlightComm> flight_of(uint32_t tgid, uint64_t comm) const;
    // Recorded return-probed calls still in flight (their one record is sent
    // at the return), as entries, oldest first: read once a window closes.
    std::vector<CallEnter> open_calls() const;
    // Batches from now on, with the switch-out program attached first
    // (BpfOptions::batch_records, flush_at_switch); an error when it could
    // not be attached (records then go out one by one, as before).
    Result<bool> start_batching();
    bool batching() const { return batching_; }
    // The call records threads hold in their batches (bpf/lib/batch.h), each
    // thread's in order: at a window's end, those that never left their CPU.
    std::vector<cd_call> pending_batches() const;
    std::array<uint64_t, CD_DROP_MAX> drops() const;
    uint64_t drops_of(uint32_t cause) const;  // one cause (cd_drop): one map read, for a poll loop
    uint64_t ringbuf_drops_of(uint32_t tgid) const;  // records `tgid` lost to a full ring buffer
    // Removes a process's counters and communicators (e.g. after it exited).
    void forget_process(uint32_t tgid);
    // A probed library file: mapping it needs no stop (count_all mode).
    // False when the kernel's map of them is full: then every process that
    // maps the file is stopped for it again (known_files_full says so).
    bool mark_known_file(uint64_t st_dev, uint64_t inode);
    void forget_known_file(uint64_t st_dev, uint64_t inode);
    size_t known_files() const { return known_files_.size(); }
    size_t known_files_capacity() const;
    bool known_files_full() const { return known_files_full_; }
    // count_all mode: a process stopped at a new library mapping is about to
    // be resumed: out of stopped_pids before its SIGCONT, never after.
    void resumed(uint32_t tgid);
    int stopped_pids_fd() const;
    // count_all mode: new library files of `uid` (never root's) are not
    // stopped for while it is capped, nor any user's but root's while
    // others_capped; a new file of anyone's once stop_on_new_file is off.
    void set_uid_capped(uint32_t uid, bool capped);
    void set_others_capped(bool capped);
    // Shutdown: no process is stopped at a new file from now on, and the
    // hook that stops them is detached.
    void stop_stopping_at_new_files();

    bpf_program* enter_program() const;
    bpf_program* exit_program() const;
    bpf_program* dl_program() const;
    size_t ringbuf_bytes() const { return ringbuf_bytes_; }
    // Instructions the verifier processed to load each of the loaded programs
    // (name -> count; 0 where the kernel does not say): its work, which every
    // attach waits for.
    std::vector<std::pair<std::string, uint32_t>> verified_insns() const;
    std::vector<ProgramStats> program_stats() const;
    ProbeHits probe_hits() const;

private:
    std::vector<cd_flight_key> flight_keys(uint32_t tgid) const;  // the flight recorders of tgid
    BpfSession() = default;
    void traced_changed();
    static int on_ring_record(void* ctx, void* data, size_t size) noexcept;

    int stats_fd_ = -1;  // BpfOptions::run_stats: the kernel counts runs while it is open
    commdbg_bpf* skel_ = nullptr;
    ring_buffer* rb_ = nullptr;
    std::vector<LinkPtr> tracepoints_;
    // Each thread's state in the kernel's `threads` map, one copy at a time.
    void each_thread(const std::function<void(uint32_t tid, const cd_thread&)>& fn) const;
    EventHandler handler_;
    size_t ringbuf_bytes_ = 0;
    LinkPtr mmap_hook_;  // count_all: on_mmap_file's link
    bool batch_records_ = false, flush_at_switch_ = true, batching_ = false;
    std::set<std::pair<uint64_t, uint64_t>> known_files_;  // what known_files holds (kernel dev, inode)
    bool known_files_full_ = false;
};

// "ringbuf_full", "counter_map_full", ...: names of enum cd_drop_cause.
const char* drop_cause_name(uint32_t cause);

// A message a user can act on for a failed BPF operation (`what`), from errno.
std::string bpf_error_message(const std::string& what, int err);

}  // namespace commdbg::capture
