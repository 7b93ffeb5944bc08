// SPDX-License-Identifier: Apache-2.0
#include "metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

namespace commdbg {

namespace {

constexpr const char* kOverflowName = "commdbg_series_overflow_total";
constexpr const char* kInvalidName = "commdbg_series_invalid_total";

bool is_reserved(const std::string& name) { return name == kOverflowName || name == kInvalidName; }

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
    auto retired_deadline = [&](ProcessKey p) -> std::optional<Clock::time_point> {
        if (p.pid == 0) return std::nullopt;
        auto r = retired_.find(p);
        return r == retired_.end() ? std::nullopt : std::optional(r->second);
    };
    auto note_deadline = [&](const std::optional<Clock::time_point>& d) {
        if (d && (!earliest_deadline_ || *d < *earliest_deadline_)) earliest_deadline_ = d;
    };

    if (fit != families_.end()) {
        auto sit = fit->second.series.find(labels);
        if (sit != fit->second.series.end()) {
            Series& s = sit->second;
            const bool recycled = owner.pid != 0 && owner.pid == s.owner.pid && owner != s.owner;
            if (counter && value < s.value && !recycled) return;
            s.value = value;
            // A retired series keeps its deadline, so a late sample cannot pin
            // it forever; once expired, the next set() re-creates it.
            if (owner != s.owner) {
                s.owner = owner;
                s.deadline = retired_deadline(owner);
                note_deadline(s.deadline);
            }
            return;
        }
    }

    if (series_ >= max_series_ && earliest_deadline_ && now >= *earliest_deadline_) expire_locked(now);
    if (series_ >= max_series_) {
        note_refused(name, labels, owner);
        return;
    }
    Series s;
    s.value = value;
    s.owner = owner;
    s.deadline = retired_deadline(owner);
    note_deadline(s.deadline);
    families_[name].series.emplace(labels, s);
    ++series_;
    if (!refused_.empty()) refused_.erase(series_hash(name, labels, owner));
}

void MetricsRegistry::note_refused(const std::string& name, const Labels& labels, ProcessKey owner) {
    const uint64_t h = series_hash(name, labels, owner);
    if (refused_.count(h)) return;
    ++overflowed_;
    if (refused_.size() < std::max(kMinRefusedMemory, 4 * max_series_)) refused_.emplace(h, owner);
}

void MetricsRegistry::retire(ProcessKey owner, Clock::time_point now) {
    if (owner.pid == 0) return;
    std::lock_guard lock(mu_);
    // A second retire keeps the first deadline: retiring again must not extend it.
    auto [rit, inserted] = retired_.emplace(owner, now + ttl_);
    const Clock::time_point deadline = rit->second;
    if (!earliest_deadline_ || deadline < *earliest_deadline_) earliest_deadline_ = deadline;
    for (auto& [name, f] : families_) {
        for (auto& [labels, s] : f.series) {
            if (s.owner == owner && !s.deadline) s.deadline = deadline;
        }
    }
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
            if (sit->second.deadline && *sit->second.deadline <= now) {
                sit = series.erase(sit);
                --series_;
            } else {
                if (sit->second.deadline) keep(*sit->second.deadline);
                ++sit;
            }
        }
        // Families that only set() created go with their last series.
        if (series.empty() && fit->second.type.empty()) fit = families_.erase(fit);
        else ++fit;
    }
    // Refusals of a process that is gone for good will not recur.
    for (auto it = refused_.begin(); it != refused_.end();) {
        auto r = it->second.pid ? retired_.find(it->second) : retired_.end();
        if (r != retired_.end() && r->second <= now) it = refused_.erase(it);
        else ++it;
    }
    for (auto rit = retired_.begin(); rit != retired_.end();) {
        if (rit->second <= now) {
            rit = retired_.erase(rit);
        } else {
            keep(rit->second);
            ++rit;
        }
    }
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
    return out;
}

}  // namespace commdbg
