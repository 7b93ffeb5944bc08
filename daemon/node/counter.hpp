// SPDX-License-Identifier: Apache-2.0
// commdbgd's always-on part: exact collective counts of every process on the
// node (or in one cgroup) that calls libnccl, labelled for Prometheus.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bpf_session.hpp"
#include "events.hpp"
#include "files.hpp"
#include "flight_watch.hpp"
#include "limits.hpp"
#include "metrics.hpp"
#include "probe_attach.hpp"
#include "process.hpp"
#include "resume_guard.hpp"
#include "scope.hpp"
#include "series.hpp"
#include "symbol_table.hpp"
#include "torch_support.hpp"

namespace commdbg::daemon {

struct NodeCounterOptions {
    std::vector<std::string> probes = {"nccl"};
    std::string scope_cgroup;  // cgroup v2 directory, empty: the whole node
    size_t max_series = 10000;
    std::chrono::seconds series_ttl = std::chrono::minutes(10);
    size_t ringbuf_bytes = 1u << 20;  // only loader/process events: small
    // Fine counter keys per process in the kernel (BpfOptions).
    uint32_t counter_keys_per_process = limits::kDefaultCounterKeysPerProcess;
    // (layer, collective, dtype, comm, rank) label sets per process in
    // /metrics, and all processes' together at most 3/4 of max_series; calls
    // of further sets go to the process's series of their collective with
    // dtype, comm, rank and nranks empty, so no process, nor many, can take
    // the --max-series of the others.  The first ones seen stay.
    size_t metric_label_sets_per_process = 256;
    // Library files probed for one user other than root (FileShares); all
    // such users together hold at most 3/4 of the kernel's known_files.
    size_t library_files_per_uid = limits::kLibraryFilesPerUid;
    // Return probes on the collectives, only to count their errors
    // (commdbg_collective_errors_total).  Off (commdbgd --no-count-errors):
    // entry probes alone, cheaper per call (bench_anchor measures both;
    // docs/daemon.md, "Probes and their cost");
    // communicator init/split/destroy keep theirs for the comm labels.
    bool count_errors = true;
    // The kernel's flight recorder for the processes it counts (commdbg hang's
    // signatures, commdbg_collective_mismatch_total).  Off (commdbgd
    // --no-flight-recorder): counters only; bench_anchor measures both.
    bool flight_recorder = true;
};

class NodeCounter {
public:
    static Result<std::unique_ptr<NodeCounter>> create(const NodeCounterOptions& opts);
    // Resumes every process it stopped, unprobes nothing, and leaves the
    // guard to resume once more those stopped again before it was gone.
    ~NodeCounter();

    // Set when the daemon is asked to stop: from then on a loader event only
    // resumes its process, and a scan attaches no further file.
    void watch_stop_flag(const std::atomic<bool>& stop) { stop_flag_ = &stop; }
    // The first step of a shutdown: no process is stopped at a new library
    // file any more (the hook is detached), and every one stopped is resumed.
    void stop_stopping_processes();

    // Handles ring-buffer events for up to timeout_ms, then refreshes the
    // counts and metrics at most once per refresh period.
    void step(int timeout_ms);
    void refresh();

    // Which counted processes a caller may see; empty: all of them.
    using ProcessFilter = std::function<bool(uint32_t pid)>;
    // {"processes": [...]} for `commdbg counts`, of the processes may_see passes.
    nlohmann::json counts(std::optional<uint32_t> pid, bool by_comm, const ProcessFilter& may_see, bool flight = false);
    nlohmann::json status();
    MetricsRegistry& metrics() { return metrics_; }

private:
    explicit NodeCounter(const NodeCounterOptions& opts);
    Result<bool> open_bpf(std::vector<capture::ProbeSpec> specs);
    // Ring-buffer records: loader changes, first calls, exits.
    void on_record(std::span<const uint8_t> bytes) noexcept;
    void handle_record(std::span<const uint8_t> bytes);
    void on_loader_change(const capture::DlChange& dl);
    bool stopping() const { return stopping_ || (stop_flag_ && stop_flag_->load()); }
    // Charges the files a scan attached to `uid` and tells the kernel whose
    // share is used up.
    void charge_files(uint32_t uid, uint32_t pid, const capture::ScanResult& scan);
    void resume_stopped();
    void uncharge_file(FileShares::FileId f);  // its probes are gone
    // Process registry: adopted when seen calling a probed library, retired
    // when gone (its series stay for --series-ttl).
    void scan_proc();
    void adopt(uint32_t pid);
    void retire(ProcessKey key);
    // Processes gone (also those whose exit event came), as adopted.
    std::vector<ProcessKey> find_gone();
    // refresh()'s steps.
    void publish(const capture::CounterSnapshot& snapshot, std::vector<capture::CommEntry> comms,
                 const SeriesExporter::CommsByPid& nccl, std::chrono::steady_clock::time_point now);
    void log_notes(uint32_t pid, const std::vector<std::string>& notes);
    nlohmann::json status_errors() const;  // with mu_ held
    // counts()'s reply from one set of processes and kernel state.
    struct CountsSource {
        const std::map<uint32_t, CountedProcess>& procs;
        const std::vector<capture::CounterEntry>& counters;
        const std::map<uint32_t, capture::CounterLoss>& loss;
        const std::vector<capture::CommEntry>& comms;
    };
    nlohmann::json counts_from(const CountsSource& src, std::optional<uint32_t> pid, bool by_comm,
                               const ProcessFilter& may_see, bool flight = false) const;
    nlohmann::json flight_entries(const CountedProcess& p, const std::vector<cd_flight_entry>& last) const;
    // One of p's recorded collectives, its c10d dtype named by p's tensor layout.
    hang::Issued issued(const CountedProcess& p, const cd_flight_entry& e) const;
    // A process's communicators as commdbgd names them: NCCL's by commHash
    // (or a split's derived id), c10d groups by snapshot::c10d_comm_id; `id`
    // empty where none is the same on every rank.
    struct NamedComm {
        uint64_t ptr = 0;
        std::string id;
        int32_t rank = -1, nranks = -1;
        bool c10d = false;
        std::string name;  // c10d: torch's group name
    };
    // `nccl`: its NCCL communicators, as communicators_of joined them.
    static std::vector<NamedComm> named_comms(uint32_t pid, const std::string& c10d_job,
                                              const std::vector<snapshot::CommInfo>& nccl,
                                              const std::vector<capture::CommEntry>& comms);
    std::vector<RankRecorder> read_recorders(const SeriesExporter::CommsByPid& nccl,
                                             const std::vector<capture::CommEntry>& comms) const;
    // The flight recorder's c10d counts: the kernel is told how to read a
    // torch process's tensors (torch::TorchSupport), at adoption and at the
    // next refreshes until its libc10 and libtorch are both mapped.
    void setup_tensors(uint32_t pid);
    void retry_tensors();
    void forget_image(uint32_t pid);

    NodeCounterOptions opts_;
    CgroupScope scope_;
    std::unique_ptr<capture::ResumeGuard> guard_;
    std::unique_ptr<capture::BpfSession> bpf_;
    capture::SymbolTable symbols_;
    std::unique_ptr<capture::ProbeAttacher> attacher_;
    std::unique_ptr<torch::TorchMaps> torch_maps_;  // null: no spec reads c10d tensors, or no recorder
    std::unique_ptr<torch::TorchSupport> torch_;
    std::map<uint32_t, int> tensor_tries_;  // adopted processes whose tensors are not read yet: tries left
    MetricsRegistry metrics_;
    FileShares shares_;
    std::atomic<bool> stopping_{false};
    const std::atomic<bool>* stop_flag_ = nullptr;
    std::set<uint32_t> exited_;  // exit events since the last refresh (main thread only)

    std::mutex mu_;  // guards the fields below (control and HTTP threads read them)
    std::map<uint32_t, CountedProcess> procs_;
    std::vector<capture::CounterEntry> counters_;           // fine and coarse
    std::map<uint32_t, capture::CounterLoss> counter_loss_;  // by pid
    std::unique_ptr<SeriesExporter> series_;
    std::unique_ptr<FlightWatch> flights_;  // the flight recorder compared across local ranks
    std::vector<capture::CommEntry> comms_;
    std::vector<capture::AttachedFile> files_;
    nlohmann::json shares_json_ = nlohmann::json::object();  // FileShares, as of the last publish
    struct KnownFiles {
        size_t used = 0, capacity = 0;
        bool full = false;
    } known_files_;
    uint64_t events_ = 0, decode_errors_ = 0, resumed_ = 0, failed_records_ = 0, untraced_ = 0, unstopped_ = 0;
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_refresh_{};
    std::string host_;
};

}  // namespace commdbg::daemon
