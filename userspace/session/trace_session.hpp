// SPDX-License-Identifier: Apache-2.0
// One tracing session: BPF object, probe attachment, event decoding, the
// record model and the per-process bookkeeping that the outputs need.  Both
// `commdbg attach` and `commdbg run` drive one; the daemon will drive several.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "bpf_py_maps.hpp"
#include "bpf_session.hpp"
#include "model.hpp"
#include "probe_attach.hpp"
#include "py_config.hpp"
#include "python_support.hpp"
#include "render.hpp"
#include "result.hpp"
#include "resume_guard.hpp"
#include "symbol_table.hpp"

namespace commdbg::session {

struct SessionOptions {
    size_t ringbuf_bytes = 8u << 20;
    model::ModelLimits limits;
    std::vector<std::string> probes;  // spec names or files; empty: every built-in
    bool records = true;              // ring-buffer records (off: counters only)
    // Records without context in per-thread batches (bpf/lib/batch.h), with
    // a program at every context switch of the host while the session runs:
    // off for an always-on session (commdbgd --fsdp-checks).
    bool batch_records = true;
    bool stack_args = false;          // records also read stack-passed arguments only they show (NCCL's stream)
    bool tensors = true;              // c10d records read their tensors and group (with records only)
    python::PyStackMode py_stack = python::PyStackMode::Default;  // where records carry the Python stack
    uint32_t py_depth = CD_DEFAULT_PY_FRAMES;     // frames walked per record, innermost first
    std::vector<fsdp::Profile> lifecycle_profiles;  // tried before the built-in ones
    // The noise level of the outputs asked for (output::record_visible): ops
    // it never shows are not probed — below 3 the trivial ones (views,
    // detach, ...: each a uprobe trap per call for nothing), at 0 every op.
    // 3: everything (a --trace shows every record).
    int view_noise_level = 3;
    // Whom the session traces for (commdbgd: its client).  Other than root,
    // a process the kernel would not let that user read (may_read_process)
    // is refused at add_process, and one that becomes so during the window
    // (a followed child that execs a set-uid program, a prctl making it
    // non-dumpable) is withheld: untraced, its later records dropped, noted.
    uint32_t owner_uid = 0, owner_gid = 0;
    // Count how often the probes fire (capture::BpfOptions::run_stats).
    bool probe_hits = false;
    // The one process the session will trace (attach --no-follow), or -1.
    // Its probes are then installed in that process only: another process
    // mapping the same library (the job's other ranks) pays no trap, where
    // without it every call there traps for nothing (docs/safety.md).
    int only_pid = -1;
    // For `attach PID`: without following its children, PID is that one
    // process (only_pid).
    void attach_to(int pid, bool follow) {
        if (!follow) only_pid = pid;
    }
};

// Ops the outputs at `noise_level` never show get no probe (issue 27: a
// DTensor op dispatches many trivial ones, each a uprobe trap for nothing):
// below 3 the trivial ones (output::is_trivial_op), at 0 every op.  Without
// records (--counts-only) only what the exact counters count keeps its
// probe: collectives, communicator and group calls.
void skip_hidden_ops(std::vector<capture::ProbeSpec>& specs, int noise_level, bool records = true);

// A spec's "match" rules that name a function no symbol table lists are
// probed where torch's own code shows it (torch::derive_record_function_exit,
// torch::module_entry_sites).
void derive_unexported(std::vector<capture::ProbeSpec>& specs);

// commdbg's own CPU in a session, on its thread's clock (user and system):
// setting processes up (their libraries' symbols and probes, Python and
// torch discovery: add_process and each scan after a fork, exec or dlopen)
// and handling records (naming frames, the call trees).
struct SessionCost {
    uint64_t setup_ns = 0;
    uint64_t records_ns = 0;  // the polls, less the set-up inside them
    uint64_t records = 0;     // call records handled
    uint64_t setups = 0;      // processes added or scanned
    uint64_t loader_stops_unscanned = 0;  // stops before a mapping (TraceSession::mapping_starts)
    uint64_t batched = 0;         // records that came in their thread's batch (bpf/lib/batch.h)
    uint64_t batched_at_end = 0;  // of them, read from the thread at the window's end
};

struct TracedProcess {
    uint32_t pid = 0;
    std::string command;
    std::set<std::string> libraries;  // spec-named files it mapped
    bool exited = false;
    std::optional<int> exit_code;     // wait status style (from the kernel or waitpid)
    std::vector<std::string> notes;
    // Each calling thread's name (/proc/PID/task/TID/comm) when first seen;
    // "" when it could not be read.  At most kMaxThreadNames.
    std::map<uint32_t, std::string> thread_names;
    static constexpr size_t kMaxThreadNames = 4096;
    // Traced with CD_TRACE_DL_STOP: the kernel may have stopped it for us,
    // so it gets a SIGCONT when the session ends.  No other process does.
    bool may_be_stopped = false;
    // Traced from its first instruction (a `run`'s command, a followed
    // fork): the lifecycle checks then trust the window's first step.
    bool from_start = false;
    // The session's owner may no longer read it (SessionOptions::owner_uid):
    // untraced since, and nothing more of it is read or recorded.
    bool withheld = false;
    // Its loader's `_r_debug.r_state` (capture::ScanResult::loader_state).
    std::optional<uint64_t> loader_state;
};

class TraceSession {
public:
    static Result<std::unique_ptr<TraceSession>> create(const SessionOptions& opts);
    ~TraceSession();

    // Starts tracing `pid` (a process id, not a thread id).  follow: its
    // children are traced from their first instruction (else each fork is
    // noted); dl_stop: it is stopped at each loader change until new
    // libraries are attached (only where we are sure a stop harms nobody).
    Result<bool> add_process(int pid, bool follow, bool dl_stop);
    // Loader probe for the interpreter of `exe`, before a child execs it.
    Result<bool> prepare_exec(const std::string& exe) { return attacher_.attach_loader_for(exe); }

    // Handles ready events; returns the number handled (or -errno).
    int poll(int timeout_ms);
    // Ends the window (no call is counted or recorded after it), then reads
    // what is left in the ring buffer and in the threads' batches.
    void drain();

    void mark_exited(int pid, int wait_status);
    // `pid` was added before it ran anything (a `run`'s held child), or --
    // after a reset_window() -- its next window begins between two steps:
    // the lifecycle in reports() then checks that window's first step.
    void mark_from_start(int pid, bool from_start = true);
    bool exited(int pid) const;
    const std::map<uint32_t, TracedProcess>& processes() const { return procs_; }

    std::vector<snapshot::ProcessSnapshot> reports() const;
    // Ends a window of records for every process at once (commdbgd
    // --fsdp-checks): their records go, open frames stay as placeholders,
    // and exited processes are forgotten here, in the model and in the
    // kernel's per-process maps.  Tracing goes on.
    void reset_window();
    const capture::SymbolTable& symbols() const { return symbols_; }
    std::vector<std::string> take_messages();  // problems worth a line on stderr
    uint64_t decode_errors() const { return decode_errors_; }
    // Records whose handling failed (each said in take_messages, up to kMaxFailureNotes).
    uint64_t failed_records() const { return failed_records_; }
    std::array<uint64_t, CD_DROP_MAX> kernel_drops() const { return bpf_->drops(); }
    std::vector<capture::ProgramStats> program_stats() const { return bpf_->program_stats(); }
    capture::ProbeHits probe_hits() const {
        auto h = bpf_->probe_hits();
        h.one_process = attacher_.in_one_process();
        return h;
    }
    const std::vector<capture::AttachedFile>& attached_files() const { return attacher_.files(); }
    const SessionCost& cost() const { return cost_; }

private:
    TraceSession(std::unique_ptr<capture::ResumeGuard> guard, std::unique_ptr<capture::BpfSession> bpf,
                 std::vector<capture::ProbeSpec> specs, const SessionOptions& opts);
    void on_record(std::span<const uint8_t> bytes) noexcept;
    void name_exited_thread(const capture::ThreadExit& t);
    void handle_record(std::span<const uint8_t> bytes);
    uint32_t trace_flags(bool follow, bool dl_stop);
    void scan(uint32_t pid);
    bool mapping_starts(const TracedProcess& p);
    void rescan_after_lost_loader_events();
    TracedProcess& track(uint32_t pid);
    // Python stacks and tensor reads for p, each once its runtime is loaded; notes on failure.
    void setup_frameworks(TracedProcess& p);
    // The session's owner may read `pid` now (always for root; a process gone meanwhile too).
    bool owner_may_read(uint32_t pid) const;
    void withhold(TracedProcess& p);
    void recheck_access();

    std::unique_ptr<capture::ResumeGuard> guard_;  // forked before the BPF object exists
    std::unique_ptr<capture::BpfSession> bpf_;
    BpfPyMaps py_maps_;  // what python_ writes to bpf_
    BpfTorchMaps torch_maps_;  // what torch_ writes to bpf_
    capture::SymbolTable symbols_;
    capture::ProbeAttacher attacher_;
    model::TraceModel model_;
    SessionOptions opts_;
    python::PythonSupport python_;  // Python stacks: discovery, the kernel's walker, frame names
    torch::TorchSupport torch_;     // tensor shapes: the kernel's reader of each process's tensors
    uint64_t dl_events_lost_ = 0;  // the kernel's loader_event_lost count, last seen
    std::map<uint32_t, TracedProcess> procs_;
    std::vector<std::string> messages_;
    uint64_t decode_errors_ = 0;
    uint64_t failed_records_ = 0;
    static constexpr uint64_t kMaxFailureNotes = 8;
    uint32_t follow_flags_ = 0;
    uint64_t untraced_children_ = 0;  // forks of a process traced without follow
    static constexpr uint64_t kMaxChildNotes = 8;
    std::chrono::steady_clock::time_point access_checked_{};
    SessionCost cost_;
    std::chrono::steady_clock::time_point params_retried_{};
    static constexpr std::chrono::milliseconds kParamRetryEvery{5}, kParamRetryMax{2000};
    std::chrono::milliseconds params_retry_gap_ = kParamRetryEvery;
    // A batch of records (the Python names' re-validation, py_objects.hpp)
    // spans the polls of at least kPyBatch: a poll woken by a full ring
    // every few milliseconds re-validated the same code objects each time.
    std::chrono::steady_clock::time_point py_batch_began_{};
    static constexpr std::chrono::milliseconds kPyBatch{20};
    // The last poll read records: the next waits at most kAfterReadMs, so the
    // records no wake-up announced are read (and named) soon after.
    bool read_last_ = false;
    static constexpr int kAfterReadMs = static_cast<int>((CD_CONTEXT_WAKE_NS + 999999) / 1000000);
    // A poll after one that read records starts kBusyPollGap after that one
    // at the earliest (poll()), unless that one read a loader or fork event:
    // a process may be stopped until the next is read.
    std::chrono::steady_clock::time_point last_poll_{};
    bool set_up_last_ = false;
    static constexpr std::chrono::microseconds kBusyPollGap{1000};
    // A batched record, as one thread numbered it (bpf/lib/batch.h): its
    // time tells a thread from an earlier one with the same id.
    struct BatchKey {
        uint32_t tid, seq;
        uint64_t ts;
        auto operator<=>(const BatchKey&) const = default;
    };
    static BatchKey batch_key(const cd_call& c) { return {c.h.tid, c.batch_seq, c.h.ts_ns}; }
    static std::optional<cd_call> call_record(std::span<const uint8_t> bytes);
    void start_batching();
    bool take_batched(std::span<const uint8_t> bytes);
    void take_pending_batches();
    // While drain() reads the ring, the batched records it brought (one the
    // threads still hold is not taken twice); after, those it took from the
    // threads (a switch-out may send one again): each is handled once.
    bool draining_ = false;
    std::set<BatchKey> drained_, taken_;
};

// "pid 4242 (python3 train.py)" for messages.
std::string describe_pid(int pid);

}  // namespace commdbg::session
