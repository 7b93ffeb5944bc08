// SPDX-License-Identifier: Apache-2.0
#include "call_fields.hpp"

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

void collective_fields(const model::Record& r, const snapshot::ProcessSnapshot& p, Fields& f) {
    if (r.coll != CD_COLL_NONE)
        f.json("collective", FieldType::Text, 0, 0, std::string(capture::coll_name(static_cast<cd_coll>(r.coll))));
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
    // Addresses are noise for reading the flow: the table shows them from level 2.
    if (r.has(model::kHasStream)) f.hex_both("stream", r.stream, kPosStream, 2);
    if (r.has(model::kHasSendBuf)) f.hex_both("sendbuff", r.sendbuf, kPosSendBuf, 2);
    if (r.has(model::kHasRecvBuf)) f.hex_both("recvbuff", r.recvbuf, kPosRecvBuf, 2);
}

}  // namespace

std::vector<CallField> call_fields(const model::Record& r, const snapshot::ProcessSnapshot& p,
                                   const capture::SymbolTable& syms) {
    Fields f;
    if (r.kind == model::RecordKind::Module && r.ctx != model::kNoCtx && p.tree) {
        f.json("module_fqn", FieldType::Text, 0, 0, std::string(p.tree->context_name(r)));
        f.json("module_class", FieldType::Text, 0, 0, std::string(p.tree->module_class(r)));
        f.json("event_type", FieldType::Text, 0, 0, r.has(model::kBackward) ? "backward" : "forward");
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
