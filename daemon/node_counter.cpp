// SPDX-License-Identifier: Apache-2.0
#include "node_counter.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "comm_registry.hpp"
#include "events.hpp"
#include "nccl.hpp"
#include "procfs.hpp"

namespace commdbg {

const std::vector<std::string> kLabelEnv = {"RANK",         "LOCAL_RANK",         "WORLD_SIZE", "GROUP_RANK",
                                            "MASTER_ADDR", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"};

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRefreshPeriod = std::chrono::milliseconds(500);
constexpr size_t kFamilies = 3;  // calls, bytes, errors: series per label set

std::string hex(uint64_t v) {
    char b[24];
    snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(v));
    return b;
}

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    return s;
}

// /proc/PID/stat field 22 (start time, clock ticks after boot); 0 if unreadable.
uint64_t process_start_time(uint32_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(in, line)) return 0;
    size_t paren = line.rfind(')');  // comm may hold spaces and parentheses
    if (paren == std::string::npos) return 0;
    std::istringstream rest(line.substr(paren + 1));
    std::string field;
    for (int i = 3; i <= 22; ++i)
        if (!(rest >> field)) return 0;
    return strtoull(field.c_str(), nullptr, 10);
}

// Mount point of the cgroup v2 hierarchy that holds `path`.
std::string cgroup2_mount_for(const std::string& path) {
    std::ifstream in("/proc/self/mountinfo");
    std::string line, best;
    while (std::getline(in, line)) {
        // ... mountpoint ... - fstype source options
        std::istringstream ss(line);
        std::string id, parent, dev, root, mp;
        ss >> id >> parent >> dev >> root >> mp;
        auto dash = line.find(" - ");
        if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
        if (path.rfind(mp, 0) == 0 && mp.size() > best.size()) best = mp;
    }
    return best;
}

}  // namespace

Result<std::unique_ptr<NodeCounter>> NodeCounter::create(const NodeCounterOptions& opts) {
    using R = Result<std::unique_ptr<NodeCounter>>;
    std::unique_ptr<NodeCounter> n(new NodeCounter(opts));
    if (!opts.scope_cgroup.empty()) {
        n->scope_fd_ = ::open(opts.scope_cgroup.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (n->scope_fd_ < 0)
            return R::fail("commdbgd: --scope-cgroup " + opts.scope_cgroup + ": " + std::strerror(errno) +
                           " — give a cgroup v2 directory, e.g. /sys/fs/cgroup/unified/job1");
        std::string mp = cgroup2_mount_for(opts.scope_cgroup);
        if (mp.empty())
            return R::fail("commdbgd: --scope-cgroup " + opts.scope_cgroup +
                           ": not inside a cgroup v2 hierarchy — give a directory under the cgroup2 mount");
        n->scope_rel_ = opts.scope_cgroup.substr(mp.size());
        while (n->scope_rel_.size() > 1 && n->scope_rel_.back() == '/') n->scope_rel_.pop_back();
        if (n->scope_rel_.empty()) n->scope_rel_ = "/";
    }
    std::vector<std::string> errors;
    auto specs = select_specs(opts.probes, errors);
    if (!errors.empty()) return R::fail("commdbgd: " + errors.front());
    if (!opts.count_errors) {
        // The hot calls trap once, not twice; their errors go uncounted.
        for (auto& spec : specs)
            for (auto& rule : spec.symbols)
                if (rule.info.role == CD_ROLE_COLLECTIVE) rule.info.return_probe = false;
    }
    auto bpf = BpfSession::open(BpfOptions{opts.ringbuf_bytes, true, n->scope_fd_, opts.counter_keys_per_process});
    if (!bpf) return R::fail(bpf.error());
    n->bpf_ = std::move(bpf.value());
    // Always on: armed before the first file is attached and never disarmed
    // while more are (a session's window is another BPF object).
    n->bpf_->set_armed(true);
    // After the load: the guard keeps only the stopped-pid map, never links.
    n->guard_ = std::make_unique<ResumeGuard>();
    n->guard_->start_with_map(n->bpf_->stopped_pids_fd());
    n->attacher_ = std::make_unique<ProbeAttacher>(*n->bpf_, n->symbols_, std::move(specs));
    n->bpf_->set_event_handler([p = n.get()](std::span<const uint8_t> b) { p->on_record(b); });
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    n->host_ = host;
    n->metrics_.describe("commdbg_collective_calls_total", "Collective calls, exact (kernel counters)", "counter");
    n->metrics_.describe("commdbg_collective_bytes_total", "Bytes of collective calls: count x datatype size", "counter");
    n->metrics_.describe("commdbg_collective_errors_total", "Collective calls that returned an error", "counter");
    n->metrics_.describe("commdbg_counter_breakdown_lost_total",
                         "Calls of the process counted without communicator and datatype: its share of kernel "
                         "counter keys was used up or the node's counter map was full",
                         "counter");
    n->metrics_.describe("commdbg_events_dropped_total", "Kernel-side losses by cause", "counter");
    n->metrics_.describe("commdbg_processes", "Processes counted now", "gauge");
    n->metrics_.describe("commdbg_build_info", "commdbg version", "gauge");
    n->scan_proc();
    n->refresh();
    return R(std::move(n));
}

NodeCounter::~NodeCounter() {
    if (!bpf_) return;
    // Nothing may stay stopped by us after a clean shutdown.
    resume_all_in_map(bpf_->stopped_pids_fd());
    if (scope_fd_ >= 0) close(scope_fd_);
}

bool NodeCounter::in_scope(uint32_t pid) const {
    if (scope_rel_.empty()) return true;
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("0::", 0) != 0) continue;
        std::string rel = line.substr(3);
        if (scope_rel_ == "/") return true;
        return rel == scope_rel_ || rel.rfind(scope_rel_ + "/", 0) == 0;
    }
    return false;
}

void NodeCounter::scan_proc() {
    DIR* d = opendir("/proc");
    if (!d) return;
    std::vector<uint32_t> pids;
    while (dirent* e = readdir(d)) {
        char* end = nullptr;
        unsigned long pid = strtoul(e->d_name, &end, 10);
        if (end && *end == '\0' && pid > 0 && pid != static_cast<unsigned long>(getpid())) pids.push_back(pid);
    }
    closedir(d);
    for (uint32_t pid : pids) {
        if (!in_scope(pid)) continue;
        auto r = attacher_->scan_process(static_cast<int>(pid));
        if (r && !r->libraries.empty()) adopt(pid);
        if (r)
            for (const auto& n : r->notes) std::cerr << "commdbgd: pid " << pid << ": " << n << "\n";
    }
}

void NodeCounter::adopt(uint32_t pid) {
    const uint64_t start = process_start_time(pid);
    std::lock_guard lock(mu_);
    if (auto it = procs_.find(pid); it != procs_.end()) {
        // The same pid, another process: its exit was missed.  A new one.
        if (start == 0 || it->second.start_time == 0 || it->second.start_time == start) return;
        metrics_.retire({pid, it->second.start_time}, Clock::now());
        label_sets_.erase({pid, it->second.start_time});
        procs_.erase(it);
    }
    CountedProcess p;
    p.pid = pid;
    p.start_time = start;
    if (auto info = read_process(static_cast<int>(pid))) {
        p.uid = info->uid;
        p.command = info->cmdline.empty() ? info->comm : info->cmdline;
    }
    p.env = read_environ(static_cast<int>(pid), kLabelEnv);
    procs_.emplace(pid, std::move(p));
    // In the filter too, so its exit is reported and its series retired.
    bpf_->trace_process(pid, CD_TRACE_COUNT);
}

void NodeCounter::retire(uint32_t pid) {
    uint64_t start = 0;
    {
        std::lock_guard lock(mu_);
        if (auto it = procs_.find(pid); it != procs_.end()) start = it->second.start_time;
    }
    metrics_.retire({pid, start}, Clock::now());
    bpf_->forget_process(pid);
    bpf_->untrace_process(pid);
    std::lock_guard lock(mu_);
    procs_.erase(pid);
    label_sets_.erase({pid, start});
}

void NodeCounter::on_record(std::span<const uint8_t> bytes) {
    ++events_;
    DecodeResult d = decode(bytes);
    if (!d.event) {
        ++decode_errors_;
        return;
    }
    if (auto* dl = std::get_if<DlChange>(&*d.event)) {
        auto r = attacher_->scan_process(static_cast<int>(dl->tgid));
        if (r)
            for (const auto& n : r->notes) std::cerr << "commdbgd: pid " << dl->tgid << ": " << n << "\n";
        if (r && !r->libraries.empty() && in_scope(dl->tgid)) adopt(dl->tgid);
        if (dl->stopped) {
            kill(static_cast<pid_t>(dl->tgid), SIGCONT);
            bpf_->resumed(dl->tgid);
            ++resumed_;
        }
    } else if (auto* seen = std::get_if<ProcSeen>(&*d.event)) {
        adopt(seen->tgid);  // its labels, while it still runs
    } else if (auto* x = std::get_if<ProcExit>(&*d.event)) {
        refresh();  // the final counts, before they are forgotten
        retire(x->tgid);
    }
}

void NodeCounter::step(int timeout_ms) {
    bpf_->poll(timeout_ms);
    if (Clock::now() - last_refresh_ >= kRefreshPeriod) refresh();
}

void NodeCounter::refresh() {
    auto now = Clock::now();
    last_refresh_ = now;
    // A missed exit event must not leak: a process that is gone is retired.
    // Which are gone is decided before the counters are read, so the snapshot
    // holds their final counts: one that exits after the read would be
    // retired with the calls it made in between missing.
    std::vector<uint32_t> gone;
    {
        std::lock_guard lock(mu_);
        for (const auto& [pid, p] : procs_)
            if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) gone.push_back(pid);
    }
    auto snapshot = bpf_->counter_snapshot();
    const auto& counters = snapshot.entries;
    auto comms = bpf_->comms();
    std::set<uint32_t> seen;
    for (const auto& c : counters) seen.insert(c.key.tgid);
    for (uint32_t pid : seen) adopt(pid);
    std::map<uint32_t, std::vector<CommInfo>> comm_info;
    {
        std::lock_guard lock(mu_);
        counters_ = counters;
        counter_loss_ = snapshot.loss;
        comms_ = comms;
        files_ = attacher_->files();  // the attacher itself is the main thread's
        // Several counters can fall into one series (a coarse counter, label
        // sets past a process's share): summed before they are set.
        struct Sum {
            ProcessKey owner;
            uint64_t calls = 0, bytes = 0, errors = 0;
        };
        std::map<Labels, Sum> series;
        // New label sets only while they leave a quarter of --max-series for
        // the series per collective of every process (its counts per kind).
        const size_t fine_room = opts_.max_series - opts_.max_series / 4;
        size_t exported = metrics_.series();
        for (const auto& c : counters) {
            const SymbolInfo* s = symbols_.find(c.key.sym);
            if (!s || s->role != CD_ROLE_COLLECTIVE) continue;
            auto pit = procs_.find(c.key.tgid);
            if (pit == procs_.end()) continue;
            const ProcessKey owner{c.key.tgid, pit->second.start_time};
            if (!comm_info.count(c.key.tgid)) comm_info[c.key.tgid] = communicators_of(c.key.tgid, comms, counters);
            std::string comm = c.key.comm ? "ptr:" + hex(c.key.comm) : "";
            std::string rank, nranks;
            for (const auto& ci : comm_info[c.key.tgid]) {
                if (ci.ptr != c.key.comm) continue;
                if (ci.id) comm = hex(*ci.id);
                if (ci.rank >= 0) rank = std::to_string(ci.rank);
                if (ci.nranks >= 0) nranks = std::to_string(ci.nranks);
            }
            auto dt = nccl_datatype_name(c.key.dtype);
            std::string dtype = c.key.dtype == CD_DTYPE_NONE ? "" : dt ? std::string(*dt) : std::to_string(c.key.dtype);
            const std::string collective(coll_name(s->coll));
            if (!dtype.empty() || !comm.empty() || !rank.empty() || !nranks.empty()) {
                auto& sets = label_sets_[owner];
                std::string set = s->layer + '\0' + collective + '\0' + dtype + '\0' + comm + '\0' + rank + '\0' + nranks;
                const bool room = sets.size() < opts_.metric_label_sets_per_process && exported + kFamilies <= fine_room;
                if (!sets.count(set) && room) {
                    sets.insert(std::move(set));
                    exported += kFamilies;
                } else if (!sets.count(set)) {
                    dtype.clear(), comm.clear(), rank.clear(), nranks.clear();
                }
            }
            Labels labels = {{"layer", s->layer}, {"collective", collective}, {"dtype", dtype},
                             {"comm", comm},      {"rank", rank},             {"nranks", nranks},
                             {"pid", std::to_string(c.key.tgid)},             {"host", host_}};
            for (const auto& k : kLabelEnv) {
                auto e = pit->second.env.find(k);
                labels.emplace_back("env_" + lower(k), e == pit->second.env.end() ? "" : e->second);
            }
            Sum& sum = series[std::move(labels)];
            sum.owner = owner;
            sum.calls += c.val.calls;
            sum.bytes += c.val.bytes;
            sum.errors += c.val.errors;
        }
        for (const auto& [labels, sum] : series) {
            metrics_.set("commdbg_collective_calls_total", labels, static_cast<double>(sum.calls), sum.owner, now);
            metrics_.set("commdbg_collective_bytes_total", labels, static_cast<double>(sum.bytes), sum.owner, now);
            metrics_.set("commdbg_collective_errors_total", labels, static_cast<double>(sum.errors), sum.owner, now);
        }
        for (const auto& [pid, loss] : snapshot.loss) {
            auto pit = procs_.find(pid);
            if (pit == procs_.end()) continue;
            metrics_.set("commdbg_counter_breakdown_lost_total", {{"pid", std::to_string(pid)}, {"host", host_}},
                         static_cast<double>(loss.breakdown_lost), ProcessKey{pid, pit->second.start_time}, now);
        }
        metrics_.set("commdbg_processes", {{"host", host_}}, static_cast<double>(procs_.size()), 0, now);
    }
    auto drops = bpf_->drops();
    for (uint32_t i = 0; i < drops.size(); ++i)
        metrics_.set("commdbg_events_dropped_total", {{"cause", drop_cause_name(i)}, {"host", host_}},
                     static_cast<double>(drops[i]), 0, now);
    metrics_.set("commdbg_build_info", {{"version", COMMDBG_VERSION}, {"host", host_}}, 1, 0, now);
    for (uint32_t pid : gone) retire(pid);
    metrics_.expire(now);
    detach_deleted_files();
}

void NodeCounter::detach_deleted_files() {
    // Cheap test first: is each probed file still there under its path?
    auto replaced = [](const AttachedFile& f) {
        struct stat st {};
        return ::stat(f.path.c_str(), &st) != 0 || st.st_ino != f.inode || st.st_dev != f.dev;
    };
    bool any = false;
    for (const auto& f : attacher_->files()) any = any || replaced(f);
    if (!any) return;
    // Only then the costly one: which (dev, inode) does any process still map?
    // By inode alone: the device in /proc/PID/maps can differ from st_dev
    // (overlayfs), and keeping a file attached too long is the safe mistake.
    std::set<uint64_t> mapped;
    if (DIR* d = opendir("/proc")) {
        while (dirent* e = readdir(d)) {
            char* end = nullptr;
            long pid = strtol(e->d_name, &end, 10);
            if (!end || *end || pid <= 0) continue;
            auto maps = read_maps(static_cast<int>(pid));
            if (!maps) continue;
            for (const auto& m : *maps)
                if (m.inode) mapped.insert(m.inode);
        }
        closedir(d);
    }
    auto gone = attacher_->detach_files(
        [&](const AttachedFile& f) { return replaced(f) && !mapped.count(f.inode); });
    for (const auto& f : gone) bpf_->forget_known_file(f.dev, f.inode);
}

std::optional<uint32_t> NodeCounter::owner_of(uint32_t pid) {
    auto info = read_process(static_cast<int>(pid));
    if (!info) return std::nullopt;
    return info->uid;
}

nlohmann::json NodeCounter::counts(std::optional<uint32_t> pid, bool by_comm, std::optional<uint32_t> only_uid) {
    std::lock_guard lock(mu_);
    nlohmann::json procs = nlohmann::json::array();
    nlohmann::json by = nlohmann::json::object();  // comm id -> nranks, ranks
    for (const auto& [p, info] : procs_) {
        if (pid && p != *pid) continue;
        if (only_uid && info.uid != *only_uid) continue;
        nlohmann::json cc = nlohmann::json::object(), cb = nlohmann::json::object();
        std::map<uint64_t, uint64_t> calls_by_comm;
        for (const auto& c : counters_) {
            if (c.key.tgid != p) continue;
            const SymbolInfo* s = symbols_.find(c.key.sym);
            if (!s || s->role != CD_ROLE_COLLECTIVE) continue;
            std::string key = s->layer + "." + std::string(coll_name(s->coll));
            cc[key] = cc.value(key, 0ull) + c.val.calls;
            cb[key] = cb.value(key, 0ull) + c.val.bytes;
            calls_by_comm[c.key.comm] += c.val.calls;
        }
        nlohmann::json env = nlohmann::json::object();
        for (const auto& [k, v] : info.env) env[k] = v;
        auto loss = counter_loss_.find(p);
        const CounterLoss lost = loss == counter_loss_.end() ? CounterLoss{} : loss->second;
        procs.push_back({{"pid", p},
                         {"command", info.command},
                         {"env", env},
                         {"comm_counts", cc},
                         {"comm_bytes", cb},
                         {"counter_breakdown_lost", lost.breakdown_lost},
                         {"counter_calls_lost", lost.uncounted}});
        if (!by_comm) continue;
        for (const auto& ci : communicators_of(p, comms_, counters_)) {
            std::string id = ci.id ? hex(*ci.id) : "ptr:" + hex(ci.ptr);
            auto& entry = by[id];
            if (ci.nranks >= 0) entry["nranks"] = ci.nranks;
            entry["ranks"].push_back({{"rank", ci.rank}, {"pid", p}, {"calls", calls_by_comm[ci.ptr]}});
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

nlohmann::json NodeCounter::status() {
    std::lock_guard lock(mu_);
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : files_) files.push_back({{"spec", f.spec}, {"path", f.path}, {"probes", f.entry_probes}});
    nlohmann::json drops = nlohmann::json::object();
    auto d = bpf_->drops();
    for (uint32_t i = 0; i < d.size(); ++i) drops[drop_cause_name(i)] = d[i];
    return {{"version", COMMDBG_VERSION},
            {"host", host_},
            {"uptime_s", std::chrono::duration<double>(Clock::now() - started_).count()},
            {"scope_cgroup", opts_.scope_cgroup},
            {"processes", procs_.size()},
            {"library_files", files},
            {"events", events_},
            {"decode_errors", decode_errors_},
            {"resumed_after_new_library", resumed_},
            {"drops", drops},
            {"series", metrics_.series()},
            {"series_overflow", metrics_.overflowed()}};
}

}  // namespace commdbg
