// SPDX-License-Identifier: Apache-2.0
#include "counter.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>

#include "bpf_py_maps.hpp"
#include "comm_registry.hpp"
#include "files.hpp"
#include "nccl.hpp"
#include "procfs.hpp"
#include "snapshot.hpp"
#include "text.hpp"
#include "trace_session.hpp"

namespace commdbg::daemon {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRefreshPeriod = std::chrono::milliseconds(500);
// Failures said in the log; past these only counted (status).
constexpr uint64_t kMaxFailureNotes = 8;
// Refreshes (500 ms apart) a process is tried for its tensors after its
// adoption: torch maps libc10 and libtorch within moments of each other.
constexpr int kTensorTries = 20;
// Exit events held until the next refresh; past it one refresh runs at once
// (and until then find_gone still finds the processes that are gone).
constexpr size_t kMaxPendingExits = 4096;

// One process's kernel counters, read apart from the main thread's refresh.
// A walk of a hash map restarts when the main thread deletes the key it
// stands on: what it saw twice is kept once.
capture::CounterSnapshot counters_of(const capture::BpfSession& bpf, uint32_t pid) {
    capture::CounterSnapshot all = bpf.counter_snapshot(), out;
    std::set<std::pair<std::string, bool>> seen;
    for (const capture::CounterEntry& c : all.entries) {
        if (c.key.tgid != pid) continue;
        std::string key(reinterpret_cast<const char*>(&c.key), sizeof(c.key));
        if (seen.emplace(std::move(key), c.coarse).second) out.entries.push_back(c);
    }
    if (auto it = all.loss.find(pid); it != all.loss.end()) out.loss.insert(*it);
    return out;
}

// The tests' fault injection: COMMDBG_TEST_FAILED_STOPS=N makes the kernel
// side take its first N stops for a new library file as refused.
uint32_t test_failed_stops() {
    const char* v = getenv("COMMDBG_TEST_FAILED_STOPS");
    return v ? static_cast<uint32_t>(strtoul(v, nullptr, 10)) : 0;
}

}  // namespace

Result<std::unique_ptr<NodeCounter>> NodeCounter::create(const NodeCounterOptions& opts) {
    using R = Result<std::unique_ptr<NodeCounter>>;
    std::unique_ptr<NodeCounter> n(new NodeCounter(opts));
    if (!opts.scope_cgroup.empty()) {
        auto scope = CgroupScope::open(opts.scope_cgroup);
        if (!scope) return R::fail(scope.error());
        n->scope_ = std::move(*scope);
    }
    std::vector<std::string> errors;
    auto specs = capture::select_specs(opts.probes, errors);
    if (!errors.empty()) return R::fail("commdbgd: " + errors.front());
    session::derive_unexported(specs);
    if (!opts.count_errors) {
        // The hot calls trap once, not twice; their errors go uncounted.
        for (auto& spec : specs)
            for (auto& rule : spec.symbols)
                if (rule.info.role == CD_ROLE_COLLECTIVE) rule.info.return_probe = false;
    }
    if (auto r = n->open_bpf(std::move(specs)); !r) return R::fail(r.error());
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    n->host_ = host;
    n->series_ = std::make_unique<SeriesExporter>(n->metrics_, n->symbols_, n->host_, opts.max_series,
                                                  opts.metric_label_sets_per_process);
    n->series_->describe();
    n->flights_ = std::make_unique<FlightWatch>(n->metrics_, n->host_);
    n->flights_->describe();
    n->scan_proc();
    n->refresh();
    return R(std::move(n));
}

Result<bool> NodeCounter::open_bpf(std::vector<capture::ProbeSpec> specs) {
    auto bpf = capture::BpfSession::open(capture::BpfOptions{opts_.ringbuf_bytes, true, scope_.fd(),
                                                             opts_.counter_keys_per_process, opts_.flight_recorder,
                                                             capture::file_prefixes_of(specs), test_failed_stops()});
    if (!bpf) return Result<bool>::fail(bpf.error());
    bpf_ = std::move(bpf.value());
    // Always on: armed before the first file is attached and never disarmed
    // while more are (a session's window is another BPF object).
    bpf_->set_armed(true);
    // After the load: the guard keeps only the stopped-pid map, never links.
    guard_ = std::make_unique<capture::ResumeGuard>();
    guard_->start_with_map(bpf_->stopped_pids_fd());
    const bool tensors = std::any_of(specs.begin(), specs.end(), [](const capture::ProbeSpec& s) { return s.c10d_tensors; });
    if (tensors && opts_.flight_recorder) {
        torch_maps_ = std::make_unique<session::BpfTorchMaps>(*bpf_);
        torch_ = std::make_unique<torch::TorchSupport>(*torch_maps_);
    }
    attacher_ = std::make_unique<capture::ProbeAttacher>(*bpf_, symbols_, std::move(specs));
    // 3/4 of the kernel's map of probed files for the users other than
    // root; the rest is root's.
    shares_ = FileShares(opts_.library_files_per_uid, bpf_->known_files_capacity() / 4 * 3);
    bpf_->set_event_handler([this](std::span<const uint8_t> b) { on_record(b); });
    return true;
}

NodeCounter::NodeCounter(const NodeCounterOptions& opts)
    : opts_(opts), metrics_(opts.max_series, opts.series_ttl), shares_(opts.library_files_per_uid, 0) {}

void NodeCounter::resume_stopped() {
    // Every process the hook stopped (the map's keys), each out of the map
    // once resumed: a pid left there could be another process's later.
    capture::resume_and_clear_map(bpf_->stopped_pids_fd());
}

void NodeCounter::stop_stopping_processes() {
    if (!bpf_ || stopping_.exchange(true)) return;
    bpf_->stop_stopping_at_new_files();
    resume_stopped();
}

NodeCounter::~NodeCounter() {
    if (!bpf_) return;
    // Nothing may stay stopped by us after a clean shutdown: the hook goes
    // first, then what it stopped is resumed, then the probes go.  A stop
    // made by a hook run still in flight meanwhile is resumed by the guard
    // once this process is wholly gone.
    stop_stopping_processes();
    attacher_.reset();
    resume_stopped();
    bpf_.reset();
    guard_->release();
}

void NodeCounter::log_notes(uint32_t pid, const std::vector<std::string>& notes) {
    for (const auto& n : notes) std::cerr << "commdbgd: pid " << pid << ": " << n << "\n";
}

void NodeCounter::scan_proc() {
    for (uint32_t pid : other_pids()) {
        if (!scope_.contains(pid)) continue;
        auto info = host::read_process(static_cast<int>(pid));
        const uint32_t uid = info ? info->uid : 0;
        auto r = attacher_->scan_process(static_cast<int>(pid), {shares_.room(uid), stop_flag_});
        if (!r) continue;
        charge_files(uid, pid, *r);
        if (!r->libraries.empty()) adopt(pid);
        log_notes(pid, r->notes);
    }
}

void NodeCounter::charge_files(uint32_t uid, uint32_t pid, const capture::ScanResult& scan) {
    const bool was_capped = shares_.capped(uid), others_were = shares_.others_capped();
    for (const auto& f : scan.attached_files) shares_.charge(uid, f);
    if (scan.files_over_limit) {
        shares_.refused(uid, scan.files_over_limit);
        if (!was_capped || others_were != shares_.others_capped())
            std::cerr << "commdbgd: pid " << pid << " (uid " << uid << "): " << scan.files_over_limit
                      << " new library file(s) not probed: uid " << uid << " holds " << shares_.held(uid)
                      << " probed files (at most " << opts_.library_files_per_uid
                      << " per user other than root); its further new files are neither probed nor stopped for "
                         "(commdbg status: library_file_shares)\n";
    }
    if (uid != 0 && shares_.capped(uid) != was_capped) bpf_->set_uid_capped(uid, shares_.capped(uid));
    if (shares_.others_capped() != others_were) bpf_->set_others_capped(shares_.others_capped());
}

void NodeCounter::adopt(uint32_t pid) {
    const uint64_t start = process_start_time(pid);
    std::lock_guard lock(mu_);
    if (auto it = procs_.find(pid); it != procs_.end()) {
        // The same pid, another process: its exit was missed.  A new one.
        if (start == 0 || it->second.start_time == 0 || it->second.start_time == start) return;
        metrics_.retire({pid, it->second.start_time}, Clock::now());
        series_->forget({pid, it->second.start_time});
        procs_.erase(it);
        exited_.erase(pid);  // that exit was the old process's, retired here
    }
    // In the filter too, so its exit is reported and its series retired.
    // Not there (the filter is full): not counted as adopted, or nothing
    // would ever retire it; the next refresh tries again.
    if (auto r = bpf_->trace_process(pid, CD_TRACE_COUNT | (opts_.flight_recorder ? CD_TRACE_FLIGHT : 0u)); !r) {
        if (++untraced_ <= kMaxFailureNotes)
            std::cerr << "commdbgd: pid " << pid << " is not counted: " << r.error()
                      << (untraced_ == kMaxFailureNotes ? " (further such failures are not logged)" : "") << "\n";
        return;
    }
    procs_.emplace(pid, read_counted_process(pid, start));
    if (torch_) tensor_tries_[pid] = kTensorTries;
}

void NodeCounter::setup_tensors(uint32_t pid) {
    if (auto note = torch_->setup(pid)) log_notes(pid, {*note});
    if (const torch::TensorLayout* l = torch_->layout(pid)) {
        std::lock_guard lock(mu_);  // counts() reads it
        if (auto it = procs_.find(pid); it != procs_.end()) it->second.tensors = *l;
        tensor_tries_.erase(pid);
    } else if (--tensor_tries_[pid] <= 0) {
        tensor_tries_.erase(pid);
    }
}

void NodeCounter::retry_tensors() {
    std::vector<uint32_t> pids;
    for (const auto& [pid, tries] : tensor_tries_) pids.push_back(pid);
    for (uint32_t pid : pids) setup_tensors(pid);
}

void NodeCounter::retire(ProcessKey key) {
    {
        std::lock_guard lock(mu_);
        auto it = procs_.find(key.pid);
        // Another process has the pid now (adopt retired this one).
        if (it == procs_.end() || it->second.start_time != key.start_time) return;
        procs_.erase(it);
        series_->forget(key);
    }
    metrics_.retire(key, Clock::now());
    if (torch_) {
        torch_->drop(key.pid);
        tensor_tries_.erase(key.pid);
    }
    bpf_->forget_process(key.pid);
    bpf_->untrace_process(key.pid);
}

void NodeCounter::on_record(std::span<const uint8_t> bytes) noexcept {
    // Called from inside ring_buffer__poll: nothing may unwind through it.
    auto failed = run_without_throwing([&] { handle_record(bytes); });
    if (!failed) return;
    if (++failed_records_ <= kMaxFailureNotes)
        (void)run_without_throwing([&] { std::cerr << "commdbgd: a ring-buffer record could not be handled: " << *failed << "\n"; });
}

void NodeCounter::handle_record(std::span<const uint8_t> bytes) {
    ++events_;
    capture::DecodeResult d = capture::decode(bytes);
    if (!d.event) {
        ++decode_errors_;
        return;
    }
    if (auto* dl = std::get_if<capture::DlChange>(&*d.event)) {
        on_loader_change(*dl);
    } else if (stopping()) {
        return;  // a shutdown only resumes what is stopped: no counts are read any more
    } else if (auto* seen = std::get_if<capture::ProcSeen>(&*d.event)) {
        adopt(seen->tgid);  // its labels, while it still runs
        // Its first probed call (a process group being made): its tensors
        // are readable before its first collective, not a refresh later.
        if (torch_ && tensor_tries_.count(seen->tgid)) setup_tensors(seen->tgid);
    } else if (auto* x = std::get_if<capture::ProcExit>(&*d.event)) {
        // Retired by the next refresh, after it has read the final counts:
        // one refresh for every exit of a poll, not one each (a storm of
        // short processes kept the main thread busy for a minute).
        if (exited_.size() < kMaxPendingExits) exited_.insert(x->tgid);
    }
}

void NodeCounter::on_loader_change(const capture::DlChange& dl) {
    // Resumed whatever happens here: a stopped process must not wait on a
    // scan that failed.
    struct Resume {
        NodeCounter& n;
        const capture::DlChange& dl;
        ~Resume() {
            if (!dl.stopped) return;
            // Out of stopped_pids first (resume_and_clear_map says why).
            n.bpf_->resumed(dl.tgid);
            kill(static_cast<pid_t>(dl.tgid), SIGCONT);
            ++n.resumed_;
        }
    } resume{*this, dl};
    if (stopping()) return;  // resumed at once: a shutdown waits on no scan
    if (!dl.stopped && ++unstopped_ <= kMaxFailureNotes)
        std::cerr << "commdbgd: pid " << dl.tgid << " maps a library file not probed yet and the kernel refused "
                  << "to stop it (tried up to " << CD_STOP_TRIES << " times): its calls until the file is probed "
                  << "are not counted (drop cause stop_refused)\n";
    if (dl.exec && torch_) forget_image(dl.tgid);
    const capture::ScanLimits limits{shares_.room(dl.uid), stop_flag_ ? stop_flag_ : &stopping_};
    auto r = attacher_->scan_process(static_cast<int>(dl.tgid), limits);
    if (!r) return;
    charge_files(dl.uid, dl.tgid, *r);
    log_notes(dl.tgid, r->notes);
    if (!r->libraries.empty() && scope_.contains(dl.tgid)) adopt(dl.tgid);
}

// pid exec'd: how its old image's tensors were read (a forked child's, set
// up from its parent's) goes, here and in the kernel; an adopted process's
// new image is set up again, as at its adoption.
void NodeCounter::forget_image(uint32_t pid) {
    torch_->drop(pid);
    std::lock_guard lock(mu_);  // counts() reads it
    auto it = procs_.find(pid);
    if (it == procs_.end()) return;
    it->second.tensors.reset();
    tensor_tries_[pid] = kTensorTries;
}

void NodeCounter::step(int timeout_ms) {
    bpf_->poll(timeout_ms);
    if (Clock::now() - last_refresh_ >= kRefreshPeriod || exited_.size() >= kMaxPendingExits) refresh();
}

std::vector<ProcessKey> NodeCounter::find_gone() {
    std::vector<ProcessKey> gone;
    std::lock_guard lock(mu_);
    // An exit event also names a zombie, which kill() still finds.
    for (const auto& [pid, p] : procs_)
        if (exited_.count(pid) || (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
            gone.push_back({pid, p.start_time});
    // Exits of processes never adopted: their kernel counters still go.
    for (uint32_t pid : exited_)
        if (!procs_.count(pid)) {
            bpf_->forget_process(pid);
            bpf_->untrace_process(pid);
        }
    exited_.clear();
    return gone;
}

void NodeCounter::refresh() {
    auto now = Clock::now();
    last_refresh_ = now;
    // A missed exit event must not leak: a process that is gone is retired.
    // Which are gone is decided before the counters are read, so the snapshot
    // holds their final counts: one that exits after the read would be
    // retired with the calls it made in between missing.
    const std::vector<ProcessKey> gone = find_gone();
    auto snapshot = bpf_->counter_snapshot();
    auto comms = bpf_->comms();
    std::set<uint32_t> counted;
    for (const auto& c : snapshot.entries) counted.insert(c.key.tgid);
    for (uint32_t pid : counted) adopt(pid);
    if (torch_) retry_tensors();
    SeriesExporter::CommsByPid nccl;
    for (const auto& [pid, p] : procs_) nccl[pid] = snapshot::communicators_of(pid, comms, snapshot.entries);
    std::vector<RankRecorder> recorders = read_recorders(nccl, comms);
    publish(snapshot, std::move(comms), nccl, now);
    {
        std::lock_guard lock(mu_);
        timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);  // bpf_ktime_get_ns's clock
        flights_->observe(recorders, static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec, now);
    }
    series_->export_node(bpf_->drops(), now);
    for (const ProcessKey& key : gone) retire(key);
    metrics_.expire(now);
    for (const auto& f : detach_deleted_files(*attacher_, *bpf_)) uncharge_file({f.dev, f.inode});
}

void NodeCounter::uncharge_file(FileShares::FileId f) {
    const std::optional<uint32_t> uid = shares_.owner(f);
    if (!uid) return;
    const bool was_capped = shares_.capped(*uid), others_were = shares_.others_capped();
    shares_.uncharge(f);
    if (was_capped && !shares_.capped(*uid)) bpf_->set_uid_capped(*uid, false);
    if (others_were && !shares_.others_capped()) bpf_->set_others_capped(false);
}

// What the control and HTTP threads read: the snapshot for counts and
// status, the series for /metrics.
void NodeCounter::publish(const capture::CounterSnapshot& snapshot, std::vector<capture::CommEntry> comms,
                          const SeriesExporter::CommsByPid& nccl, Clock::time_point now) {
    std::lock_guard lock(mu_);
    counters_ = snapshot.entries;
    counter_loss_ = snapshot.loss;
    comms_ = std::move(comms);
    files_ = attacher_->files();  // the attacher itself is the main thread's
    shares_json_ = shares_.to_json();
    known_files_ = {bpf_->known_files(), bpf_->known_files_capacity(), bpf_->known_files_full()};
    series_->export_counts(snapshot, nccl, procs_, now);
}

nlohmann::json NodeCounter::counts(std::optional<uint32_t> pid, bool by_comm, const ProcessFilter& may_see,
                                   bool flight) {
    {
        std::lock_guard lock(mu_);
        if (!pid || procs_.count(*pid))
            return counts_from({procs_, counters_, counter_loss_, comms_}, pid, by_comm, may_see, flight);
    }
    // Not adopted (yet: the main thread may be behind, or the filter full):
    // its kernel counters read now, so a live process is never answered
    // with none.
    std::map<uint32_t, CountedProcess> one;
    capture::CounterSnapshot snap;
    std::vector<capture::CommEntry> comms;
    const uint64_t start = process_start_time(*pid);
    if (start != 0 && scope_.contains(*pid)) {
        snap = counters_of(*bpf_, *pid);
        if (!snap.entries.empty()) {
            one.emplace(*pid, read_counted_process(*pid, start));
            comms = bpf_->comms();
        }
    }
    return counts_from({one, snap.entries, snap.loss, comms}, pid, by_comm, may_see, flight);
}

hang::Issued NodeCounter::issued(const CountedProcess& p, const cd_flight_entry& e) const {
    return issued_of(e, symbols_, p.tensors ? &*p.tensors : nullptr);
}

// A communicator's last collectives from the flight recorder, oldest first,
// named as the counters name them.
nlohmann::json NodeCounter::flight_entries(const CountedProcess& p, const std::vector<cd_flight_entry>& last) const {
    nlohmann::json out = nlohmann::json::array();
    for (const cd_flight_entry& e : last) {
        const capture::SymbolInfo* s = symbols_.find(e.sym);
        nlohmann::json j = issued(p, e).to_json();
        j["name"] = s ? s->name : std::string("?");
        j["tid"] = e.tid;
        j["enter_ns"] = e.enter_ns;
        if (e.state == CD_FLIGHT_RETURNED) j["return_ns"] = e.return_ns;
        out.push_back(std::move(j));
    }
    return out;
}

// Every adopted process's recorders of communicators with an id: those it
// created while commdbgd watched, numbered from their first collective on
// every rank alike.
std::vector<RankRecorder> NodeCounter::read_recorders(const SeriesExporter::CommsByPid& nccl,
                                                      const std::vector<capture::CommEntry>& comms) const {
    std::vector<RankRecorder> out;
    for (const auto& [pid, p] : procs_) {
        size_t n = 0;
        for (const NamedComm& c : named_comms(pid, p.c10d_job, nccl.at(pid), comms)) {
            if (c.id.empty() || n == kFlightCommsPerProcess) continue;
            std::optional<capture::BpfSession::FlightComm> fc = bpf_->flight_of(pid, c.ptr);
            if (!fc) continue;
            ++n;
            RankRecorder r{{pid, p.start_time}, c.id, c.rank, c.nranks, fc->seq, 0, {}};
            if (!fc->last.empty()) r.last_enter_ns = fc->last.back().enter_ns;
            for (const cd_flight_entry& e : fc->last) r.last.push_back(issued(p, e));
            out.push_back(std::move(r));
        }
    }
    return out;
}

std::vector<NodeCounter::NamedComm> NodeCounter::named_comms(uint32_t pid,
                                                              const std::string& c10d_job,
                                                              const std::vector<snapshot::CommInfo>& nccl,
                                                              const std::vector<capture::CommEntry>& comms) {
    std::vector<NamedComm> out;
    for (const snapshot::CommInfo& ci : nccl)
        out.push_back({ci.ptr, ci.id ? hex16(*ci.id) : "", ci.rank, ci.nranks, false, ""});
    for (const snapshot::C10dGroup& g : snapshot::c10d_groups_of(pid, comms))
        out.push_back({g.ptr, snapshot::c10d_comm_id(g, c10d_job).value_or(""), g.rank, g.nranks, true, g.name});
    return out;
}

nlohmann::json NodeCounter::counts_from(const CountsSource& src, std::optional<uint32_t> pid, bool by_comm,
                                        const ProcessFilter& may_see, bool flight) const {
    nlohmann::json procs = nlohmann::json::array();
    nlohmann::json by = nlohmann::json::object();  // comm id -> nranks, ranks
    for (const auto& [p, info] : src.procs) {
        if (pid && p != *pid) continue;
        if (may_see && !may_see(p)) continue;
        // The same snapshot the attach outputs read: counters joined with
        // communicators, summed by kind with the same keys.
        snapshot::ProcessSnapshot snap;
        snap.pid = p;
        join_kernel_state(p, src.counters, src.loss, src.comms, snap);
        nlohmann::json cc = nlohmann::json::object(), cb = nlohmann::json::object();
        for (const auto& [key, sum] : coll_summary(snap, symbols_)) {
            cc[key] = sum.calls;
            cb[key] = sum.bytes;
        }
        std::map<uint64_t, uint64_t> calls_by_comm;
        for (const snapshot::CounterRow& c : snap.counters) {
            const capture::SymbolInfo* s = symbols_.find(c.sym);
            if (s && s->role == CD_ROLE_COLLECTIVE) calls_by_comm[c.comm] += c.calls;
        }
        nlohmann::json env = nlohmann::json::object();
        for (const auto& [k, v] : info.env) env[k] = v;
        auto loss = src.loss.find(p);
        const capture::CounterLoss lost = loss == src.loss.end() ? capture::CounterLoss{} : loss->second;
        procs.push_back({{"pid", p},
                         {"command", info.command},
                         {"env", env},
                         {"comm_counts", cc},
                         {"comm_bytes", cb},
                         {"counter_breakdown_lost", lost.breakdown_lost},
                         {"counter_calls_lost", lost.uncounted}});
        if (!by_comm) continue;
        std::vector<capture::BpfSession::FlightComm> recorded;
        if (flight) recorded = bpf_->flight(p);
        for (const NamedComm& c : named_comms(p, info.c10d_job, snap.comms, src.comms)) {
            auto fc = std::find_if(recorded.begin(), recorded.end(),
                                   [&](const capture::BpfSession::FlightComm& f) { return f.comm == c.ptr; });
            // A c10d group is counted by kind, not by group: only its
            // recorder numbers its collectives (a 2.x backend, never issued
            // on directly, has none).
            if (c.c10d && fc == recorded.end()) continue;
            auto& entry = by[c.id.empty() ? "ptr:" + hex16(c.ptr) : c.id];
            if (c.nranks >= 0) entry["nranks"] = c.nranks;
            nlohmann::json rank = {{"rank", c.rank}, {"pid", p}, {"calls", c.c10d ? fc->seq : calls_by_comm[c.ptr]}};
            if (c.c10d) entry["c10d_group"] = c.name;
            if (fc != recorded.end()) rank["flight"] = {{"seq", fc->seq}, {"last", flight_entries(info, fc->last)}};
            entry["ranks"].push_back(std::move(rank));
        }
    }
    nlohmann::json out = {{"host", host_}, {"processes", procs}};
    if (by_comm) {
        nlohmann::json list = nlohmann::json::array();
        for (auto& [id, e] : by.items()) {
            e["comm_id"] = id;
            list.push_back(e);
        }
        out["communicators"] = list;
    }
    return out;
}

nlohmann::json NodeCounter::status_errors() const {
    nlohmann::json errors = nlohmann::json::array();
    if (known_files_.full)
        errors.push_back("the kernel's map of probed library files is full (" + std::to_string(known_files_.used) +
                         " of " + std::to_string(known_files_.capacity) +
                         "): a process that maps a library file probed since is stopped for it at every mapping — "
                         "restart commdbgd once unused NCCL copies are gone");
    if (shares_json_.value("others_capped", false))
        errors.push_back("users other than root hold their whole share of probed library files: new library files "
                         "of theirs are neither probed nor stopped for (library_file_shares)");
    return errors;
}

nlohmann::json NodeCounter::status() {
    std::lock_guard lock(mu_);
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : files_) files.push_back({{"spec", f.spec}, {"path", f.path}, {"probes", f.entry_probes}});
    nlohmann::json drops = nlohmann::json::object();
    auto d = bpf_->drops();
    for (uint32_t i = 0; i < d.size(); ++i) drops[capture::drop_cause_name(i)] = d[i];
    return {{"version", COMMDBG_VERSION},
            {"host", host_},
            {"uptime_s", std::chrono::duration<double>(Clock::now() - started_).count()},
            {"scope_cgroup", opts_.scope_cgroup},
            {"processes", procs_.size()},
            {"trace_failures", untraced_},
            {"library_files", files},
            {"events", events_},
            {"decode_errors", decode_errors_},
            {"failed_records", failed_records_},
            {"resumed_after_new_library", resumed_},
            {"drops", drops},
            {"series", metrics_.series()},
            {"series_overflow", metrics_.overflowed()},
            {"known_files", {{"used", known_files_.used}, {"capacity", known_files_.capacity}}},
            {"library_file_shares", shares_json_},
            {"collective_mismatches", flights_->mismatches()},
            {"errors", status_errors()}};
}

}  // namespace commdbg::daemon
