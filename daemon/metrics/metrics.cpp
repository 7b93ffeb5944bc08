// SPDX-License-Identifier: Apache-2.0
#include "metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

namespace commdbg::daemon {

namespace {

constexpr const char* kOverflowName = "commdbg_series_overflow_total";
constexpr const char* kInvalidName = "commdbg_series_invalid_total";
constexpr const char* kFoldedName = "commdbg_series_folded_total";

bool is_reserved(const std::string& name) {
    return name == kOverflowName || name == kInvalidName || name == kFoldedName;
}

// Refused series remembered at most: past it a refusal is counted each time
// (over- rather than under-counting), which needs this many distinct ones.
constexpr size_t kMinRefusedMemory = 4096;

// FNV-1a over the series' identity; a collision only merges two refusals.
uint64_t series_hash(const std::string& name, const Labels& labels, ProcessKey owner) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    auto str = [&](const std::string& x) { mix(x.data(), x.size() + 1); };
    str(name);
    for (const auto& [k, v] : labels) {
        str(k);
        str(v);
    }
    mix(&owner.pid, sizeof(owner.pid));
    mix(&owner.start_time, sizeof(owner.start_time));
    return h;
}

bool valid_labels(const Labels& labels) {
    std::set<std::string_view> seen;
    for (const auto& [k, v] : labels) {
        if (!valid_metric_name(k) || !seen.insert(k).second) return false;
    }
    return true;
}

// HELP text escapes only backslash and newline (0.0.4).
std::string escape_help(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

void append_family_header(std::string& out, const std::string& name, const std::string& help,
                          const std::string& type) {
    if (!help.empty()) out += "# HELP " + name + " " + escape_help(help) + "\n";
    out += "# TYPE " + name + " " + (type.empty() ? "untyped" : type) + "\n";
}

void append_sample(std::string& out, const std::string& name, const Labels& labels, double value) {
    out += name;
    if (!labels.empty()) {
        out += '{';
        for (size_t i = 0; i < labels.size(); ++i) {
            if (i) out += ',';
            out += labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
        }
        out += '}';
    }
    out += ' ';
    out += format_metric_value(value);
    out += '\n';
}

}  // namespace

bool valid_metric_name(const std::string& name) {
    if (name.empty()) return false;
    auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
    if (!alpha(name[0])) return false;
    for (char c : name) {
        if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
    }
    return true;
}

std::string escape_label_value(const std::string& value) {
    std::string out;
    out.reserve(value.size());
    for (char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

std::string format_metric_value(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    // Counts arrive as doubles; print them as the integers they are.
    if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return std::to_string(static_cast<int64_t>(v));
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

MetricsRegistry::MetricsRegistry(size_t max_series, std::chrono::seconds ttl) : max_series_(max_series), ttl_(ttl) {}

void MetricsRegistry::describe(const std::string& name, const std::string& help, const std::string& type) {
    if (!valid_metric_name(name) || is_reserved(name)) return;
    std::lock_guard lock(mu_);
    Family& f = families_[name];
    f.help = help;
    f.type = (type == "counter" || type == "gauge") ? type : "untyped";
}

void MetricsRegistry::set(const std::string& name, const Labels& labels, double value, ProcessKey owner,
                          Clock::time_point now) {
    std::lock_guard lock(mu_);
    if (!valid_metric_name(name) || is_reserved(name) || !valid_labels(labels)) {
        ++invalid_;
        return;
    }
    auto fit = families_.find(name);
    bool counter = fit != families_.end() && fit->second.type == "counter";
    if (counter && (std::isnan(value) || value < 0)) {
        ++invalid_;
        return;
    }
    // Folded into its uid's totals: storing it again would count it twice.
    if (auto r = owner.pid ? retired_.find(owner) : retired_.end(); r != retired_.end() && r->second.folded) return;

    if (fit != families_.end()) {
        auto sit = fit->second.series.find(labels);
        if (sit != fit->second.series.end()) {
            Series& s = sit->second;
            const bool recycled = owner.pid != 0 && owner.pid == s.owner.pid && owner != s.owner;
            if (counter && value < s.value && !recycled) return;
            s.value = value;
            // A retired series keeps its deadline, so a late sample cannot pin
            // it forever; once expired, the next set() re-creates it.
            if (owner != s.owner) change_owner(fit->second, sit, owner);
            return;
        }
    }

    const uint32_t uid = uid_of(owner);
    if (!make_room(uid, now)) {
        note_refused(name, labels, owner);
        return;
    }
    Series s;
    s.value = value;
    s.owner = owner;
    s.uid = uid;
    s.deadline = deadline_of(owner);
    note_deadline(s.deadline);
    add_series(families_[name], labels, s);  // (make_room may have erased `fit`)
    if (!refused_.empty()) refused_.erase(series_hash(name, labels, owner));
}

std::optional<MetricsRegistry::Clock::time_point> MetricsRegistry::deadline_of(ProcessKey owner) const {
    if (owner.pid == 0) return std::nullopt;
    auto r = retired_.find(owner);
    return r == retired_.end() ? std::nullopt : std::optional(r->second.deadline);
}

void MetricsRegistry::note_deadline(const std::optional<Clock::time_point>& d) {
    if (d && (!earliest_deadline_ || *d < *earliest_deadline_)) earliest_deadline_ = d;
}

uint32_t MetricsRegistry::uid_of(ProcessKey owner) const {
    if (owner.pid == 0) return kNoUid;
    auto it = owner_uid_.find(owner);
    return it == owner_uid_.end() ? kNoUid : it->second;
}

void MetricsRegistry::count(const Series& s, int delta) {
    if (s.uid == kNoUid) return;
    UidUse& u = uid_use_[s.uid];
    const bool retired = s.owner.pid != 0 && s.deadline;
    if (delta > 0) {
        ++u.series;
        u.retired += retired;
        others_series_ += s.uid != 0;
    } else {
        --u.series;
        u.retired -= retired;
        others_series_ -= s.uid != 0;
    }
    if (u.series == 0) uid_use_.erase(s.uid);
}

MetricsRegistry::SeriesIt MetricsRegistry::add_series(Family& f, const Labels& labels, Series s) {
    auto it = f.series.emplace(labels, s).first;
    ++series_;
    count(it->second, +1);
    if (s.owner.pid != 0) {
        by_owner_[s.owner].push_back({&f, it});
        if (s.deadline) foldable_.emplace(*s.deadline, s.owner);
    }
    return it;
}

void MetricsRegistry::unlink(const Family& f, SeriesIt it) {
    if (it->second.owner.pid == 0) return;
    auto bo = by_owner_.find(it->second.owner);
    if (bo == by_owner_.end()) return;
    auto& refs = bo->second;
    for (size_t i = 0; i < refs.size(); ++i) {
        if (refs[i].family != &f || refs[i].it != it) continue;
        refs[i] = refs.back();
        refs.pop_back();
        break;
    }
    if (refs.empty()) by_owner_.erase(bo);
}

void MetricsRegistry::remove_series(Family& f, SeriesIt it) {
    count(it->second, -1);
    unlink(f, it);
    f.series.erase(it);
    --series_;
}

void MetricsRegistry::set_deadline(Series& s, Clock::time_point deadline) {
    count(s, -1);
    s.deadline = deadline;
    count(s, +1);
}

void MetricsRegistry::change_owner(Family& f, SeriesIt it, ProcessKey owner) {
    count(it->second, -1);
    unlink(f, it);
    Series& s = it->second;
    s.owner = owner;
    s.uid = uid_of(owner);
    s.deadline = deadline_of(owner);
    note_deadline(s.deadline);
    count(s, +1);
    if (owner.pid == 0) return;
    by_owner_[owner].push_back({&f, it});
    if (s.deadline) foldable_.emplace(*s.deadline, owner);
}

void MetricsRegistry::note_refused(const std::string& name, const Labels& labels, ProcessKey owner) {
    const uint64_t h = series_hash(name, labels, owner);
    if (refused_.count(h)) return;
    ++overflowed_;
    if (refused_.size() < std::max(kMinRefusedMemory, 4 * max_series_)) refused_.emplace(h, owner);
}

// ---- shares per uid, and folding ---------------------------------------------

void MetricsRegistry::assign(ProcessKey owner, uint32_t uid) {
    if (owner.pid == 0 || uid == kNoUid) return;
    std::lock_guard lock(mu_);
    owner_uid_.emplace(owner, uid);
}

void MetricsRegistry::set_fold_keep(std::set<std::string> keep) {
    std::lock_guard lock(mu_);
    fold_keep_ = std::move(keep);
}

size_t MetricsRegistry::share_of(uint32_t uid) const {
    return uid == 0 || uid == kNoUid ? max_series_ : max_series_ / 4;
}

size_t MetricsRegistry::live_series_of(uint32_t uid) const {
    std::lock_guard lock(mu_);
    auto it = uid_use_.find(uid);
    return it == uid_use_.end() ? 0 : it->second.series - it->second.retired;
}

// Which limit a new series of uid is at: none, its own share, the 3/4 of all
// uids but root, the cap.
MetricsRegistry::Limit MetricsRegistry::limit_for(uint32_t uid) const {
    if (uid != 0 && uid != kNoUid) {
        auto it = uid_use_.find(uid);
        if (it != uid_use_.end() && it->second.series >= share_of(uid)) return Limit::own_share;
        if (others_series_ >= max_series_ - max_series_ / 4) return Limit::others_share;
    }
    return series_ >= max_series_ ? Limit::cap : Limit::none;
}

bool MetricsRegistry::make_room(uint32_t uid, Clock::time_point now) {
    if (limit_for(uid) == Limit::none) return true;
    if (earliest_deadline_ && now >= *earliest_deadline_) expire_locked(now);
    // Owners never assigned keep the old rule: nothing goes before its ttl.
    if (uid == kNoUid) return limit_for(uid) == Limit::none;
    for (Limit l; (l = limit_for(uid)) != Limit::none;)
        if (!fold_oldest(uid, l, now)) return false;
    return true;
}

bool MetricsRegistry::fold_oldest(uint32_t uid, Limit limit, Clock::time_point now) {
    if (limit == Limit::own_share) {
        auto u = uid_use_.find(uid);
        if (u == uid_use_.end() || u->second.retired == 0) return false;
    }
    for (auto it = foldable_.begin(); it != foldable_.end();) {
        const ProcessKey owner = it->second;
        if (!by_owner_.count(owner)) {  // nothing of it left to fold
            it = foldable_.erase(it);
            continue;
        }
        // Its own share full: only its own exited processes make room.  And
        // another user never makes a root process's series go early.
        const uint32_t u = uid_of(owner);
        const bool may = u != kNoUid && (limit == Limit::own_share ? u == uid : uid == 0 || u != 0);
        if (!may) {
            ++it;
            continue;
        }
        foldable_.erase(it);
        fold_owner(owner, now);
        return true;
    }
    return false;
}

void MetricsRegistry::fold_owner(ProcessKey owner, Clock::time_point now) {
    auto bo = by_owner_.find(owner);
    if (bo == by_owner_.end()) return;
    const std::vector<SeriesRef> refs = std::move(bo->second);
    by_owner_.erase(bo);
    if (auto r = retired_.find(owner); r != retired_.end()) r->second.folded = true;
    for (const SeriesRef& ref : refs) {
        Family& f = *ref.family;
        const Labels labels = ref.it->first;
        const Series s = ref.it->second;
        count(s, -1);
        f.series.erase(ref.it);
        --series_;
        ++folded_;
        if (f.type == "counter") add_to_total(f, labels, s.value, s.uid, now);
    }
}

// Totals per uid of folded counters: the series of exited processes go, the
// sums over them stay (one series per family and kept labels, not per pid).
void MetricsRegistry::add_to_total(Family& f, const Labels& labels, double value, uint32_t uid,
                                   Clock::time_point now) {
    Labels total;
    bool has_uid = false;
    for (const auto& [k, v] : labels) {
        has_uid = has_uid || k == "uid";
        total.emplace_back(k, k == "pid" ? "exited" : fold_keep_.count(k) ? v : "");
    }
    if (!has_uid) total.emplace_back("uid", std::to_string(uid));
    auto it = f.series.find(total);
    if (it == f.series.end()) {
        Series s;
        s.uid = uid;
        it = add_series(f, total, s);
    }
    it->second.value += value;
    it->second.deadline = now + ttl_;  // (owner pid 0: never counted as retired)
    note_deadline(it->second.deadline);
}

void MetricsRegistry::retire(ProcessKey owner, Clock::time_point now) {
    if (owner.pid == 0) return;
    std::lock_guard lock(mu_);
    // A second retire keeps the first deadline: retiring again must not extend it.
    auto rit = retired_.emplace(owner, Retired{now + ttl_}).first;
    const Clock::time_point deadline = rit->second.deadline;
    note_deadline(deadline);
    auto bo = by_owner_.find(owner);
    if (bo == by_owner_.end()) return;
    for (const SeriesRef& ref : bo->second)
        if (!ref.it->second.deadline) set_deadline(ref.it->second, deadline);
    foldable_.emplace(deadline, owner);
}

void MetricsRegistry::expire(Clock::time_point now) {
    std::lock_guard lock(mu_);
    expire_locked(now);
}

void MetricsRegistry::expire_locked(Clock::time_point now) {
    std::optional<Clock::time_point> earliest;
    auto keep = [&](Clock::time_point d) {
        if (!earliest || d < *earliest) earliest = d;
    };
    for (auto fit = families_.begin(); fit != families_.end();) {
        auto& series = fit->second.series;
        for (auto sit = series.begin(); sit != series.end();) {
            const auto next = std::next(sit);
            if (sit->second.deadline && *sit->second.deadline <= now) remove_series(fit->second, sit);
            else if (sit->second.deadline) keep(*sit->second.deadline);
            sit = next;
        }
        // Families that only set() created go with their last series.
        if (series.empty() && fit->second.type.empty()) fit = families_.erase(fit);
        else ++fit;
    }
    // Refusals of a process that is gone for good will not recur.
    for (auto it = refused_.begin(); it != refused_.end();) {
        auto r = it->second.pid ? retired_.find(it->second) : retired_.end();
        if (r != retired_.end() && r->second.deadline <= now) it = refused_.erase(it);
        else ++it;
    }
    for (auto rit = retired_.begin(); rit != retired_.end();) {
        if (rit->second.deadline <= now) {
            owner_uid_.erase(rit->first);
            rit = retired_.erase(rit);
        } else {
            keep(rit->second.deadline);
            ++rit;
        }
    }
    while (!foldable_.empty() && foldable_.begin()->first <= now) foldable_.erase(foldable_.begin());
    earliest_deadline_ = earliest;
}

size_t MetricsRegistry::series() const {
    std::lock_guard lock(mu_);
    return series_;
}

uint64_t MetricsRegistry::overflowed() const {
    std::lock_guard lock(mu_);
    return overflowed_;
}

uint64_t MetricsRegistry::invalid() const {
    std::lock_guard lock(mu_);
    return invalid_;
}

uint64_t MetricsRegistry::folded() const {
    std::lock_guard lock(mu_);
    return folded_;
}

std::string MetricsRegistry::render() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& [name, f] : families_) {
        if (f.series.empty()) continue;
        append_family_header(out, name, f.help, f.type);
        for (const auto& [labels, s] : f.series) append_sample(out, name, labels, s.value);
    }
    append_family_header(out, kOverflowName, "Series not stored because the registry already held its maximum.",
                         "counter");
    append_sample(out, kOverflowName, {}, static_cast<double>(overflowed_));
    append_family_header(out, kInvalidName,
                         "Samples dropped for an invalid metric or label name, or an invalid counter value.",
                         "counter");
    append_sample(out, kInvalidName, {}, static_cast<double>(invalid_));
    append_family_header(out, kFoldedName,
                         "Series of exited processes folded into their uid's totals (pid=\"exited\") before "
                         "their ttl, to make room for a running process's.",
                         "counter");
    append_sample(out, kFoldedName, {}, static_cast<double>(folded_));
    return out;
}

}  // namespace commdbg::daemon
