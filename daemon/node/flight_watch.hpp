// SPDX-License-Identifier: Apache-2.0
// The kernel's flight recorder, watched on the node.  At each refresh the
// ranks of a communicator that run here are compared at every collective
// number they recorded, so a mismatch (ranks issuing different collectives
// at one number: a hang, or silent corruption, to come) is counted as it
// arrives — long before NCCL's watchdog — and each rank's last number and
// the seconds since it issued are exported, for the rules that find ranks
// stopped at unequal numbers (deploy/prometheus/commdbg.rules.yml).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bpf_session.hpp"
#include "hang.hpp"
#include "metrics.hpp"
#include "symbol_table.hpp"
#include "tensor_layout.hpp"

namespace commdbg::daemon {

// Communicators of one process whose recorders a refresh reads (each read
// copies 16 KiB) and whose rank series it exports; further ones go unwatched.
constexpr size_t kFlightCommsPerProcess = 16;

// One rank's recorder on one communicator, as a refresh read it.
struct RankRecorder {
    ProcessKey owner;
    std::string comm_id;  // NCCL's commHash, hex: the same on every rank
    int rank = -1, nranks = -1;
    uint64_t seq = 0;            // collectives issued there so far
    uint64_t last_enter_ns = 0;  // CLOCK_MONOTONIC entry of the newest kept; 0: none kept
    std::vector<hang::Issued> last;  // oldest first
};

// A recorded collective as `commdbg hang` compares it: its kind as the
// counters name it, its count and its datatype (NCCL's, or a c10d call's
// torch dtype, named by `layout`; without it, none).
hang::Issued issued_of(const cd_flight_entry& e, const capture::SymbolTable& symbols,
                       const torch::TensorLayout* layout = nullptr);

class FlightWatch {
public:
    using Clock = std::chrono::steady_clock;
    FlightWatch(MetricsRegistry& metrics, std::string host) : metrics_(metrics), host_(std::move(host)) {}
    void describe();  // HELP and TYPE of its families
    // One refresh's recorders, of every adopted process: each rank's series,
    // and the numbers at which a communicator's local ranks newly differ
    // (counted once each, the first one logged).  now_ns: CLOCK_MONOTONIC.
    void observe(const std::vector<RankRecorder>& recorders, uint64_t now_ns, Clock::time_point now);
    // For status: each communicator whose local ranks differed, the
    // mismatches counted and the first one.  Of communicators still watched.
    nlohmann::json mismatches() const;

private:
    struct CommState {
        std::set<uint64_t> diverged;  // numbers that differ in the recorders now (counted)
        uint64_t total = 0;
        std::optional<hang::Divergence> first;
    };
    void compare(const std::string& comm_id, const std::vector<const RankRecorder*>& ranks, Clock::time_point now);

    MetricsRegistry& metrics_;
    const std::string host_;
    std::map<std::string, CommState> comms_;  // only communicators with a recorder at the last refresh
};

}  // namespace commdbg::daemon
