// SPDX-License-Identifier: Apache-2.0
#include "series.hpp"

#include <cstdio>

#include "comm_registry.hpp"
#include "nccl.hpp"
#include "text.hpp"

namespace commdbg::daemon {

namespace {

constexpr size_t kFamilies = 3;  // calls, bytes, errors: series per label set

}  // namespace

SeriesExporter::SeriesExporter(MetricsRegistry& metrics, const capture::SymbolTable& symbols, std::string host,
                               size_t max_series, size_t label_sets_per_process)
    : metrics_(metrics),
      symbols_(symbols),
      host_(std::move(host)),
      max_series_(max_series),
      sets_per_process_(label_sets_per_process) {}

void SeriesExporter::describe() {
    // An exited process's series folded early keep what a total per uid and
    // collective needs; comm, rank, datatype and environment would make one
    // total per job again.
    metrics_.set_fold_keep({"layer", "collective", "host", "check"});
    metrics_.describe("commdbg_collective_calls_total", "Collective calls, exact (kernel counters)", "counter");
    metrics_.describe("commdbg_collective_bytes_total", "Bytes of collective calls: count x datatype size", "counter");
    metrics_.describe("commdbg_collective_errors_total", "Collective calls that returned an error", "counter");
    metrics_.describe("commdbg_counter_breakdown_lost_total",
                      "Calls of the process counted without communicator and datatype: its share of kernel "
                      "counter keys was used up or the node's counter map was full",
                      "counter");
    metrics_.describe("commdbg_events_dropped_total", "Kernel-side losses by cause", "counter");
    metrics_.describe("commdbg_processes", "Processes counted now", "gauge");
    metrics_.describe("commdbg_build_info", "commdbg version", "gauge");
}

SeriesExporter::Breakdown SeriesExporter::breakdown_of(const capture::CounterEntry& c,
                                                       const std::vector<snapshot::CommInfo>& comms) const {
    Breakdown b;
    b.comm = c.key.comm ? "ptr:" + hex16(c.key.comm) : "";
    for (const auto& ci : comms) {
        if (ci.ptr != c.key.comm) continue;
        if (ci.id) b.comm = hex16(*ci.id);
        if (ci.rank >= 0) b.rank = std::to_string(ci.rank);
        if (ci.nranks >= 0) b.nranks = std::to_string(ci.nranks);
    }
    auto dt = capture::nccl_datatype_name(c.key.dtype);
    b.dtype = c.key.dtype == CD_DTYPE_NONE ? "" : dt ? std::string(*dt) : std::to_string(c.key.dtype);
    return b;
}

void SeriesExporter::fit_budget(const CountedProcess& p, const std::string& layer, const std::string& collective,
                                Breakdown& b, Budget& budget) {
    if (b.empty()) return;
    // New label sets only while they leave a quarter of --max-series, and of
    // the uid's share of it, for the series per collective of every process
    // (its counts per kind).
    const size_t fine_room = max_series_ - max_series_ / 4;
    const size_t share = metrics_.share_of(p.uid);
    auto [uid_it, fresh] = budget.by_uid.try_emplace(p.uid, 0);
    if (fresh) uid_it->second = metrics_.live_series_of(p.uid);
    auto& sets = label_sets_[ProcessKey{p.pid, p.start_time}];
    std::string set = layer + '\0' + collective + '\0' + b.dtype + '\0' + b.comm + '\0' + b.rank + '\0' + b.nranks;
    if (sets.count(set)) return;
    if (sets.size() < sets_per_process_ && budget.exported + kFamilies <= fine_room &&
        uid_it->second + kFamilies <= share - share / 4) {
        sets.insert(std::move(set));
        budget.exported += kFamilies;
        uid_it->second += kFamilies;
        return;
    }
    b = Breakdown{};  // into the process's series of the collective
}

Labels SeriesExporter::labels_of(const CountedProcess& p, const std::string& layer, const std::string& collective,
                                 const Breakdown& b) const {
    Labels labels = {{"layer", layer},   {"collective", collective}, {"dtype", b.dtype},
                     {"comm", b.comm},   {"rank", b.rank},           {"nranks", b.nranks},
                     {"pid", std::to_string(p.pid)},                 {"host", host_}};
    for (const auto& k : kLabelEnv) {
        auto e = p.env.find(k);
        labels.emplace_back("env_" + lower(k), e == p.env.end() ? "" : e->second);
    }
    return labels;
}

void SeriesExporter::export_counts(const capture::CounterSnapshot& snapshot, const CommsByPid& comms,
                                   const std::map<uint32_t, CountedProcess>& procs, Clock::time_point now) {
    // Several counters can fall into one series (a coarse counter, label
    // sets past a process's share): summed before they are set.
    struct Sum {
        ProcessKey owner;
        uint64_t calls = 0, bytes = 0, errors = 0;
    };
    std::map<Labels, Sum> series;
    static const std::vector<snapshot::CommInfo> kNone;
    Budget budget{metrics_.series(), {}};
    // Whose share each process's series count in.
    for (const auto& [pid, p] : procs) metrics_.assign(ProcessKey{pid, p.start_time}, p.uid);
    for (const auto& c : snapshot.entries) {
        const capture::SymbolInfo* s = symbols_.find(c.key.sym);
        if (!s || s->role != CD_ROLE_COLLECTIVE) continue;
        auto pit = procs.find(c.key.tgid);
        if (pit == procs.end()) continue;
        const ProcessKey owner{c.key.tgid, pit->second.start_time};
        const auto info = comms.find(c.key.tgid);
        const std::string collective(capture::coll_name(s->coll));
        Breakdown b = breakdown_of(c, info == comms.end() ? kNone : info->second);
        fit_budget(pit->second, s->layer, collective, b, budget);
        Sum& sum = series[labels_of(pit->second, s->layer, collective, b)];
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
        auto pit = procs.find(pid);
        if (pit == procs.end()) continue;
        metrics_.set("commdbg_counter_breakdown_lost_total", {{"pid", std::to_string(pid)}, {"host", host_}},
                     static_cast<double>(loss.breakdown_lost), ProcessKey{pid, pit->second.start_time}, now);
    }
    metrics_.set("commdbg_processes", {{"host", host_}}, static_cast<double>(procs.size()), 0, now);
}

void SeriesExporter::export_node(const std::array<uint64_t, CD_DROP_MAX>& drops, Clock::time_point now) {
    for (uint32_t i = 0; i < drops.size(); ++i)
        metrics_.set("commdbg_events_dropped_total", {{"cause", capture::drop_cause_name(i)}, {"host", host_}},
                     static_cast<double>(drops[i]), 0, now);
    metrics_.set("commdbg_build_info", {{"version", COMMDBG_VERSION}, {"host", host_}}, 1, 0, now);
}

}  // namespace commdbg::daemon
