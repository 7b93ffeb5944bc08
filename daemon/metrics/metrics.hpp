// SPDX-License-Identifier: Apache-2.0
// A bounded registry of Prometheus series and their text exposition (0.0.4).
// The daemon feeds it cumulative kernel counts; a scrape renders it.  Memory
// is bounded: at most max_series series, and the series of an exited process
// are dropped ttl after it is retired.  Series of a process whose uid is known
// (assign) count in that uid's share; when a share or the cap is full, the
// series of its exited processes are folded early into per-uid totals.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace commdbg::daemon {

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
    // The uid of series not tied to a process, or of one never assigned.
    static constexpr uint32_t kNoUid = UINT32_MAX;

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

    // The series of `owner` count in uid's share (the uid its first series
    // is made with stays theirs): a uid other than 0 holds at most
    // max_series / 4, all of them together at most 3/4, so no user can take
    // another's series and root always has room.  When a new series of an
    // assigned owner does not fit (its uid's share, the others' 3/4, the
    // cap), the exited (retired) processes' series go first, oldest retired
    // first (of its uid at its share; never root's for another uid), each
    // counter folded into its uid's total (folded(), below); series of
    // owners never assigned keep theirs until the ttl.
    void assign(ProcessKey owner, uint32_t uid);
    // The labels a folded total keeps; the others are "", `pid` is "exited"
    // and a `uid` label is added.  A total goes ttl after its last fold.
    void set_fold_keep(std::set<std::string> keep);
    size_t share_of(uint32_t uid) const;
    // Series of uid whose process has not exited (what a new one competes with).
    size_t live_series_of(uint32_t uid) const;
    uint64_t folded() const;  // series folded early into their uid's totals

    size_t series() const;
    uint64_t overflowed() const;
    uint64_t invalid() const;

    // Families sorted by name, each with # HELP / # TYPE once, then its series
    // sorted by labels; then commdbg_series_overflow_total,
    // commdbg_series_invalid_total and commdbg_series_folded_total, always.
    std::string render() const;

private:
    struct Series {
        double value = 0;
        ProcessKey owner;
        uint32_t uid = kNoUid;
        std::optional<Clock::time_point> deadline;  // set once the owner is retired
    };
    struct Family {
        std::string help;
        std::string type;  // empty: not described
        std::map<Labels, Series> series;
    };
    using SeriesIt = std::map<Labels, Series>::iterator;
    struct SeriesRef {
        Family* family;
        SeriesIt it;
    };
    struct UidUse {
        size_t series = 0, retired = 0;  // retired: of exited processes (foldable)
    };
    enum class Limit { none, own_share, others_share, cap };
    struct Retired {
        Clock::time_point deadline;
        bool folded = false;  // its series are folded: a late sample is dropped
    };

    void expire_locked(Clock::time_point now);
    void note_refused(const std::string& name, const Labels& labels, ProcessKey owner);
    // Every store and removal of a series goes through these, so the counts
    // per uid and the index per owner stay true.
    void count(const Series& s, int delta);
    SeriesIt add_series(Family& f, const Labels& labels, Series s);
    void remove_series(Family& f, SeriesIt it);
    void set_deadline(Series& s, Clock::time_point deadline);
    void change_owner(Family& f, SeriesIt it, ProcessKey owner);
    void unlink(const Family& f, SeriesIt it);
    // room for one more series of uid (folding exited processes' series), or false.
    bool make_room(uint32_t uid, Clock::time_point now);
    Limit limit_for(uint32_t uid) const;
    bool fold_oldest(uint32_t uid, Limit limit, Clock::time_point now);
    void fold_owner(ProcessKey owner, Clock::time_point now);
    void add_to_total(Family& f, const Labels& labels, double value, uint32_t uid, Clock::time_point now);
    uint32_t uid_of(ProcessKey owner) const;
    std::optional<Clock::time_point> deadline_of(ProcessKey owner) const;
    void note_deadline(const std::optional<Clock::time_point>& d);

    size_t max_series_;
    std::chrono::seconds ttl_;
    mutable std::mutex mu_;
    std::map<std::string, Family> families_;
    std::map<ProcessKey, Retired> retired_;  // process -> deadline, until it passes
    // Retired processes with series, oldest deadline first: what folds first.
    std::set<std::pair<Clock::time_point, ProcessKey>> foldable_;
    std::map<ProcessKey, uint32_t> owner_uid_;               // assign(); until retired and expired
    std::map<ProcessKey, std::vector<SeriesRef>> by_owner_;  // so retire and fold touch only theirs
    std::map<uint32_t, UidUse> uid_use_;                      // assigned uids with series
    size_t others_series_ = 0;                                // of uids other than 0 (and kNoUid)
    std::set<std::string> fold_keep_;
    uint64_t folded_ = 0;
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

}  // namespace commdbg::daemon
