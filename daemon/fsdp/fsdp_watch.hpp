// SPDX-License-Identifier: Apache-2.0
// commdbgd --fsdp-checks: the FSDP lifecycle checks, all the time, for every
// process on the node that loads libtorch.  One tracing session with only
// what the checks read (record_function scopes, c10d and NCCL collectives;
// no Python stacks, no ATen ops), analysed and emptied once a window, so its
// memory stays within a record budget per process.  What it finds is counted
// in the node counter's /metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "lifecycle.hpp"
#include "metrics.hpp"
#include "process.hpp"
#include "result.hpp"
#include "scope.hpp"
#include "trace_session.hpp"

namespace commdbg::daemon {

struct FsdpWatchOptions {
    size_t max_records = 50000;  // records per process and window
    std::chrono::seconds window{60};
    std::string scope_cgroup;  // empty: the whole node
    // (check, unit) series per process; a finding past them is counted under unit "".
    size_t label_sets_per_process = 64;
};

class FsdpWatch {
public:
    static Result<std::unique_ptr<FsdpWatch>> create(const FsdpWatchOptions& opts, MetricsRegistry& metrics,
                                                     std::string host);
    // The watcher's thread body: until `stop`.
    void run(const std::atomic<bool>& stop);

private:
    using Clock = std::chrono::steady_clock;
    // What the watcher keeps of a traced process across windows.
    struct Watched {
        ProcessKey key;
        CountedProcess labels;      // read once it maps libtorch (its env is final by then)
        bool labelled = false;
        uint32_t parent = 0;        // its job: processes of one parent are compared
        bool at_boundary = false;   // the next window begins between two steps
        bool lifecycle = false;     // a profile recognised its scopes once
        uint64_t step_offset = 0;   // optimizer steps of its earlier windows
        uint64_t kernel_drops = 0;  // ring-buffer losses already seen
        uint64_t steps = 0, windows = 0, unchecked = 0;
        std::map<std::pair<std::string, std::string>, uint64_t> findings;  // (check, unit)
    };
    // One window's analysis of one process.
    struct Analysed {
        uint32_t pid = 0;
        fsdp::Findings report;
        bool checked = true;  // no record lost in the window
    };

    FsdpWatch(const FsdpWatchOptions& opts, MetricsRegistry& metrics, std::string host, CgroupScope scope,
              std::unique_ptr<session::TraceSession> session);
    void describe();
    // Processes not traced yet that map libtorch_cpu, or run CPython and
    // may load it later (traced before it loads: their first step counts).
    void discover();
    bool consider(uint32_t pid, bool torch);
    void sync_processes();
    // A traced process with a lifecycle exited: its job's window ends now.
    bool lifecycle_exited();
    bool jobs_ended();  // of every exited process: no process of its job still runs
    void end_window();
    std::vector<Analysed> analyse_all(uint64_t& held);
    void count(Watched& w, const Analysed& a);
    void add_finding(Watched& w, const std::string& check, const std::string& unit);
    void cross_check(std::vector<Analysed>& analysed);
    void export_metrics(Clock::time_point now, uint64_t held);
    Labels labels_of(const Watched& w) const;
    void log_messages();

    FsdpWatchOptions opts_;
    MetricsRegistry& metrics_;
    const std::string host_;
    CgroupScope scope_;
    std::unique_ptr<session::TraceSession> session_;
    std::map<uint32_t, Watched> watched_;
    // Processes looked at and not traced: (start time, comm) when looked,
    // and how often, so that one is read again only after an exec.
    struct Looked {
        uint64_t start = 0;
        std::string comm;
        int times = 0;
    };
    std::unordered_map<uint32_t, Looked> looked_;
    Clock::time_point last_scan_{}, window_start_ = Clock::now();
    std::optional<Clock::time_point> exit_seen_;  // a process with libtorch exited in this window
    uint64_t windows_ = 0, records_released_ = 0, messages_logged_ = 0;
};

}  // namespace commdbg::daemon
