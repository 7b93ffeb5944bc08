// SPDX-License-Identifier: Apache-2.0
#include "perfetto_check.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <tuple>

namespace commdbg::perfetto_check {

namespace {

const std::string kScript = std::string(SOURCE_DIR) + "/tests/perfetto/perfetto_tp.js";

const char* kSlicesSql =
    "select p.pid as pid, t.tid as tid, s.name as name, coalesce(s.category, '') as cat, "
    "s.ts as ts, s.dur as dur, s.depth as depth, coalesce(par.name, '') as parent, "
    "coalesce(extract_arg(s.arg_set_id, 'args.collective'), '') as coll, "
    "coalesce(extract_arg(s.arg_set_id, 'args.bytes'), -1) as bytes "
    "from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid) "
    "left join process p using(upid) left join slice par on s.parent_id = par.id";
const char* kSliceCountSql = "select count(*) from slice";
const char* kProcessesSql = "select pid, name from process where name is not null";
const char* kThreadsSql = "select tid, name from thread where name is not null";
const char* kBoundsSql = "select start_ts, end_ts from trace_bounds";
const char* kErrorStatsSql =
    "select name, coalesce(idx, ''), value from stats "
    "where value > 0 and severity in ('error', 'data_loss')";

int64_t us_to_ns(const nlohmann::json& v) { return std::llround(v.get<double>() * 1000.0); }

auto slice_key(const Slice& s) { return std::tie(s.pid, s.tid, s.ts, s.depth, s.name, s.dur); }

void sort_slices(std::vector<Slice>& v) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Slice& a, const Slice& b) { return slice_key(a) < slice_key(b); });
}

std::string describe(const Slice& s) {
    std::ostringstream o;
    o << "pid " << s.pid << " tid " << s.tid << " '" << s.name << "' [" << s.cat << "] ts " << s.ts
      << " dur " << s.dur << " depth " << s.depth << " parent '" << s.parent << "'";
    if (!s.collective.empty()) o << " collective " << s.collective << " bytes " << s.bytes;
    return o.str();
}

}  // namespace

std::string unavailable_reason() {
    std::string node = NODE_BIN;
    if (node.empty() || !std::filesystem::exists(node))
        return "node not found (apt install nodejs), needed to run Perfetto's trace processor";
    if (!std::filesystem::exists(std::string(PERFETTO_UI_DIR) + "/trace_processor.wasm"))
        return std::string("no Perfetto UI build at ") + PERFETTO_UI_DIR + " (run: make perfetto-ui)";
    return "";
}

Loaded load_in_perfetto(const std::string& trace_path) {
    Loaded l;
    auto o = testproc::run({NODE_BIN, kScript, PERFETTO_UI_DIR, trace_path, kSlicesSql, kSliceCountSql,
                            kProcessesSql, kThreadsSql, kBoundsSql, kErrorStatsSql});
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(o.out);
    } catch (const std::exception& e) {
        l.error = "perfetto_tp.js exited " + std::to_string(o.status) + " without a result: " + o.err;
        return l;
    }
    l.perfetto_version = j.value("perfetto_version", "");
    if (!j["load_error"].is_null()) {
        l.error = "Perfetto could not load the trace: " + j["load_error"].get<std::string>();
        return l;
    }
    const auto& res = j["results"];
    for (const auto& r : res) {
        if (!r["error"].is_null()) {
            l.error = "query failed: " + r["error"].get<std::string>() + " (" + r["sql"].get<std::string>() + ")";
            return l;
        }
    }
    for (const auto& row : res[0]["rows"]) {
        Slice s;
        s.pid = row[0].is_null() ? 0 : row[0].get<uint64_t>();
        s.tid = row[1].get<uint64_t>();
        s.name = row[2].is_null() ? "" : row[2].get<std::string>();
        s.cat = row[3].get<std::string>();
        s.ts = row[4].get<int64_t>();
        s.dur = row[5].get<int64_t>();
        s.depth = row[6].get<int64_t>();
        s.parent = row[7].get<std::string>();
        s.collective = row[8].get<std::string>();
        s.bytes = row[9].get<int64_t>();
        l.slices.push_back(std::move(s));
    }
    sort_slices(l.slices);
    int64_t all = res[1]["rows"][0][0].get<int64_t>();
    if (all != static_cast<int64_t>(l.slices.size()))
        l.error_stats.push_back(std::to_string(all - static_cast<int64_t>(l.slices.size())) +
                                " slices not on a thread track");
    for (const auto& row : res[2]["rows"]) l.process_names[row[0].get<uint64_t>()] = row[1].get<std::string>();
    for (const auto& row : res[3]["rows"]) l.thread_names[row[0].get<uint64_t>()] = row[1].get<std::string>();
    if (!res[4]["rows"].empty()) {
        l.start_ts = res[4]["rows"][0][0].get<int64_t>();
        l.end_ts = res[4]["rows"][0][1].get<int64_t>();
    }
    for (const auto& row : res[5]["rows"])
        l.error_stats.push_back(row[0].get<std::string>() + "[" + row[1].dump() + "]=" + row[2].dump());
    return l;
}

Loaded expected_from_file(const nlohmann::json& trace) {
    Loaded l;
    std::map<std::pair<uint64_t, uint64_t>, std::vector<Slice>> by_thread;
    bool any = false;
    for (const auto& ev : trace.at("traceEvents")) {
        const std::string ph = ev.at("ph");
        uint64_t pid = ev.at("pid"), tid = ev.at("tid");
        if (ph == "M") {
            const std::string what = ev.at("name");
            if (what == "process_name") l.process_names[pid] = ev["args"]["name"];
            if (what == "thread_name") l.thread_names[tid] = ev["args"]["name"];
            continue;
        }
        if (ph != "X") continue;
        Slice s;
        s.pid = pid;
        s.tid = tid;
        s.name = ev.at("name");
        s.cat = ev.value("cat", "");
        s.ts = us_to_ns(ev.at("ts"));
        s.dur = us_to_ns(ev.at("dur"));
        if (ev.contains("args")) {
            const auto& a = ev["args"];
            if (a.contains("collective")) s.collective = a["collective"];
            if (a.contains("bytes")) s.bytes = a["bytes"];
        }
        l.start_ts = any ? std::min(l.start_ts, s.ts) : s.ts;
        l.end_ts = any ? std::max(l.end_ts, s.ts + s.dur) : s.ts + s.dur;
        any = true;
        by_thread[{pid, tid}].push_back(std::move(s));
    }
    // Nesting per thread as a viewer does it: by start, the longer first; a
    // slice is inside the open one whose end it does not pass.
    for (auto& [key, v] : by_thread) {
        std::stable_sort(v.begin(), v.end(), [](const Slice& a, const Slice& b) {
            return a.ts < b.ts || (a.ts == b.ts && a.dur > b.dur);
        });
        std::vector<const Slice*> open;
        for (Slice& s : v) {
            while (!open.empty() && open.back()->ts + open.back()->dur <= s.ts &&
                   !(open.back()->ts == s.ts))
                open.pop_back();
            s.depth = static_cast<int64_t>(open.size());
            s.parent = open.empty() ? "" : open.back()->name;
            open.push_back(&s);
        }
        for (auto& s : v) l.slices.push_back(s);
    }
    sort_slices(l.slices);
    return l;
}

std::vector<std::string> compare_with_file(const Loaded& got, const nlohmann::json& trace) {
    std::vector<std::string> diffs;
    if (!got.error.empty()) return {got.error};
    for (const auto& e : got.error_stats) diffs.push_back("Perfetto import error: " + e);
    Loaded want = expected_from_file(trace);
    if (got.slices.size() != want.slices.size())
        diffs.push_back("Perfetto shows " + std::to_string(got.slices.size()) + " slices, the file has " +
                        std::to_string(want.slices.size()));
    size_t shown = 0;
    for (size_t i = 0; i < std::min(got.slices.size(), want.slices.size()) && shown < 10; ++i) {
        const Slice &g = got.slices[i], &w = want.slices[i];
        bool same = g.pid == w.pid && g.tid == w.tid && g.name == w.name && g.cat == w.cat && g.ts == w.ts &&
                    (g.dur == w.dur || g.dur + 1 == w.dur) && g.depth == w.depth && g.parent == w.parent &&
                    g.collective == w.collective && g.bytes == w.bytes;
        if (!same) {
            diffs.push_back("slice " + std::to_string(i) + ": Perfetto shows " + describe(g) + "; the file says " +
                            describe(w));
            ++shown;
        }
    }
    for (const auto& [pid, name] : want.process_names) {
        auto it = got.process_names.find(pid);
        if (it == got.process_names.end() || it->second != name)
            diffs.push_back("process " + std::to_string(pid) + " not named '" + name + "' in Perfetto");
    }
    for (const auto& [tid, name] : want.thread_names) {
        auto it = got.thread_names.find(tid);
        if (it == got.thread_names.end() || it->second != name)
            diffs.push_back("thread " + std::to_string(tid) + " not named '" + name + "' in Perfetto");
    }
    if (!want.slices.empty() &&
        (got.start_ts != want.start_ts || got.end_ts < want.end_ts - 1 || got.end_ts > want.end_ts))
        diffs.push_back("trace bounds [" + std::to_string(got.start_ts) + ", " + std::to_string(got.end_ts) +
                        "] in Perfetto, [" + std::to_string(want.start_ts) + ", " + std::to_string(want.end_ts) +
                        "] in the file");
    return diffs;
}

std::string lines(const std::vector<std::string>& diffs) {
    std::string out;
    for (const auto& d : diffs) out += "  " + d + "\n";
    return out;
}

}  // namespace commdbg::perfetto_check
