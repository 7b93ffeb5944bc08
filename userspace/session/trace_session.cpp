// SPDX-License-Identifier: Apache-2.0
#include "trace_session.hpp"

#include <link.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <string_view>
#include <thread>
#include <type_traits>
#include <variant>

#include "module_entry.hpp"
#include "record_function.hpp"
#include "events.hpp"
#include "pid_filter.hpp"
#include "snapshot.hpp"
#include "procfs.hpp"
#include "remote_memory.hpp"
#include "render.hpp"

namespace commdbg::session {

std::string describe_pid(int pid) {
    auto p = host::read_process(pid);
    if (!p) return "pid " + std::to_string(pid);
    std::string cmd = p->cmdline.empty() ? p->comm : p->cmdline;
    if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
    return "pid " + std::to_string(pid) + " (" + cmd + ")";
}

namespace {

// --py-stack off: no symbol walks; ops: ops walk too (the specs' defaults
// leave them out, they are many).
void apply_py_stack_mode(std::vector<capture::ProbeSpec>& specs, python::PyStackMode mode) {
    for (capture::ProbeSpec& s : specs)
        for (capture::SymbolRule& r : s.symbols) {
            if (mode == python::PyStackMode::Off) r.info.py_stack = false;
            if (mode == python::PyStackMode::Ops && r.info.role == CD_ROLE_OP && !r.py_stack.has_value())
                r.info.py_stack = true;
        }
}

// Without records only the exact counters are read: what feeds them
// (collectives, communicators, groups) keeps its probe, nothing else.
bool counted(uint32_t role) {
    switch (role) {
        case CD_ROLE_COLLECTIVE:
        case CD_ROLE_COMM_INIT:
        case CD_ROLE_COMM_SPLIT:
        case CD_ROLE_COMM_END:
        case CD_ROLE_GROUP_START:
        case CD_ROLE_GROUP_END:
            return true;
        default:
            return false;
    }
}

uint64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// Adds the thread's CPU from construction to destruction to `into`.
class CpuSpan {
public:
    explicit CpuSpan(uint64_t& into) : into_(into), start_(thread_cpu_ns()) {}
    ~CpuSpan() { into_ += thread_cpu_ns() - start_; }
    CpuSpan(const CpuSpan&) = delete;
    CpuSpan& operator=(const CpuSpan&) = delete;

private:
    uint64_t& into_;
    uint64_t start_;
};

// The same for handling records: the set-up done meanwhile is not theirs.
class RecordSpan {
public:
    explicit RecordSpan(SessionCost& c) : c_(c), setup_before_(c.setup_ns), start_(thread_cpu_ns()) {}
    ~RecordSpan() { c_.records_ns += thread_cpu_ns() - start_ - (c_.setup_ns - setup_before_); }
    RecordSpan(const RecordSpan&) = delete;
    RecordSpan& operator=(const RecordSpan&) = delete;

private:
    SessionCost& c_;
    uint64_t setup_before_, start_;
};

}  // namespace

void skip_hidden_ops(std::vector<capture::ProbeSpec>& specs, int noise_level, bool records) {
    if (noise_level >= 3 && records) return;
    for (capture::ProbeSpec& s : specs) {
        s.skip = [noise_level, records](const capture::SymbolInfo& info) {
            if (!records) return !counted(info.role);
            return info.role == CD_ROLE_OP && (noise_level < 1 || output::is_trivial_op(info.name));
        };
        s.skip_why = !records ? "--counts-only counts collectives, communicator and group calls only"
                              : "noise level " + std::to_string(noise_level) +
                                    " shows none of them (--noise-level 3, or --trace, for every op)";
    }
}

void derive_unexported(std::vector<capture::ProbeSpec>& specs) {
    for (capture::ProbeSpec& s : specs)
        s.derive = [](const std::string& path, std::string_view name) {
            capture::DerivedSites d;
            if (name == torch::kModuleEntry) {
                d.at = torch::module_entry_sites(path, d.note);
                d.elsewhere = d.at.empty() && d.note.empty();
            } else if (name == torch::kRecordFunctionExit) {
                if (auto exit = torch::derive_record_function_exit(path, d.note)) d.at.push_back(*exit);
            }
            return d;
        };
}

Result<std::unique_ptr<TraceSession>> TraceSession::create(const SessionOptions& opts) {
    using R = Result<std::unique_ptr<TraceSession>>;
    std::vector<std::string> spec_errors;
    auto specs = capture::select_specs(opts.probes, spec_errors);
    if (specs.empty()) {
        std::string msg = "commdbg: no usable probe spec";
        for (const auto& e : spec_errors) msg += "\n  " + e;
        return R::fail(msg);
    }
    apply_py_stack_mode(specs, opts.py_stack);
    skip_hidden_ops(specs, opts.view_noise_level, opts.records);
    derive_unexported(specs);
    auto guard = std::make_unique<capture::ResumeGuard>();
    capture::BpfOptions bpf_opts;
    bpf_opts.ringbuf_bytes = opts.ringbuf_bytes;
    bpf_opts.run_stats = opts.probe_hits;
    // COMMDBG_RECORD_BATCH=0: each record by itself (benchmarks' A/B);
    // COMMDBG_TEST_NO_SWITCH_FLUSH=1: batches wait for the window's end
    // (tests of that read).
    const char* batch_env = getenv("COMMDBG_RECORD_BATCH");
    bpf_opts.batch_records = opts.records && opts.batch_records && !(batch_env && std::string_view(batch_env) == "0");
    bpf_opts.flush_at_switch = getenv("COMMDBG_TEST_NO_SWITCH_FLUSH") == nullptr;
    auto bpf = capture::BpfSession::open(bpf_opts);
    if (!bpf) return R::fail(bpf.error());
    std::unique_ptr<TraceSession> s(
        new TraceSession(std::move(guard), std::move(bpf.value()), std::move(specs), opts));
    for (auto& e : spec_errors) s->messages_.push_back(e + " — continuing with the other specs");
    return R(std::move(s));
}

TraceSession::TraceSession(std::unique_ptr<capture::ResumeGuard> guard, std::unique_ptr<capture::BpfSession> bpf,
                           std::vector<capture::ProbeSpec> specs, const SessionOptions& opts)
    : guard_(std::move(guard)),
      bpf_(std::move(bpf)),
      py_maps_(*bpf_),
      torch_maps_(*bpf_),
      attacher_(*bpf_, symbols_, std::move(specs)),
      model_(symbols_, opts.limits),
      opts_(opts),
      python_(py_maps_, python::PySupportOptions{.stacks = opts.py_stack != python::PyStackMode::Off && opts.records,
                                         .depth = opts.py_depth}),
      torch_(torch_maps_, opts.records && opts.tensors) {
    bpf_->set_event_handler([this](std::span<const uint8_t> b) { on_record(b); });
    if (opts.only_pid >= 0) {
        if (auto covers = capture::pid_filter_covers_process())
            attacher_.only_in_process(opts.only_pid);
        else
            messages_.push_back(covers.error() + " — the probes are in every process that maps a probed file, "
                                                 "as without --no-follow");
    }
    if (python_.stacks()) {
        model_.set_resolver(&python_.resolver());
        torch_.set_python(&python_.resolver());
        model_.set_parameter_source(&torch_);
    }
    model_.set_tensor_layouts([this](uint32_t pid) { return torch_.layout(pid); });
    model_.set_node_namer([this](uint32_t pid, uint64_t vtable) { return torch_.class_of_vtable(pid, vtable); });
    // FSDP's backward labels name the unit their collectives belong to.
    model_.set_unit_namer([this](std::string_view label) -> std::optional<std::string> {
        auto names = [&](const fsdp::Profile& prof) -> std::optional<std::string> {
            auto m = prof.match(label);
            if (m && (m->kind == fsdp::EventKind::PreBackward || m->kind == fsdp::EventKind::PostBackward ||
                      m->kind == fsdp::EventKind::GradReduce))
                return m->unit;
            return std::nullopt;
        };
        for (const auto& prof : opts_.lifecycle_profiles)
            if (auto u = names(prof)) return u;
        for (const auto& prof : fsdp::builtin_profiles())
            if (auto u = names(prof)) return u;
        return std::nullopt;
    });
    model_.set_scope_check([this](uint32_t tgid, uint64_t self) { return bpf_->scope_open(tgid, self); });
}

TraceSession::~TraceSession() {
    bpf_->set_armed(false);  // before the first link goes
    // Stop stopping first, then let anything we may have stopped run on: a
    // process we never stopped may be stopped by someone else (Ctrl-Z, a
    // debugger) and is left as it is.
    for (auto& [pid, p] : procs_) {
        bpf_->untrace_process(pid);
        if (p.may_be_stopped && !p.exited) kill(static_cast<pid_t>(pid), SIGCONT);
    }
}

TracedProcess& TraceSession::track(uint32_t pid) {
    auto [it, fresh] = procs_.try_emplace(pid);
    if (fresh) {
        it->second.pid = pid;
        if (auto info = host::read_process(static_cast<int>(pid)))
            it->second.command = info->cmdline.empty() ? info->comm : info->cmdline;
    }
    return it->second;
}

namespace {

uint32_t tgid_of(const capture::Event& ev) {
    return std::visit(
        [](const auto& e) -> uint32_t {
            if constexpr (std::is_same_v<std::decay_t<decltype(e)>, capture::Call>) return e.enter.tgid;
            else return e.tgid;
        },
        ev);
}

// Why `pid` cannot be traced (a thread, a kernel thread, a zombie), if so.
Result<bool> check_traceable(int pid) {
    auto info = host::read_process(pid);
    if (!info) return Result<bool>::fail(info.error());
    if (info->kernel_thread)
        return Result<bool>::fail("pid " + std::to_string(pid) + " is a kernel thread (" + info->comm +
                                  ") — attach to the user process that runs the training job");
    if (info->tgid != pid)
        return Result<bool>::fail(std::to_string(pid) + " is a thread of pid " + std::to_string(info->tgid) +
                                  " — attach to the process: " + std::to_string(info->tgid));
    if (info->state == 'Z')
        return Result<bool>::fail("pid " + std::to_string(pid) + " has exited (zombie) — nothing to trace");
    return true;
}

}  // namespace

// No CD_TRACE_FLIGHT: the flight recorder is commdbgd's node counter's, which
// `commdbg hang` asks; a session's BPF object, its `flight` map with it, is
// its own, read by nobody and gone when it ends.  Writing it cost each
// collective two hash lookups, an atomic and two clock reads for nothing.
uint32_t TraceSession::trace_flags(bool follow, bool dl_stop) {
    uint32_t flags = CD_TRACE_COUNT;
    if (opts_.records) flags |= CD_TRACE_RECORDS;
    if (opts_.records && opts_.stack_args) flags |= CD_TRACE_STACK_ARGS;
    flags |= follow ? CD_TRACE_FOLLOW : CD_TRACE_NOTE_FORK;
    // Without a guard that resumes on our death, never stop anybody.
    if (dl_stop && !guard_->running()) guard_->start();
    if (dl_stop && guard_->running()) flags |= CD_TRACE_DL_STOP;
    return flags;
}

bool TraceSession::owner_may_read(uint32_t pid) const {
    if (opts_.owner_uid == 0) return true;
    auto c = host::read_creds(static_cast<int>(pid));
    return !c || may_read_process(*c, opts_.owner_uid, opts_.owner_gid);
}

// Untraced in the kernel, forgotten by the resolver (which reads its memory)
// and by the walker; what was recorded before stays in the report.
void TraceSession::withhold(TracedProcess& p) {
    if (p.withheld) return;
    p.withheld = true;
    bpf_->untrace_process(p.pid);
    python_.withhold(p.pid);
    torch_.clear(p.pid);
    p.notes.push_back("pid " + std::to_string(p.pid) + " is no longer traced: uid " + std::to_string(opts_.owner_uid) +
                      " may not read it since it became a set-user-ID or set-group-ID program, another user's or "
                      "not dumpable (the kernel's ptrace rule); its records end here — trace it as root");
}

// A process may become unreadable without an exec (setresuid, prctl): looked
// at once a second, besides at every fork and loader change.
void TraceSession::recheck_access() {
    if (opts_.owner_uid == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - access_checked_ < std::chrono::seconds(1)) return;
    access_checked_ = now;
    for (auto& [pid, p] : procs_)
        if (!p.withheld && !p.exited && !owner_may_read(pid)) withhold(p);
}

Result<bool> TraceSession::add_process(int pid, bool follow, bool dl_stop) {
    CpuSpan span(cost_.setup_ns);
    ++cost_.setups;
    if (auto r = check_traceable(pid); !r) return r;
    if (opts_.only_pid >= 0 && (pid != opts_.only_pid || follow))
        return Result<bool>::fail("pid " + std::to_string(pid) + ": this session's probes fire in pid " +
                                  std::to_string(opts_.only_pid) + " only, without its children");
    if (!owner_may_read(static_cast<uint32_t>(pid)))
        return Result<bool>::fail("pid " + std::to_string(pid) + ": permission denied — uid " +
                                  std::to_string(opts_.owner_uid) +
                                  " may not read that process (another user's, a set-user-ID or set-group-ID "
                                  "program, or not dumpable); run as root or as the process owner");
    const auto tgid = static_cast<uint32_t>(pid);
    const uint32_t flags = trace_flags(follow, dl_stop);
    const bool stops = flags & CD_TRACE_DL_STOP;
    // A failed add leaves nothing behind: not in the kernel's filter, not
    // watched, not in procs_ (else its report and SIGCONT would follow).
    const bool fresh = !procs_.count(tgid);
    auto undo = [&] {
        if (!fresh) return;
        bpf_->untrace_process(tgid);
        if (stops) guard_->unwatch(pid);
    };
    if (stops) guard_->watch(pid);  // before the kernel may stop it
    if (auto r = bpf_->trace_process(tgid, flags); !r) {
        undo();
        return r;
    }
    auto scan_result = attacher_.scan_process(pid);
    if (!scan_result) {
        undo();
        if (!host::read_process(pid))
            return Result<bool>::fail("pid " + std::to_string(pid) + " exited during attach — nothing was traced");
        return Result<bool>::fail(scan_result.error());
    }
    follow_flags_ = flags;
    auto& p = track(tgid);
    p.may_be_stopped = p.may_be_stopped || stops;
    // Every link of the process's files is in place: the window opens now,
    // for all symbols at once.  Files attached later do not close it.
    bpf_->set_armed(true);
    p.libraries.insert(scan_result->libraries.begin(), scan_result->libraries.end());
    p.loader_state = scan_result->loader_state;
    for (auto& n : scan_result->notes) messages_.push_back(std::move(n));
    // Traced anew, its kernel flags were rewritten: CD_TRACE_PYTHON with them.
    python_.retrace(p.pid);
    setup_frameworks(p);
    return true;
}

void TraceSession::setup_frameworks(TracedProcess& p) {
    if (auto note = python_.setup(p.pid)) p.notes.push_back(std::move(*note));
    if (auto note = torch_.setup(p.pid)) p.notes.push_back(std::move(*note));
}

// A loader stop where the loader says it is about to map an object (or to
// unmap one), not that it has: glibc calls _dl_debug_state() before and
// after, so half of a `run`'s stops at an import find nothing new, and the
// one after the mapping always follows.  Only at a stop: the state read is
// then this very call's.
bool TraceSession::mapping_starts(const TracedProcess& p) {
    int state = r_debug::RT_CONSISTENT;
    if (!p.loader_state || !host::ProcessMemory(static_cast<int>(p.pid)).get(*p.loader_state, state)) return false;
    if (state != r_debug::RT_ADD && state != r_debug::RT_DELETE) return false;
    ++cost_.loader_stops_unscanned;
    return true;
}

void TraceSession::scan(uint32_t pid) {
    CpuSpan span(cost_.setup_ns);
    ++cost_.setups;
    // Every exec reaches here (its loader event): a set-uid image is not read.
    auto& p = track(pid);
    if (p.withheld) return;
    if (!owner_may_read(pid)) return withhold(p);
    auto r = attacher_.scan_process(static_cast<int>(pid));
    if (!r) return;  // gone meanwhile: its exit event follows
    // An exec event (DlChange::exec) follows every exec: the command line is final by now.
    if (auto info = host::read_process(static_cast<int>(pid)))
        p.command = info->cmdline.empty() ? info->comm : info->cmdline;
    p.libraries.insert(r->libraries.begin(), r->libraries.end());
    p.loader_state = r->loader_state;
    for (auto& n : r->notes) messages_.push_back(std::move(n));
    setup_frameworks(p);
}

void TraceSession::on_record(std::span<const uint8_t> bytes) noexcept {
    // Called from inside ring_buffer__poll: nothing may unwind through it.
    // A record that cannot be handled (a full symbol table while attaching
    // to a new library, no memory) is counted and said, and the next one
    // handled as usual.
    auto failed = run_without_throwing([&] { handle_record(bytes); });
    if (!failed) return;
    if (++failed_records_ <= kMaxFailureNotes)
        (void)run_without_throwing([&] { messages_.push_back("a ring-buffer record could not be handled: " + *failed); });
}

// Its records may all have been read after it was gone: the name it had at
// its exit stands in for the one /proc could not give.
void TraceSession::name_exited_thread(const capture::ThreadExit& t) {
    auto it = procs_.find(t.tgid);
    if (it == procs_.end() || t.name.empty()) return;
    auto& names = it->second.thread_names;
    auto known = names.find(t.tid);
    if (known != names.end() && known->second.empty()) known->second = t.name;
    else if (known == names.end() && names.size() < TracedProcess::kMaxThreadNames) names[t.tid] = t.name;
}

// The first record a batch would have taken (a call's one record without
// context, sent by itself) starts the batches, and the program at every
// context switch of the host that they need: a session whose records all
// have context (a Python job) never pays it.  Not once the window closed.
void TraceSession::start_batching() {
    if (bpf_->batching() || !bpf_->armed()) return;
    if (auto r = bpf_->start_batching(); !r) messages_.push_back(r.error());
}

// A call's one record, batched or not: the record read once.
std::optional<cd_call> TraceSession::call_record(std::span<const uint8_t> bytes) {
    cd_call c;
    if (bytes.size() != sizeof(c)) return std::nullopt;
    std::memcpy(&c, bytes.data(), sizeof(c));
    if (c.h.kind != CD_EV_CALL) return std::nullopt;
    return c;
}

// A batched record: false when it was read from its thread at the window's
// end already.  A call's record without context sent by itself may start
// the batches.
bool TraceSession::take_batched(std::span<const uint8_t> bytes) {
    auto c = call_record(bytes);
    if (!c) return true;
    if (c->batch_seq == 0) {
        if (c->h.tail_len == 0) start_batching();
        return true;
    }
    const BatchKey key = batch_key(*c);
    if (taken_.erase(key)) return false;
    ++cost_.batched;
    if (draining_) drained_.insert(key);
    return true;
}

void TraceSession::handle_record(std::span<const uint8_t> bytes) {
    if (!take_batched(bytes)) return;
    capture::DecodeResult d = capture::decode(bytes);
    if (!d.event) {
        ++decode_errors_;
        return;
    }
    capture::Event& ev = *d.event;
    auto self = procs_.find(tgid_of(ev));
    if (self != procs_.end() && self->second.withheld && !std::holds_alternative<capture::ProcExit>(ev)) {
        // Sent before it was untraced: nothing of it is read.  A stop still ends.
        if (auto* dl = std::get_if<capture::DlChange>(&ev); dl && dl->stopped)
            kill(static_cast<pid_t>(dl->tgid), SIGCONT);
        return;
    }
    if (std::holds_alternative<capture::DlChange>(ev) || std::holds_alternative<capture::ProcFork>(ev))
        set_up_last_ = true;
    if (auto* dl = std::get_if<capture::DlChange>(&ev)) {
        // After an exec the scan finds the new image's loader (another
        // file in another root) and probes it before the image runs.  What
        // the old image taught (a forked child is set up from its parent's)
        // is dropped first: the new one maps torch and Python elsewhere.
        if (dl->exec && procs_.count(dl->tgid)) {
            python_.new_image(dl->tgid);
            torch_.drop(dl->tgid);
        }
        if (procs_.count(dl->tgid) && !(dl->stopped && !dl->exec && mapping_starts(procs_[dl->tgid])))
            scan(dl->tgid);
        // SIGCONT after the attach: the stop was queued before the event, so
        // this can only end it (or cancel it while still pending).
        if (dl->stopped) kill(static_cast<pid_t>(dl->tgid), SIGCONT);
        return;
    }
    if (auto* f = std::get_if<capture::ProcFork>(&ev)) {
        if (!(follow_flags_ & CD_TRACE_FOLLOW)) {
            // Not followed: said, so that a parent whose children do the
            // work does not look idle.
            if (++untraced_children_ <= kMaxChildNotes)
                messages_.push_back("pid " + std::to_string(f->parent_tgid) + " forked pid " + std::to_string(f->tgid) +
                                    ", which is not traced (--no-follow): its collectives are not in this report");
            else if (untraced_children_ == kMaxChildNotes + 1)
                messages_.push_back("more children were forked and not traced (--no-follow); only the first " +
                                    std::to_string(kMaxChildNotes) + " are named");
            return;
        }
        // The kernel already traces the child; a child forked before exec
        // shares the parent's probed mappings.
        const bool stops = follow_flags_ & CD_TRACE_DL_STOP;
        if (stops) guard_->watch(static_cast<pid_t>(f->tgid));
        auto& child = track(f->tgid);
        child.may_be_stopped = stops;
        child.from_start = true;
        scan(f->tgid);
    } else if (auto* x = std::get_if<capture::ProcExit>(&ev)) {
        auto it = procs_.find(x->tgid);
        if (it != procs_.end() && !it->second.exited) {
            it->second.exited = true;
            it->second.exit_code = x->exit_code;
            python_.exited(x->tgid);
        }
        python_.clear(x->tgid);
        torch_.clear(x->tgid);
    } else if (auto* t = std::get_if<capture::ThreadExit>(&ev)) {
        name_exited_thread(*t);
    } else if (const capture::CallEnter* e = entry_of(ev)) {
        ++cost_.records;
        // A thread's name is read while it runs: at the report it may be gone.
        auto it = procs_.find(e->tgid);
        if (it != procs_.end() && !it->second.thread_names.count(e->tid) &&
            it->second.thread_names.size() < TracedProcess::kMaxThreadNames)
            it->second.thread_names[e->tid] =
                host::read_thread_name(static_cast<int>(e->tgid), static_cast<int>(e->tid));
        const capture::SymbolInfo* info = symbols_.from_cookie(e->cookie);
        if (it != procs_.end() && info && info->role == CD_ROLE_SCOPE_BEGIN && !e->py_frames.empty() &&
            e->label.empty())
            python_.learn_scope_label(e->tgid, e->py_frames);
    }
    model_.on_event(ev);
}

// A record with a Python stack wakes this reader unless one did less than
// CD_CONTEXT_WAKE_NS ago; the records in between announce nothing.  After a
// poll that read records the next one waits no longer than that, so those
// are named within ~5 ms, while the code they name lives: a job's last
// collectives are followed at once by its interpreter's finalization, which
// frees __main__'s code objects (a wait of the caller's full timeout left
// them "<unknown>").
//
// A busy ring has records at every poll: polled back to back, each poll
// found a few, and its own work (this thread's CPU clock read twice, the
// liveness and loss checks: four system calls) cost more than they did.
// A poll after one that read records starts kBusyPollGap after it at the
// earliest: a thousand polls a second at most while records flow, each
// reading what a millisecond brought (the ring holds seconds of it), well
// within the 5 ms the records' naming waits at most.  Not after a poll that
// read a loader or fork event: under `run` the next one may come from a
// process stopped until it is read (a torch import is hundreds of them).
int TraceSession::poll(int timeout_ms) {
    if (read_last_ && !set_up_last_ && timeout_ms > 0) {
        const auto next = last_poll_ + kBusyPollGap;
        if (auto now = std::chrono::steady_clock::now(); now < next) {
            std::this_thread::sleep_for(next - now);
            const auto slept = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
            timeout_ms = std::max(0, timeout_ms - static_cast<int>(slept));
        }
    }
    last_poll_ = std::chrono::steady_clock::now();
    set_up_last_ = false;
    RecordSpan span(cost_);
    recheck_access();
    if (read_last_ && timeout_ms > kAfterReadMs) timeout_ms = kAfterReadMs;
    const int n = bpf_->poll(timeout_ms, [this] {
        if (auto now = std::chrono::steady_clock::now(); now - py_batch_began_ >= kPyBatch) {
            py_batch_began_ = now;
            python_.begin_batch();
        }
    });
    read_last_ = n > 0;
    python_.tell_code_kinds();
    // Parameters not readable yet are read again, kParamRetryEvery apart at
    // first and twice as far each time while some stay unreadable (up to
    // kParamRetryMax): the bounded tries then span FSDP2's whole first
    // forward, however slow the traced job runs (a root's children are asked
    // at its entry, a unit's unsharded parameters exist from its pre-forward).
    if (auto now = std::chrono::steady_clock::now(); now - params_retried_ >= params_retry_gap_) {
        params_retried_ = now;
        params_retry_gap_ = model_.retry_parameters() ? std::min(params_retry_gap_ * 2, kParamRetryMax) : kParamRetryEvery;
    }
    rescan_after_lost_loader_events();
    return n;
}

// A loader event the kernel could not send (the ring buffer was full) is a
// library mapped unseen: its probes, its Python and torch set-up would wait
// for the process's next dlopen, maybe forever.  Every live process is
// scanned again instead, once per poll that saw the loss grow.
void TraceSession::rescan_after_lost_loader_events() {
    const uint64_t lost = bpf_->drops_of(CD_DROP_DL_EVENT);  // once a poll: one map read
    if (lost == dl_events_lost_) return;
    dl_events_lost_ = lost;
    std::vector<uint32_t> live;
    for (const auto& [pid, p] : procs_)
        if (!p.exited && !p.withheld) live.push_back(pid);
    for (uint32_t pid : live) scan(pid);
}

void TraceSession::drain() {
    bpf_->set_armed(false);  // the window closes here, for every symbol at once
    RecordSpan span(cost_);
    draining_ = true;
    drained_.clear();
    while (bpf_->poll(0) > 0) {
    }
    draining_ = false;
    take_pending_batches();
    while (bpf_->poll(0) > 0) {
    }
    // A return-probed call sends its record when it returns: those still in
    // flight (a rank stuck in a collective) are read from the kernel's slots
    // and reported as open calls, as they were when the window closed.
    for (const capture::CallEnter& e : bpf_->open_calls())
        if (auto it = procs_.find(e.tgid); it != procs_.end() && !it->second.withheld)
            model_.on_event(capture::Event{e});
}

// Threads that have not left their CPU since their last batched record
// still hold it (bpf/lib/batch.h).  A batch sent while this reads came
// through the ring, before (drained_) or after (taken_): handled once.
void TraceSession::take_pending_batches() {
    taken_.clear();
    for (const cd_call& c : bpf_->pending_batches()) {
        const BatchKey key = batch_key(c);
        if (drained_.count(key)) continue;
        on_record(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&c), sizeof(c)));
        taken_.insert(key);
        ++cost_.batched_at_end;
    }
    drained_.clear();
}

void TraceSession::reset_window() {
    model_.reset();
    for (auto it = procs_.begin(); it != procs_.end();) {
        if (!it->second.exited) {
            ++it;
            continue;
        }
        bpf_->forget_process(it->first);
        python_.forget(it->first);
        torch_.forget(it->first);
        it = procs_.erase(it);
    }
}

void TraceSession::mark_from_start(int pid, bool from_start) {
    track(static_cast<uint32_t>(pid)).from_start = from_start;
}

void TraceSession::mark_exited(int pid, int wait_status) {
    auto& p = track(static_cast<uint32_t>(pid));
    p.exited = true;
    p.exit_code = wait_status;
    python_.exited(static_cast<uint32_t>(pid));
}

bool TraceSession::exited(int pid) const {
    auto it = procs_.find(static_cast<uint32_t>(pid));
    return it != procs_.end() && it->second.exited;
}

std::vector<std::string> TraceSession::take_messages() {
    std::vector<std::string> out;
    out.swap(messages_);
    return out;
}

std::vector<snapshot::ProcessSnapshot> TraceSession::reports() const {
    auto snapshot = bpf_->counter_snapshot();
    auto comms = bpf_->comms();
    std::vector<snapshot::ProcessSnapshot> out;
    for (const auto& [pid, p] : procs_) {
        snapshot::ProcessSnapshot r;
        r.pid = pid;
        r.command = p.command;
        r.exit_code = p.exit_code;
        r.libraries.assign(p.libraries.begin(), p.libraries.end());
        r.tree = model_.process(pid);
        r.kernel_dropped_records = bpf_->ringbuf_drops_of(pid);
        r.notes = p.notes;
        if (auto n = python_.resolver().cache_note(pid)) r.notes.push_back(std::move(*n));
        if (auto n = torch_.parameters_note(pid)) r.notes.push_back(std::move(*n));
        for (const auto& [tid, name] : p.thread_names)
            if (!name.empty()) r.thread_names[tid] = name;

        join_kernel_state(pid, snapshot, comms, r);
        if (r.tree) {
            auto items = fsdp::items_from_tree(*r.tree, symbols_);
            if (const fsdp::Profile* prof = fsdp::detect_profile(items, opts_.lifecycle_profiles))
                r.fsdp = fsdp::analyse(items, *prof,
                                            {.from_start = p.from_start,
                                             .records_lost = r.kernel_dropped_records + r.tree->dropped_total(),
                                             .process_ended = p.exited});
        }
        if (p.libraries.empty()) {
            // Each pattern once: two torch specs name the same library.
            std::string names;
            std::set<std::string> seen;
            for (const auto& s : attacher_.specs())
                for (const auto& l : s.library)
                    if (seen.insert(l).second) names += (names.empty() ? "" : ", ") + l;
            r.notes.push_back("pid " + std::to_string(pid) + " never mapped a library the probe specs name (" + names +
                              ") during the window — no collectives could be seen; is this the training process "
                              "rather than its launcher?");
        }
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace commdbg::session
