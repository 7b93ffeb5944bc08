// SPDX-License-Identifier: Apache-2.0
// The node counter's Prometheus series: labels each process's kernel counters
// and keeps the number of label sets within --max-series, per process and
// for all of them together.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bpf_session.hpp"
#include "metrics.hpp"
#include "process.hpp"
#include "render.hpp"  // CommInfo
#include "symbol_table.hpp"

namespace commdbg::daemon {

class SeriesExporter {
public:
    using Clock = std::chrono::steady_clock;
    SeriesExporter(MetricsRegistry& metrics, const capture::SymbolTable& symbols, std::string host, size_t max_series,
                   size_t label_sets_per_process);

    // HELP and TYPE of every family it sets.
    void describe();
    // A refresh's NCCL communicators of each process (communicators_of),
    // joined once and read by the series and the flight recorder alike.
    using CommsByPid = std::map<uint32_t, std::vector<snapshot::CommInfo>>;
    // The collective and counter-loss series of every process in `procs`,
    // and how many processes there are, from one counter snapshot.
    void export_counts(const capture::CounterSnapshot& snapshot, const CommsByPid& comms,
                       const std::map<uint32_t, CountedProcess>& procs, Clock::time_point now);
    // The node's own series: kernel-side drops by cause, the build.
    void export_node(const std::array<uint64_t, CD_DROP_MAX>& drops, Clock::time_point now);
    // A process that is gone no longer holds label sets.
    void forget(const ProcessKey& owner) { label_sets_.erase(owner); }

private:
    struct Breakdown {
        std::string dtype, comm, rank, nranks;
        bool empty() const { return dtype.empty() && comm.empty() && rank.empty() && nranks.empty(); }
    };
    // Series one export_counts may still add: on the node, and per uid
    // (its live series, what it does not give back when it must).
    struct Budget {
        size_t exported = 0;
        std::map<uint32_t, size_t> by_uid;
    };
    Breakdown breakdown_of(const capture::CounterEntry& c, const std::vector<snapshot::CommInfo>& comms) const;
    // Clears `b` when `p` may not take one more label set.
    void fit_budget(const CountedProcess& p, const std::string& layer, const std::string& collective, Breakdown& b,
                    Budget& budget);
    Labels labels_of(const CountedProcess& p, const std::string& layer, const std::string& collective,
                     const Breakdown& b) const;

    MetricsRegistry& metrics_;
    const capture::SymbolTable& symbols_;
    const std::string host_;
    const size_t max_series_;
    const size_t sets_per_process_;
    // Label sets of each process's series (metric_label_sets_per_process).
    std::map<ProcessKey, std::set<std::string>> label_sets_;
};

}  // namespace commdbg::daemon
