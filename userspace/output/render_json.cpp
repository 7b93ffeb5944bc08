// SPDX-License-Identifier: Apache-2.0
// The JSON dump: CommDebugMode's schema (comm_counts, total_counts, record
// trees) plus what only an outside observer knows (losses, threads,
// communicators).  ordered_json keeps the field order stable for diffs.
#include <algorithm>
#include <cstring>

#include "call_fields.hpp"
#include "nccl.hpp"
#include "render.hpp"
#include "text.hpp"
#include "wait_status.hpp"

namespace commdbg::output {

namespace {

using namespace render_parts;
using nlohmann::ordered_json;

const char* json_type(model::RecordKind k) {
    switch (k) {
    case model::RecordKind::Collective: return "collective";
    case model::RecordKind::Op: return "op";
    case model::RecordKind::Module: return "module";
    case model::RecordKind::Scope: return "scope";
    }
    return "op";
}

class JsonWriter {
public:
    JsonWriter(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms, int noise)
        : p_(p), syms_(syms), noise_(noise) {}

    // With `records_mark`, "records" holds that string in place of the tree:
    // to_json_text() streams the tree there, one top-level record at a time.
    ordered_json render(const std::string* records_mark = nullptr) const {
        ordered_json j;
        ordered_json counts = ordered_json::object();
        for (const auto& [k, v] : comm_counts(p_, syms_)) counts[k] = v;
        j["comm_counts"] = std::move(counts);
        j["total_counts"] = total_counts(p_, syms_);
        ordered_json bytes = ordered_json::object();
        for (const auto& [k, v] : comm_bytes(p_, syms_)) bytes[k] = v;
        j["comm_bytes"] = std::move(bytes);
        if (p_.tree) {
            if (auto by_module = module_counts_json(*p_.tree); !by_module.empty())
                j["module_comm_counts"] = std::move(by_module);
            parameters_json(*p_.tree, j);
            // Backward attribution: nodes the engine ran, and those no forward record made.
            if (p_.tree->autograd_nodes_run() != 0) {
                j["autograd_nodes_run"] = p_.tree->autograd_nodes_run();
                j["autograd_nodes_unmapped"] = p_.tree->autograd_nodes_unmapped();
            }
        }
        if (p_.fsdp) j["fsdp"] = fsdp::to_json(*p_.fsdp);
        ordered_json counters = ordered_json::array();
        for (const snapshot::CounterRow* c : sorted_counters(p_, syms_)) counters.push_back(counter_json(*c));
        j["counters"] = std::move(counters);
        if (p_.counter_breakdown_lost) j["counter_breakdown_lost"] = p_.counter_breakdown_lost;

        if (records_mark) {
            j["records"] = *records_mark;
        } else {
            ordered_json records = ordered_json::array();
            for_each_top_record([&](ordered_json&& r) { records.push_back(std::move(r)); });
            j["records"] = std::move(records);
        }

        uint64_t budget = p_.tree ? p_.tree->dropped(model::DropCause::Budget) : 0;
        uint64_t depth = p_.tree ? p_.tree->dropped(model::DropCause::Depth) : 0;
        uint64_t dropped = p_.kernel_dropped_records + budget + depth;
        if (dropped > 0) {
            j["dropped_records"] = dropped;
            j["dropped_by_cause"] = {{"kernel_ringbuf", p_.kernel_dropped_records},
                                     {"budget", budget},
                                     {"depth", depth}};
        }
        if (p_.tree && p_.tree->unmatched_exits() > 0)
            j["unmatched_exits"] = p_.tree->unmatched_exits();

        ordered_json proc;
        proc["pid"] = p_.pid;
        proc["command"] = p_.command;
        // exit_code: the status of exit(N); a process killed by a signal has
        // "exit_code": null and "signal": N instead.
        auto ended = p_.exit_code ? host::decode_exit(*p_.exit_code) : host::ExitInfo{};
        proc["exit_code"] = ended.code ? ordered_json(*ended.code) : ordered_json(nullptr);
        if (ended.signal) {
            proc["signal"] = *ended.signal;
            if (const char* abbrev = sigabbrev_np(*ended.signal)) proc["signal_name"] = std::string("SIG") + abbrev;
            if (ended.core_dumped) proc["core_dumped"] = true;
        }
        proc["libraries"] = p_.libraries;
        j["process"] = std::move(proc);
        j["threads"] = p_.tree ? p_.tree->threads() : std::vector<uint32_t>{};
        if (!p_.thread_names.empty()) {
            ordered_json names = ordered_json::object();
            for (const auto& [tid, name] : p_.thread_names) names[std::to_string(tid)] = name;
            j["thread_names"] = std::move(names);
        }

        ordered_json comms = ordered_json::array();
        for (const snapshot::CommInfo& c : p_.comms) comms.push_back(comm_json(c));
        j["communicators"] = std::move(comms);
        if (!p_.notes.empty()) j["notes"] = p_.notes;
        return j;
    }

    // Each record of the top level of "records", in order (hidden roots
    // hoist their visible children), built and handed over one at a time.
    template <typename Fn>
    void for_each_top_record(Fn&& fn) const {
        if (!p_.tree) return;
        ordered_json batch = ordered_json::array();
        for (uint32_t r : p_.tree->roots()) {
            append(r, batch);
            for (auto& rec : batch) fn(std::move(rec));
            batch.clear();
        }
    }

private:
    // Collectives per module path, forward and backward (an empty side is omitted).
    static ordered_json module_counts_json(const model::ProcessTree& t) {
        ordered_json out = ordered_json::object();
        for (const auto& [fqn, c] : t.module_comm_counts()) {
            ordered_json m = ordered_json::object();
            if (!c.forward.empty()) m["forward"] = c.forward;
            if (!c.backward.empty()) m["backward"] = c.backward;
            out[fqn] = std::move(m);
        }
        return out;
    }

    // CommDebugMode's get_parameter_info() and get_sharding_info(): per
    // module path its own parameters; per DTensor parameter its placements.
    static void parameters_json(const model::ProcessTree& t, ordered_json& j) {
        if (t.parameters().empty()) return;
        ordered_json info = ordered_json::object(), sharding = ordered_json::object();
        ordered_json unread = ordered_json::object();
        for (const auto& [fqn, m] : t.parameters()) {
            ordered_json params = ordered_json::object();
            for (const torch::ParamInfo& pi : m.params) {
                params[pi.name] = {{"shape", pi.shape}, {"dtype", pi.dtype}, {"local_shape", pi.local_shape}};
                if (pi.dtensor) params[pi.name]["is_dtensor"] = true;
                if (pi.placements) sharding[fqn + "." + pi.name] = *pi.placements;
            }
            info[fqn] = std::move(params);
            if (m.unread != 0) unread[fqn] = m.unread;
        }
        j["parameter_info"] = std::move(info);
        j["sharding_info"] = std::move(sharding);
        if (!unread.empty()) j["parameters_unread"] = std::move(unread);
        if (t.unread_parameter_modules() != 0) j["parameter_modules_unread"] = t.unread_parameter_modules();
    }

    // One exact kernel counter row.
    ordered_json counter_json(const snapshot::CounterRow& c) const {
        ordered_json o;
        const capture::SymbolInfo* s = syms_.find(c.sym);
        o["name"] = s ? s->name : std::string("?");
        o["layer"] = s ? s->layer : std::string("?");
        if (s && s->coll != CD_COLL_NONE) o["collective"] = capture::coll_name(s->coll);
        o["comm"] = hex(c.comm);
        if (const snapshot::CommInfo* ci = find_comm(p_, c.comm); ci && ci->id) o["comm_id"] = hex16(*ci->id);
        if (c.dtype != CD_DTYPE_NONE) o["dtype"] = model::dtype_name(c.dtype);
        o["calls"] = c.calls;
        o["elements"] = c.elements;
        o["bytes"] = c.bytes;
        o["errors"] = c.errors;
        return o;
    }

    static ordered_json comm_json(const snapshot::CommInfo& c) {
        ordered_json o;
        o["ptr"] = hex(c.ptr);
        o["id"] = c.id ? ordered_json(hex16(*c.id)) : ordered_json(nullptr);
        o["nranks"] = c.nranks;
        o["rank"] = c.rank;
        o["origin"] = std::string(to_string(c.origin));
        o["parent_ptr"] = c.parent_ptr ? ordered_json(hex(*c.parent_ptr)) : ordered_json(nullptr);
        o["destroyed"] = c.destroyed;
        o["init_ret"] = c.init_ret ? ordered_json(*c.init_ret) : ordered_json(nullptr);
        return o;
    }

    // A hidden record's visible children take its place in `out`.
    void append(uint32_t idx, ordered_json& out) const {
        const auto& recs = p_.tree->records();
        const model::Record& r = recs[idx];
        if (!record_visible(r, syms_, noise_)) {
            for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs[c].next_sibling)
                append(c, out);
            return;
        }
        ordered_json o;
        o["type"] = json_type(r.kind);
        o["name"] = record_name(r, p_, syms_);
        o["layer"] = record_layer(r, p_, syms_);
        collective_json(r, p_, syms_, o);
        o["tid"] = r.tid;
        o["start_ns"] = r.start_ns;
        o["end_ns"] = r.end_ns ? ordered_json(r.end_ns) : ordered_json(nullptr);
        if (r.has(model::kEndInferred)) o["end_inferred"] = true;
        if (r.has(model::kEndAtExit)) o["end_at_exit"] = true;
        py_stack_json(r, *p_.tree, o);
        ordered_json children = ordered_json::array();
        for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs[c].next_sibling)
            append(c, children);
        o["children"] = std::move(children);
        out.push_back(std::move(o));
    }

    const snapshot::ProcessSnapshot& p_;
    const capture::SymbolTable& syms_;
    int noise_;
};

}  // namespace

namespace render_parts {

// A c10d collective's tensors: input_shape / output_shape (the first
// tensor's, CommDebugMode's keys) and inputs / outputs, one entry per tensor
// read, with *_total where the parameter held more.
template <typename Json>
void tensors_json(const model::Record& r, const model::ProcessTree& t, Json& o) {
    using Status = model::ProcessTree::TensorStatus;
    const auto& set = t.tensor_set(r);
    if (set.status != CD_TENSORS_OK) {
        o["tensors_status"] = set.status == CD_TENSORS_NOT_A_GROUP ? "not a known process group: not read" : "unreadable";
        return;
    }
    auto side_json = [&](const meaning::TensorSide& side, const char* shape_key, const char* list_key,
                         const char* total_key) {
        if (!side.present) return;
        Json list = Json::array();
        for (uint32_t i : side.rows) {
            const auto& row = t.tensor(i);
            Json e = Json::object();
            if (row.status == Status::Ok) {
                Json shape = Json::array();
                for (int64_t d : t.tensor_dims(row)) shape.push_back(d);
                e["shape"] = std::move(shape);
            } else {
                e["shape"] = nullptr;
            }
            if (row.status == Status::Ok || row.status == Status::TooManyDims) {
                e["dtype"] = std::string(t.text(row.dtype));
                e["numel"] = row.numel;
                e["bytes"] = row.bytes;
            }
            e["is_dtensor"] = false;  // c10d moves local tensors
            if (row.status != Status::Ok) e["status"] = meaning::to_string(row.status);
            list.push_back(std::move(e));
        }
        o[shape_key] = list.empty() ? Json(nullptr) : Json(list[0]["shape"]);
        o[list_key] = std::move(list);
        if (side.total > side.rows.size()) o[total_key] = side.total;
    };
    const auto sides = meaning::tensor_sides(r, t);
    side_json(sides.in, "input_shape", "inputs", "inputs_total");
    side_json(sides.out, "output_shape", "outputs", "outputs_total");
}

template <typename Json>
void collective_json(const model::Record& r, const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms,
                     Json& o) {
    for (const meaning::CallField& f : meaning::call_fields(r, p, syms)) {
        if (f.key.empty()) continue;  // the table's only
        std::string key(f.key);
        switch (f.type) {
        case meaning::FieldType::Int: o[key] = f.i; break;
        case meaning::FieldType::UInt:
        case meaning::FieldType::Nanos: o[key] = f.u; break;
        default: o[key] = field_text(f); break;
        }
    }
    if (r.has(model::kHasTensors) && p.tree) tensors_json(r, *p.tree, o);
}

template void collective_json(const model::Record&, const snapshot::ProcessSnapshot&, const capture::SymbolTable&,
                              nlohmann::ordered_json&);
template void collective_json(const model::Record&, const snapshot::ProcessSnapshot&, const capture::SymbolTable&,
                              nlohmann::json&);

std::vector<const snapshot::ProcessSnapshot*> by_pid(const std::vector<snapshot::ProcessSnapshot>& ps) {
    std::vector<const snapshot::ProcessSnapshot*> sorted;
    for (const auto& p : ps) sorted.push_back(&p);
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->pid < b->pid; });
    return sorted;
}

}  // namespace render_parts

namespace {

// `text` indented by `n` more spaces after each newline.
void append_indented(std::string& out, const std::string& text, size_t n) {
    const std::string pad(n, ' ');
    size_t from = 0;
    for (size_t nl; (nl = text.find('\n', from)) != std::string::npos; from = nl + 1) {
        out.append(text, from, nl + 1 - from);
        out += pad;
    }
    out.append(text, from, std::string::npos);
}

}  // namespace

std::string to_json_text(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms,
                         int noise_level, const nlohmann::ordered_json& extra) {
    const auto sorted = by_pid(ps);
    // The skeleton, with a mark per process where its records go.  The mark
    // holds control characters, which dump() escapes: no record's text has it.
    std::vector<std::string> marks;
    for (size_t i = 0; i < sorted.size(); ++i) marks.push_back("\x01records " + std::to_string(i) + "\x01");
    ordered_json j;
    if (sorted.size() == 1) {
        j = JsonWriter(*sorted[0], syms, noise_level).render(&marks[0]);
    } else {
        ordered_json arr = ordered_json::array();
        for (size_t i = 0; i < sorted.size(); ++i)
            arr.push_back(JsonWriter(*sorted[i], syms, noise_level).render(&marks[i]));
        j["processes"] = std::move(arr);
    }
    for (const auto& [k, v] : extra.items()) j[k] = v;
    const std::string skeleton = j.dump(2);

    std::string out;
    size_t from = 0;
    for (size_t i = 0; i < sorted.size(); ++i) {
        const std::string quoted = ordered_json(marks[i]).dump();
        size_t at = skeleton.find(quoted, from);
        if (at == std::string::npos) continue;  // not reached: every skeleton has its marks
        out.append(skeleton, from, at - from);
        // The key's indentation, as dump(2) would indent this array.
        size_t line = skeleton.rfind('\n', at);
        size_t key_indent = skeleton.find_first_not_of(' ', line + 1) - (line + 1);
        bool any = false;
        JsonWriter(*sorted[i], syms, noise_level).for_each_top_record([&](ordered_json&& rec) {
            out += any ? ",\n" : "[\n";
            out.append(key_indent + 2, ' ');
            append_indented(out, rec.dump(2), key_indent + 2);
            any = true;
        });
        if (any) {
            out += '\n';
            out.append(key_indent, ' ');
            out += ']';
        } else {
            out += "[]";
        }
        from = at + quoted.size();
    }
    out.append(skeleton, from, std::string::npos);
    return out;
}

nlohmann::ordered_json to_json(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms, int noise_level) {
    return JsonWriter(p, syms, noise_level).render();
}

nlohmann::ordered_json to_json(const std::vector<snapshot::ProcessSnapshot>& ps, const capture::SymbolTable& syms,
                               int noise_level) {
    if (ps.size() == 1) return to_json(ps.front(), syms, noise_level);
    const auto sorted = by_pid(ps);
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const auto* p : sorted) arr.push_back(to_json(*p, syms, noise_level));
    nlohmann::ordered_json j;
    j["processes"] = std::move(arr);
    return j;
}

}  // namespace commdbg::output
