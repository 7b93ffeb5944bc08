// SPDX-License-Identifier: Apache-2.0
#include "flight_watch.hpp"

#include <iostream>

#include "nccl.hpp"
#include "process_group.hpp"

namespace commdbg::daemon {

hang::Issued issued_of(const cd_flight_entry& e, const capture::SymbolTable& symbols, const torch::TensorLayout* layout) {
    const capture::SymbolInfo* s = symbols.find(e.sym);
    hang::Issued out{e.seq, s ? std::string(capture::coll_name(s->coll)) : std::string("?"),
                     e.count == CD_FLIGHT_NO_COUNT ? std::nullopt : std::optional<uint64_t>(e.count), {}, {}, -1, {}};
    const bool nccl = s && s->layer == "nccl";
    if (e.dtype != CD_DTYPE_NONE && nccl)
        if (auto n = capture::nccl_datatype_name(e.dtype)) out.dtype = *n;
    // A c10d call's: torch's name of its tensor's TypeMeta index, from the
    // process's own files (tensor_layout.hpp); none without them.
    if (e.dtype != CD_DTYPE_NONE && !nccl && (e.dtype & CD_FLIGHT_TORCH_DTYPE) && layout)
        out.dtype = torch::dtype_name(*layout, static_cast<uint16_t>(e.dtype & 0xffffu));
    if (e.op != CD_FLIGHT_NONE && nccl) {
        auto n = capture::nccl_redop_name(e.op);
        out.op = n ? std::string(*n) : "op" + std::to_string(e.op);  // one ncclRedOpCreatePreMulSum made
    } else if (e.op != CD_FLIGHT_NONE) {  // a c10d call's ReduceOp, read by the kernel (events.h)
        auto n = torch::c10d_reduce_op_name(e.op);
        out.op = n ? std::string(*n) : "op" + std::to_string(e.op);
    }
    if (e.root != CD_FLIGHT_NONE) out.root = static_cast<int32_t>(e.root);
    if (e.state == CD_FLIGHT_IN_CALL) {
        out.status = hang::Issued::kInCall;
    } else if (e.state == CD_FLIGHT_RETURNED) {
        auto n = nccl ? capture::nccl_result_name(e.status) : std::nullopt;
        out.status = n ? std::string(*n) : "returned " + std::to_string(e.status);
    }
    return out;
}

void FlightWatch::describe() {
    metrics_.describe("commdbg_collective_mismatch_total",
                      "Collective numbers of a communicator at which its ranks on this node issued different "
                      "collectives (kind, count, datatype, reduce op, root), from the flight recorder",
                      "counter");
    metrics_.describe("commdbg_comm_rank_seq",
                      "Collectives a rank issued on a communicator so far: the number of its last one", "gauge");
    metrics_.describe("commdbg_comm_rank_idle_seconds", "Seconds since a rank last issued a collective on a communicator",
                      "gauge");
}

void FlightWatch::observe(const std::vector<RankRecorder>& recorders, uint64_t now_ns, Clock::time_point now) {
    std::map<std::string, std::vector<const RankRecorder*>> by_comm;
    for (const RankRecorder& r : recorders) {
        by_comm[r.comm_id].push_back(&r);
        const Labels labels = {{"comm", r.comm_id},
                               {"rank", r.rank >= 0 ? std::to_string(r.rank) : ""},
                               {"nranks", r.nranks >= 0 ? std::to_string(r.nranks) : ""},
                               {"pid", std::to_string(r.owner.pid)},
                               {"host", host_}};
        metrics_.set("commdbg_comm_rank_seq", labels, static_cast<double>(r.seq), r.owner, now);
        if (r.last_enter_ns != 0 && now_ns >= r.last_enter_ns)
            metrics_.set("commdbg_comm_rank_idle_seconds", labels, static_cast<double>(now_ns - r.last_enter_ns) / 1e9,
                         r.owner, now);
    }
    // Communicators gone from every recorder are forgotten: bounded by what
    // the kernel keeps.
    std::erase_if(comms_, [&](const auto& c) { return !by_comm.count(c.first); });
    for (const auto& [id, ranks] : by_comm)
        if (ranks.size() > 1) compare(id, ranks, now);
}

// Each number differs while both of its signatures are still kept; one
// that did not differ at the last refresh is new.
void FlightWatch::compare(const std::string& comm_id, const std::vector<const RankRecorder*>& ranks,
                          Clock::time_point now) {
    std::vector<hang::RankIssued> issued;
    for (const RankRecorder* r : ranks) issued.push_back({static_cast<int>(r->owner.pid), &r->last});
    const std::vector<hang::Divergence> now_diverged = hang::divergences(issued);
    CommState& st = comms_[comm_id];
    std::set<uint64_t> seqs;
    for (const hang::Divergence& d : now_diverged) {
        seqs.insert(d.seq);
        if (st.diverged.count(d.seq)) continue;
        ++st.total;
        if (st.first) continue;
        st.first = d;
        std::cerr << "commdbgd: communicator " << comm_id << ": collective #" << d.seq
                  << " differs between the ranks on this node:";
        for (const auto& [sig, pids] : d.signatures) {
            std::cerr << " " << sig << " (pid";
            for (size_t i = 0; i < pids.size(); ++i) std::cerr << (i ? ", " : " ") << pids[i];
            std::cerr << ")";
        }
        std::cerr << " — run `commdbg hang` on these pids (docs/hang.md)\n";
    }
    st.diverged = std::move(seqs);
    // From 0, so that its first mismatch is an increase to Prometheus; the
    // series goes with the lowest rank's process.
    const RankRecorder* owner = *std::min_element(ranks.begin(), ranks.end(),
                                                  [](auto* a, auto* b) { return a->rank < b->rank; });
    metrics_.set("commdbg_collective_mismatch_total", {{"comm", comm_id}, {"host", host_}},
                 static_cast<double>(st.total), owner->owner, now);
}

nlohmann::json FlightWatch::mismatches() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, st] : comms_) {
        if (!st.first) continue;
        nlohmann::json sigs = nlohmann::json::array();
        for (const auto& [sig, pids] : st.first->signatures) sigs.push_back({{"signature", sig}, {"pids", pids}});
        out.push_back({{"comm_id", id}, {"mismatches", st.total}, {"first_seq", st.first->seq}, {"signatures", sigs}});
    }
    return out;
}

}  // namespace commdbg::daemon
