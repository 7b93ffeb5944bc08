// SPDX-License-Identifier: Apache-2.0
#include "fsdp_watch.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "procfs.hpp"
#include "text.hpp"

namespace commdbg::daemon {

namespace {

// How often processes not traced yet are looked at.  torch takes seconds to
// import after it maps libtorch_cpu, so a launcher is traced before it can
// spawn its ranks, which are then followed from their first instruction.
constexpr auto kScanPeriod = std::chrono::seconds(1);
// A process neither running Python nor mapping libtorch is read this many
// times (the first may fall between its exec and the loader's mapping),
// then again only after another exec (its comm changes).
constexpr int kLooks = 2;
// CPython processes traced before they load libtorch, at most: each costs a
// loader event per dlopen and a slot in the kernel's filter.
constexpr size_t kMaxWaiting = 1024;
constexpr uint64_t kMaxMessages = 32;
// A process with libtorch exited: the window ends once the other processes
// of its job have exited too (ranks end within moments of one another), or
// this long after, so that a rank still finishing its last step is not cut.
constexpr auto kExitGrace = std::chrono::seconds(5);

// Whether the maps file at `path` shows libtorch_cpu and CPython; false when
// it cannot be read; `any`: whether it held a line.  A plain search of the
// maps text: this runs for every process once a scan.
bool maps_file_shows(const char* path, bool& torch, bool& python, bool& any) {
    FILE* f = fopen(path, "re");
    if (!f) return false;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        any = true;
        if (strstr(line, "/libtorch_cpu.so")) torch = true;
        if (strstr(line, "/libpython3")) python = true;
    }
    fclose(f);
    return true;
}

// Whether the process maps libtorch_cpu, and whether it runs CPython.  Empty
// maps are a main thread that has exited while others run on: then a live
// thread's (procfs.hpp, memory_dir).
bool maps_show(uint32_t pid, bool& torch, bool& python) {
    const std::string dir = "/proc/" + std::to_string(pid);
    bool any = false;
    if (!maps_file_shows((dir + "/maps").c_str(), torch, python, any)) return false;
    if (any) return true;
    const std::string live = host::memory_dir(static_cast<int>(pid));
    return live == dir || maps_file_shows((live + "/maps").c_str(), torch, python, any);
}

// Whether the next window begins between two steps: the window's last
// micro-step was followed by its optimizer step (the lifecycle itself marks
// one cut by the window's end partial: unchecked, not compared across
// ranks); nullopt: unknown from this window (it saw no lifecycle event).
std::optional<bool> next_at_boundary(const fsdp::Findings& r) {
    if (r.micro_steps.empty()) return r.optimizer_steps > 0 ? std::optional<bool>(true) : std::nullopt;
    return r.micro_steps.back().global_step < static_cast<int>(r.optimizer_steps);
}

}  // namespace

Result<std::unique_ptr<FsdpWatch>> FsdpWatch::create(const FsdpWatchOptions& opts, MetricsRegistry& metrics,
                                                     std::string host) {
    using R = Result<std::unique_ptr<FsdpWatch>>;
    CgroupScope scope;
    if (!opts.scope_cgroup.empty()) {
        auto s = CgroupScope::open(opts.scope_cgroup);
        if (!s) return R::fail(s.error());
        scope = std::move(*s);
    }
    session::SessionOptions so;
    // What the checks read, as `commdbg check` traces it, less the Python
    // stacks: the scopes carry the labels.
    so.probes = {"nccl", "torch-c10d", "torch-scopes"};
    so.py_stack = python::PyStackMode::Off;
    // Always on: no program at every context switch of the host for batches
    // that its scopes' records would flush at once anyway.
    so.batch_records = false;
    so.limits.max_records = opts.max_records;
    auto session = session::TraceSession::create(so);
    if (!session) return R::fail("commdbgd: --fsdp-checks: " + session.error());
    std::unique_ptr<FsdpWatch> w(
        new FsdpWatch(opts, metrics, std::move(host), std::move(scope), std::move(session.value())));
    w->describe();
    return R(std::move(w));
}

FsdpWatch::FsdpWatch(const FsdpWatchOptions& opts, MetricsRegistry& metrics, std::string host, CgroupScope scope,
                     std::unique_ptr<session::TraceSession> session)
    : opts_(opts), metrics_(metrics), host_(std::move(host)), scope_(std::move(scope)), session_(std::move(session)) {}

void FsdpWatch::describe() {
    metrics_.describe("commdbg_fsdp_violations_total",
                      "FSDP lifecycle findings per check and unit (commdbgd --fsdp-checks); "
                      "grad_sync_non_final_micro_step is a warning",
                      "counter");
    metrics_.describe("commdbg_fsdp_steps_total", "Optimizer steps seen by the FSDP checks", "counter");
    metrics_.describe("commdbg_fsdp_windows_total",
                      "Windows in which the FSDP checks traced the process: its records analysed, then dropped",
                      "counter");
    metrics_.describe("commdbg_fsdp_unchecked_windows_total",
                      "Windows whose findings were not counted: records were lost (budget or ring buffer)", "counter");
    metrics_.describe("commdbg_fsdp_records_released_total",
                      "Records analysed by the FSDP checks and dropped at the end of their window", "counter");
    metrics_.describe("commdbg_fsdp_window_records", "Records held by the FSDP checks when the last window ended",
                      "gauge");
    metrics_.describe("commdbg_fsdp_traced_processes", "Processes the FSDP checks trace now", "gauge");
}

void FsdpWatch::run(const std::atomic<bool>& stop) {
    while (!stop) {
        session_->poll(100);
        log_messages();
        const auto now = Clock::now();
        if (now - last_scan_ >= kScanPeriod) {
            discover();
            last_scan_ = now;
        }
        if (!exit_seen_ && lifecycle_exited()) exit_seen_ = now;
        const bool exit_due = exit_seen_ && (now - *exit_seen_ >= kExitGrace || jobs_ended());
        if (exit_due || now - window_start_ >= opts_.window) {
            end_window();
            exit_seen_.reset();
        }
    }
}

void FsdpWatch::discover() {
    const auto& traced = session_->processes();
    size_t waiting = 0;
    for (const auto& [pid, p] : traced) waiting += p.libraries.empty() && !p.exited;
    std::unordered_map<uint32_t, Looked> still;
    for (uint32_t pid : other_pids()) {
        if (traced.count(pid)) continue;
        auto stat = host::read_stat(static_cast<int>(pid));
        if (!stat) continue;
        const std::string& comm = stat->comm;
        const uint64_t start = stat->start_time;
        Looked l;
        if (auto it = looked_.find(pid); it != looked_.end() && it->second.start == start && it->second.comm == comm)
            l = it->second;
        l.start = start;
        l.comm = comm;
        if (l.times >= kLooks) {
            still.emplace(pid, std::move(l));
            continue;
        }
        ++l.times;
        bool torch = false, python = comm.rfind("python", 0) == 0;
        if (!maps_show(pid, torch, python)) continue;
        if ((torch || (python && waiting < kMaxWaiting)) && scope_.contains(pid) && consider(pid, torch)) {
            waiting += !torch;
            continue;
        }
        still.emplace(pid, std::move(l));
    }
    looked_.swap(still);  // gone processes are forgotten
    sync_processes();
}

bool FsdpWatch::consider(uint32_t pid, bool torch) {
    auto r = session_->add_process(static_cast<int>(pid), /*follow=*/true, /*dl_stop=*/false);
    if (!r) {
        // Gone between the scan and now: nothing to say.
        if (auto info = host::read_process(static_cast<int>(pid)); !info || info->state == 'Z') return false;
        if (++messages_logged_ <= kMaxMessages)
            std::cerr << "commdbgd: fsdp: pid " << pid << " is not checked: " << r.error() << "\n";
        return false;
    }
    // Traced before it loaded libtorch: its first step begins in the window.
    if (!torch) session_->mark_from_start(static_cast<int>(pid));
    return true;
}

void FsdpWatch::sync_processes() {
    for (const auto& [pid, p] : session_->processes()) {
        auto [it, fresh] = watched_.try_emplace(pid);
        Watched& w = it->second;
        if (fresh) {
            w.key = {pid, process_start_time(pid)};
            w.at_boundary = p.from_start;
            if (auto info = host::read_process(static_cast<int>(pid))) w.parent = static_cast<uint32_t>(info->ppid);
        }
        // After its exec and the load of libtorch, its environment is the job's.
        if (!w.labelled && !p.libraries.empty() && !p.exited) {
            w.labels = read_counted_process(pid, w.key.start_time);
            w.labelled = true;
        }
    }
}

bool FsdpWatch::lifecycle_exited() {
    for (const auto& [pid, p] : session_->processes())
        if (p.exited && !p.libraries.empty()) return true;
    return false;
}

bool FsdpWatch::jobs_ended() {
    sync_processes();
    std::set<uint32_t> ended, running;  // jobs by parent
    for (const auto& [pid, p] : session_->processes()) {
        if (p.libraries.empty()) continue;
        (p.exited ? ended : running).insert(watched_.at(pid).parent);
    }
    return std::none_of(ended.begin(), ended.end(), [&](uint32_t job) { return running.count(job); });
}

void FsdpWatch::end_window() {
    // What the ring buffer holds already belongs to this window.
    for (int i = 0; i < 64 && session_->poll(0) > 0; ++i) {
    }
    // A missed exit event must not keep a process forever.
    for (const auto& [pid, p] : session_->processes())
        if (!p.exited && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
            session_->mark_exited(static_cast<int>(pid), 0);
    sync_processes();
    uint64_t held = 0;
    auto analysed = analyse_all(held);
    cross_check(analysed);
    session_->reset_window();
    records_released_ += held;
    ++windows_;
    const auto now = Clock::now();
    export_metrics(now, held);
    for (auto it = watched_.begin(); it != watched_.end();) {
        if (session_->processes().count(it->first)) {
            ++it;
            continue;
        }
        metrics_.retire(it->second.key, now);  // its series stay for --series-ttl
        it = watched_.erase(it);
    }
    window_start_ = now;
}

std::vector<FsdpWatch::Analysed> FsdpWatch::analyse_all(uint64_t& held) {
    std::vector<Analysed> out;
    // The session analyses each process's lifecycle in reports(); its first
    // step is checked where this window began between two steps.
    for (const auto& [pid, w] : watched_)
        if (session_->processes().count(pid)) session_->mark_from_start(static_cast<int>(pid), w.at_boundary);
    for (snapshot::ProcessSnapshot& r : session_->reports()) {
        auto it = watched_.find(r.pid);
        if (it == watched_.end() || !r.tree) continue;
        Watched& w = it->second;
        ++w.windows;
        held += r.tree->records().size();
        const bool lost = r.tree->dropped_total() > 0 || r.kernel_dropped_records > w.kernel_drops;
        w.kernel_drops = r.kernel_dropped_records;
        if (!r.fsdp) {
            if (lost) w.at_boundary = false;
            continue;
        }
        const bool began_at_boundary = w.at_boundary;
        Analysed a{r.pid, std::move(*r.fsdp), !lost};
        if (auto next = next_at_boundary(a.report)) w.at_boundary = *next;
        if (lost) w.at_boundary = false;  // the window's end state is not known
        // Steps numbered from the process's first window, so that ranks cut
        // at different points are still compared step by step; the first
        // step of a window begun mid-step is compared by none.
        for (fsdp::MicroStep& m : a.report.micro_steps) {
            if (!began_at_boundary && m.global_step == 0) m.partial = true;
            m.global_step += static_cast<int>(w.step_offset);
        }
        w.step_offset += a.report.optimizer_steps;
        count(w, a);
        out.push_back(std::move(a));
    }
    return out;
}

void FsdpWatch::count(Watched& w, const Analysed& a) {
    w.lifecycle = true;
    w.steps += a.report.optimizer_steps;
    if (!a.checked) {
        ++w.unchecked;
        return;
    }
    auto add = [&](const fsdp::Finding& f) { add_finding(w, f.check, f.unit); };
    std::for_each(a.report.violations.begin(), a.report.violations.end(), add);
    std::for_each(a.report.warnings.begin(), a.report.warnings.end(), add);
}

void FsdpWatch::add_finding(Watched& w, const std::string& check, const std::string& unit) {
    std::pair<std::string, std::string> key{check, unit};
    // Past its share of label sets a process's findings keep their check only.
    if (!w.findings.count(key) && w.findings.size() >= opts_.label_sets_per_process) key.second.clear();
    ++w.findings[key];
}

void FsdpWatch::cross_check(std::vector<Analysed>& analysed) {
    // A job: the processes of one parent (torchrun's agent, the launcher of
    // torch.multiprocessing, slurmstepd), in RANK order where the
    // environment says it, else in pid order.
    std::map<uint32_t, std::vector<const Analysed*>> jobs;
    for (const Analysed& a : analysed)
        if (a.checked) jobs[watched_.at(a.pid).parent].push_back(&a);
    for (auto& [parent, ranks] : jobs) {
        if (ranks.size() < 2) continue;
        auto rank_of = [&](const Analysed* a) {
            const auto& env = watched_.at(a->pid).labels.env;
            auto e = env.find("RANK");
            return std::make_pair(e == env.end() ? -1L : strtol(e->second.c_str(), nullptr, 10), a->pid);
        };
        std::sort(ranks.begin(), ranks.end(), [&](auto* x, auto* y) { return rank_of(x) < rank_of(y); });
        auto name = [&](const Analysed* a) {
            const long rank = rank_of(a).first;
            return (rank >= 0 ? "rank " + std::to_string(rank) + " " : std::string()) + "(pid " +
                   std::to_string(a->pid) + ")";
        };
        const fsdp::RankView ref{name(ranks[0]), &ranks[0]->report};
        for (size_t i = 1; i < ranks.size(); ++i)
            for (const fsdp::Finding& f : fsdp::cross_rank({ref, {name(ranks[i]), &ranks[i]->report}}))
                add_finding(watched_.at(ranks[i]->pid), f.check, f.unit);
    }
}

Labels FsdpWatch::labels_of(const Watched& w) const {
    Labels labels = {{"pid", std::to_string(w.key.pid)}, {"host", host_}};
    for (const auto& k : kLabelEnv) {
        auto e = w.labels.env.find(k);
        labels.emplace_back("env_" + lower(k), e == w.labels.env.end() ? "" : e->second);
    }
    return labels;
}

void FsdpWatch::export_metrics(Clock::time_point now, uint64_t held) {
    for (const auto& [pid, w] : watched_) {
        if (!w.lifecycle) continue;
        const Labels base = labels_of(w);
        for (const auto& [key, n] : w.findings) {
            Labels l = {{"check", key.first}, {"unit", key.second}};
            l.insert(l.end(), base.begin(), base.end());
            metrics_.set("commdbg_fsdp_violations_total", l, static_cast<double>(n), w.key, now);
        }
        metrics_.set("commdbg_fsdp_steps_total", base, static_cast<double>(w.steps), w.key, now);
        metrics_.set("commdbg_fsdp_windows_total", base, static_cast<double>(w.windows), w.key, now);
        metrics_.set("commdbg_fsdp_unchecked_windows_total", base, static_cast<double>(w.unchecked), w.key, now);
    }
    const Labels node = {{"host", host_}};
    metrics_.set("commdbg_fsdp_records_released_total", node, static_cast<double>(records_released_), 0, now);
    metrics_.set("commdbg_fsdp_window_records", node, static_cast<double>(held), 0, now);
    metrics_.set("commdbg_fsdp_traced_processes", node, static_cast<double>(session_->processes().size()), 0, now);
}

void FsdpWatch::log_messages() {
    for (const auto& m : session_->take_messages()) {
        if (++messages_logged_ <= kMaxMessages)
            std::cerr << "commdbgd: fsdp: " << m << "\n";
        else if (messages_logged_ == kMaxMessages + 1)
            std::cerr << "commdbgd: fsdp: further tracing messages are not logged\n";
    }
}

}  // namespace commdbg::daemon
