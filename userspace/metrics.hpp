// SPDX-License-Identifier: Apache-2.0
// A bounded registry of Prometheus series and their text exposition (0.0.4).
// The daemon feeds it cumulative kernel counts; a scrape renders it.  Memory
// is bounded: at most max_series series, and the series of an exited process
// are dropped ttl after it is retired.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace commdbg {

// Label pairs in the order given; that order is part of a series' identity.
using Labels = std::vector<std::pair<std::string, std::string>>;

// The process a series belongs to: a pid is reused, (pid, start time) is not.
// start_time: /proc/PID/stat field 22 (clock ticks since boot); pid 0: none.
struct ProcessKey {
    uint32_t pid = 0;
    uint64_t start_time = 0;
    auto operator<=>(const ProcessKey&) const = default;
};

// Thread-safe: the collector sets while the HTTP endpoint renders.
class MetricsRegistry {
public:
    using Clock = std::chrono::steady_clock;

    explicit MetricsRegistry(size_t max_series = 10000, std::chrono::seconds ttl = std::chrono::minutes(10));

    // type is "counter" or "gauge"; anything else is exposed as "untyped".
    // A family that is set() but never described has no HELP and is untyped.
    void describe(const std::string& name, const std::string& help, const std::string& type);

    // Stores value for the series (name, labels).  For a counter a value lower
    // than the stored one is ignored: only a re-created kernel map entry could
    // produce it.  A series last set by another process with the same pid (a
    // recycled pid: another start time) starts afresh: its value, its expiry.
    // A new series beyond max_series is dropped and counted in overflowed(),
    // once per series (and process), not once per set(); an invalid name,
    // label name, duplicate label, or a NaN or negative counter value is
    // dropped and counted in invalid().  pid 0: not tied to a process.
    void set(const std::string& name, const Labels& labels, double value, ProcessKey owner, Clock::time_point now);
    void set(const std::string& name, const Labels& labels, double value, uint32_t pid, Clock::time_point now) {
        set(name, labels, value, ProcessKey{pid, 0}, now);
    }

    // The series of the process keep their last value until now + ttl;
    // expire() then removes them.  A series created for it after this shares
    // the deadline.
    void retire(ProcessKey owner, Clock::time_point now);
    void retire_pid(uint32_t pid, Clock::time_point now) { retire(ProcessKey{pid, 0}, now); }

    // Removes retired series whose deadline is <= now.
    void expire(Clock::time_point now);

    size_t series() const;
    uint64_t overflowed() const;
    uint64_t invalid() const;

    // Families sorted by name, each with # HELP / # TYPE once, then its series
    // sorted by labels; then commdbg_series_overflow_total and
    // commdbg_series_invalid_total, always.
    std::string render() const;

private:
    struct Series {
        double value = 0;
        ProcessKey owner;
        std::optional<Clock::time_point> deadline;  // set once the owner is retired
    };
    struct Family {
        std::string help;
        std::string type;  // empty: not described
        std::map<Labels, Series> series;
    };

    void expire_locked(Clock::time_point now);
    void note_refused(const std::string& name, const Labels& labels, ProcessKey owner);

    size_t max_series_;
    std::chrono::seconds ttl_;
    mutable std::mutex mu_;
    std::map<std::string, Family> families_;
    std::map<ProcessKey, Clock::time_point> retired_;  // process -> deadline, until it passes
    // Series refused at the cap (hash of name, labels, owner), so each is
    // counted once; forgotten with their process, bounded by kMaxRefusedMemory.
    std::unordered_map<uint64_t, ProcessKey> refused_;
    std::optional<Clock::time_point> earliest_deadline_;   // so set() at the cap expires only when due
    size_t series_ = 0;
    uint64_t overflowed_ = 0;
    uint64_t invalid_ = 0;
};

// Helpers of the exposition format, exposed for tests.
bool valid_metric_name(const std::string& name);
std::string escape_label_value(const std::string& value);
std::string format_metric_value(double value);

}  // namespace commdbg
