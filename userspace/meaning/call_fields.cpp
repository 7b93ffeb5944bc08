// SPDX-License-Identifier: Apache-2.0
#include "call_fields.hpp"

#include <algorithm>
#include <cstdio>

#include "nccl.hpp"
#include "record_facts.hpp"
#include "snapshot.hpp"
#include "text.hpp"

namespace commdbg::meaning {

namespace {


// Table positions: the table reads "count dtype op peer comm new_comm
// [stream buffers] group ret time", the JSON groups by meaning.
enum TablePos {
    kPosFirst = 1,
    kPosSecond = 2,
    kPosThird = 3,
    kPosPeer = 4,
    kPosComm = 5,
    kPosNewComm = 6,
    kPosNewCommId = 7,
    kPosStream = 8,
    kPosSendBuf = 9,
    kPosRecvBuf = 10,
    kPosGroup = 20,
    kPosRet = 21,
    kPosTime = 22,
};

class Fields {
public:
    std::vector<CallField> out;

    // JSON only.
    void json(std::string_view key, FieldType t, int64_t i, uint64_t u = 0, std::string text = {}) {
        out.push_back({key, t, i, u, std::move(text), TableShow::Never, {}, 0, 0});
    }
    // JSON and table (same key).
    void both(std::string_view key, FieldType t, int64_t i, uint64_t u, std::string text, TableShow show, int pos,
              int min_noise = 0, std::string_view table_key = {}) {
        out.push_back({key, t, i, u, std::move(text), show, table_key.empty() ? key : table_key, pos, min_noise});
    }
    // Table only.
    void table(std::string_view table_key, FieldType t, uint64_t u, int pos) {
        out.push_back({{}, t, 0, u, {}, TableShow::KeyValue, table_key, pos, 0});
    }
    void hex_both(std::string_view key, uint64_t v, int pos, int min_noise = 0, std::string_view tkey = {}) {
        both(key, FieldType::Hex, 0, v, {}, TableShow::KeyValue, pos, min_noise, tkey);
    }
    void int_both(std::string_view key, int64_t v, int pos, std::string_view tkey = {}) {
        both(key, FieldType::Int, v, 0, {}, TableShow::KeyValue, pos, 0, tkey);
    }
};

// Communicator calls reuse the generic slots: init count/peer = nranks/rank,
// split comm/peer/count = parent/color/key (see probe_spec.cpp).  int
// arguments are read from 64-bit registers: only the low 32 bits are defined.
void lifecycle_fields(const model::Record& r, const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms,
                      cd_role role, Fields& f) {
    if (role == CD_ROLE_COMM_INIT) {
        if (r.has(model::kHasCount))
            f.int_both(is_init_all(r, syms) ? "ndev" : "nranks", static_cast<int32_t>(r.count), kPosFirst);
        if (r.has(model::kHasPeer)) f.int_both("rank", r.peer, kPosSecond);
    } else if (role == CD_ROLE_COMM_SPLIT) {
        if (r.has(model::kHasComm)) f.hex_both("parent", r.comm, kPosFirst);
        if (r.has(model::kHasPeer)) f.int_both("color", r.peer, kPosSecond);
        if (r.has(model::kHasCount)) f.int_both("key", static_cast<int32_t>(r.count), kPosThird);
    } else if (r.has(model::kHasComm)) {  // COMM_END: the communicator it ends
        const snapshot::CommInfo* comm = find_comm(p, r.comm);
        if (comm && comm->nranks >= 0) f.json("group_size", FieldType::Int, comm->nranks);
        f.hex_both("comm", r.comm, kPosFirst);
        if (comm && comm->id) f.json("comm_id", FieldType::Hex16, 0, *comm->id);
    }
    if (r.has(model::kHasNewComm)) {
        f.hex_both("new_comm", r.new_comm, kPosNewComm);
        const snapshot::CommInfo* comm = find_comm(p, r.new_comm);
        if (comm && comm->id)
            f.both("new_comm_id", FieldType::Hex16, 0, *comm->id, {}, TableShow::KeyValue, kPosNewCommId, 0, "id");
        if (role == CD_ROLE_COMM_SPLIT && comm && comm->nranks >= 0) f.json("group_size", FieldType::Int, comm->nranks);
    }
}

using TensorStatus = model::ProcessTree::TensorStatus;

bool has_numel(TensorStatus s) { return s == TensorStatus::Ok || s == TensorStatus::TooManyDims; }

// One side's tensors for the table: "[4, 8]", "2x[4, 8]", "[4, 8],[2]+3".
std::string side_text(const model::ProcessTree& t, const TensorSide& side) {
    std::vector<std::string> shapes;
    for (uint32_t i : side.rows) shapes.push_back(shape_text(t, t.tensor(i)));
    if (shapes.empty()) return side.total ? "?x" + std::to_string(side.total) : "[]";
    bool same = std::all_of(shapes.begin(), shapes.end(), [&](const std::string& x) { return x == shapes[0]; });
    if (same && side.total == shapes.size() && shapes.size() > 1) return std::to_string(shapes.size()) + "x" + shapes[0];
    std::string out;
    for (const auto& x : shapes) out += (out.empty() ? "" : ",") + x;
    if (side.total > shapes.size()) out += "+" + std::to_string(side.total - shapes.size());
    return out;
}

// Shapes, dtype, bytes and group of a c10d collective (kHasTensors).
void tensor_fields(const model::Record& r, const model::ProcessTree& t, bool have_group_size, Fields& f) {
    const auto& set = t.tensor_set(r);
    if (set.group_size >= 0 && !have_group_size) f.json("group_size", FieldType::Int, set.group_size);
    if (set.group_rank >= 0) f.json("group_rank", FieldType::Int, set.group_rank);
    TensorSides sides = tensor_sides(r, t);
    const TensorSide& first = sides.in.present ? sides.in : sides.out;
    if (!first.rows.empty() && has_numel(t.tensor(first.rows[0]).status))
        f.both("dtype", FieldType::Text, 0, 0, std::string(t.text(t.tensor(first.rows[0]).dtype)), TableShow::Bare,
               kPosSecond);
    // Bytes sent: every input's, when every input was read.
    if (sides.in.present && !sides.in.rows.empty() && sides.in.rows.size() == sides.in.total &&
        std::all_of(sides.in.rows.begin(), sides.in.rows.end(), [&](uint32_t i) { return has_numel(t.tensor(i).status); })) {
        uint64_t bytes = 0;
        for (uint32_t i : sides.in.rows) bytes += t.tensor(i).bytes;
        f.json("bytes", FieldType::UInt, 0, bytes);
    }
    // The table: shapes from noise level 1, as CommDebugMode shows them.
    auto table_text = [&](std::string_view key, std::string text) {
        f.out.push_back({{}, FieldType::Text, 0, 0, std::move(text), TableShow::KeyValue, key, kPosFirst, 1});
    };
    if (set.status != CD_TENSORS_OK) {
        table_text("shapes", set.status == CD_TENSORS_NOT_A_GROUP ? "unknown-group" : "unreadable");
    } else if (sides.in.present && sides.out.present && sides.in.rows == sides.out.rows) {
        table_text("shape", side_text(t, sides.in));
    } else {
        if (sides.in.present) table_text("in", side_text(t, sides.in));
        if (sides.out.present) table_text("out", side_text(t, sides.out));
    }
}

void collective_fields(const model::Record& r, const snapshot::ProcessSnapshot& p, Fields& f) {
    if (r.coll != CD_COLL_NONE) {
        std::string kind(capture::coll_name(static_cast<cd_coll>(r.coll)));
        f.json("collective", FieldType::Text, 0, 0, kind);
        f.json("collective_type", FieldType::Text, 0, 0, kind);  // CommDebugMode's key
    }
    // The communicator a call runs on.
    std::optional<uint64_t> ptr;
    if (r.has(model::kHasNewComm)) ptr = r.new_comm;
    else if (r.has(model::kHasComm)) ptr = r.comm;
    const snapshot::CommInfo* comm = ptr ? find_comm(p, *ptr) : nullptr;
    int32_t nranks = comm ? comm->nranks : -1;
    if (r.has(model::kHasCount)) f.table("count", FieldType::UInt, r.count, kPosFirst);
    if (nranks >= 0) f.json("group_size", FieldType::Int, nranks);
    if (ptr) f.json("comm", FieldType::Hex, 0, *ptr);
    if (comm && comm->id) f.json("comm_id", FieldType::Hex16, 0, *comm->id);
    if (r.has(model::kHasComm) && r.has(model::kHasNewComm)) f.json("parent_comm", FieldType::Hex, 0, r.comm);
    if (auto el = record_elements(r, nranks)) {
        f.json("input_elements", FieldType::UInt, 0, el->in);
        f.json("output_elements", FieldType::UInt, 0, el->out);
    }
    if (r.has(model::kHasDtype))
        f.both("dtype", FieldType::Text, 0, 0, model::dtype_name(r.dtype), TableShow::Bare, kPosSecond);
    if (auto b = record_bytes(r)) f.json("bytes", FieldType::UInt, 0, *b);
    if (r.has(model::kHasRedop)) {
        auto op = capture::nccl_redop_name(r.redop);
        f.both("reduce_op", FieldType::Text, 0, 0, op ? std::string(*op) : "op(" + std::to_string(r.redop) + ")",
               TableShow::Bare, kPosThird);
    }
    if (r.has(model::kHasPeer))
        f.int_both(r.coll == CD_COLL_SEND || r.coll == CD_COLL_RECV ? "peer" : "root", r.peer, kPosPeer);
    if (r.has(model::kHasComm)) f.table("comm", FieldType::Hex, r.comm, kPosComm);
    if (r.has(model::kHasNewComm)) f.table("new_comm", FieldType::Hex, r.new_comm, kPosNewComm);
    if (r.has(model::kHasTensors) && p.tree) tensor_fields(r, *p.tree, nranks >= 0, f);
    if (p.tree)
        if (auto m = p.tree->also_counted_for(r); !m.empty()) f.json("also_counted_for", FieldType::Text, 0, 0, std::string(m));
    // Addresses are noise for reading the flow: the table shows them from level 2.
    if (r.has(model::kHasStream)) f.hex_both("stream", r.stream, kPosStream, 2);
    if (r.has(model::kHasSendBuf)) f.hex_both("sendbuff", r.sendbuf, kPosSendBuf, 2);
    if (r.has(model::kHasRecvBuf)) f.hex_both("recvbuff", r.recvbuf, kPosRecvBuf, 2);
}

}  // namespace

// "aten::mm" -> "aten.mm.default", "aten::add.Tensor" -> "aten.add.Tensor":
// the OpOverload's str(), as CommDebugMode keys its operations.
std::optional<std::string> op_name(std::string_view name) {
    constexpr std::string_view kAten = "aten::";
    if (!name.starts_with(kAten) || name.size() == kAten.size()) return std::nullopt;
    std::string out = "aten." + std::string(name.substr(kAten.size()));
    if (name.find('.', kAten.size()) == std::string_view::npos) out += ".default";
    return out;
}

std::vector<CallField> call_fields(const model::Record& r, const snapshot::ProcessSnapshot& p,
                                   const capture::SymbolTable& syms) {
    Fields f;
    if (r.kind == model::RecordKind::Module && r.ctx != model::kNoCtx && p.tree) {
        f.json("module_fqn", FieldType::Text, 0, 0, std::string(p.tree->context_name(r)));
        f.json("module_class", FieldType::Text, 0, 0, std::string(p.tree->module_class(r)));
        // "checkpointing": a forward run again inside backward (activation
        // checkpointing), CommDebugMode's operations_checkpointing; counted as backward.
        f.json("event_type", FieldType::Text, 0, 0,
               r.has(model::kRecompute) ? "checkpointing" : r.has(model::kBackward) ? "backward" : "forward");
        if (auto node = p.tree->autograd_node(r); !node.empty())
            f.json("autograd_node", FieldType::Text, 0, 0, std::string(node));
        return std::move(f.out);
    }
    if (r.kind == model::RecordKind::Op) {
        if (auto name = op_name(model::record_name(r, syms))) f.json("op_name", FieldType::Text, 0, 0, *name);
        return std::move(f.out);
    }
    if (r.kind != model::RecordKind::Collective) return {};
    cd_role role = record_role(r, syms);
    if (role == CD_ROLE_COMM_INIT || role == CD_ROLE_COMM_SPLIT || role == CD_ROLE_COMM_END)
        lifecycle_fields(r, p, syms, role, f);
    else
        collective_fields(r, p, f);
    if (r.group_depth > 0) f.int_both("group_depth", r.group_depth, kPosGroup, "group");
    if (r.has(model::kHasRet)) f.both("ret", FieldType::Int, r.ret, 0, {}, TableShow::Warn, kPosRet);
    // A collective returns once enqueued (asynchronous: not GPU time); a
    // communicator lifecycle call returns when it is done.
    if (auto ns = host_enqueue_ns(r)) {
        bool coll = r.coll != CD_COLL_NONE;
        f.both(coll ? "host_enqueue_ns" : "host_call_ns", FieldType::Nanos, 0, *ns, {}, TableShow::KeyValue, kPosTime, 0,
               coll ? "enqueue" : "call");
    }
    return std::move(f.out);
}

TensorSides tensor_sides(const model::Record& r, const model::ProcessTree& t) {
    TensorSides out;
    if (!r.has(model::kHasTensors)) return out;
    const auto& set = t.tensor_set(r);
    TensorSide params[2];
    for (int i = 0; i < 2; ++i) {
        params[i].present = CD_TENSOR_PARAM(set.kinds, i) != CD_TPARAM_NONE;
        params[i].total = set.total[i];
    }
    for (uint8_t i = 0; i < set.n; ++i) params[t.tensor(set.first + i).param & 1].rows.push_back(set.first + i);
    if (params[1].present) {
        out.out = params[0], out.in = params[1];
    } else if (r.coll == CD_COLL_RECV) {
        out.out = params[0];
    } else if (r.coll == CD_COLL_SEND) {
        out.in = params[0];
    } else {
        out.in = out.out = params[0];
    }
    return out;
}

const char* to_string(model::ProcessTree::TensorStatus s) {
    switch (s) {
    case TensorStatus::Ok: return "ok";
    case TensorStatus::Undefined: return "undefined";
    case TensorStatus::NotPlain: return "not a plain TensorImpl";
    case TensorStatus::Unreadable: return "unreadable";
    case TensorStatus::Symbolic: return "symbolic";
    case TensorStatus::TooManyDims: return "more dims than kept";
    case TensorStatus::Inconsistent: return "inconsistent";
    case TensorStatus::NoLayout: return "layout unknown";
    }
    return "?";
}

std::string shape_text(const model::ProcessTree& t, const model::ProcessTree::TensorInfo& row) {
    if (row.status != TensorStatus::Ok) return std::string("<") + to_string(row.status) + ">";
    std::string out = "[";
    for (int64_t d : t.tensor_dims(row)) out += (out.size() > 1 ? ", " : "") + std::to_string(d);
    return out + "]";
}

std::string field_text(const CallField& f) {
    switch (f.type) {
    case FieldType::Int: return std::to_string(f.i);
    case FieldType::UInt:
    case FieldType::Nanos: return std::to_string(f.u);
    case FieldType::Hex: return hex(f.u);
    case FieldType::Hex16: return hex16(f.u);
    case FieldType::Text: return f.text;
    }
    return {};
}

}  // namespace commdbg::meaning
