// SPDX-License-Identifier: Apache-2.0
#include "comm_registry.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "nccl.hpp"

namespace commdbg::snapshot {

std::vector<CommInfo> communicators_of(uint32_t pid, const std::vector<capture::CommEntry>& comms,
                                       const std::vector<capture::CounterEntry>& counters) {
    std::set<uint64_t> used;
    for (const auto& c : counters)
        if (c.key.tgid == pid && c.key.comm) used.insert(c.key.comm);
    std::vector<const capture::CommEntry*> mine;
    for (const auto& c : comms)
        if (c.key.tgid == pid) mine.push_back(&c);
    // Creation order, so a split's parent has its id before the child needs it.
    std::sort(mine.begin(), mine.end(), [](const capture::CommEntry* a, const capture::CommEntry* b) {
        return a->val.created_ns < b->val.created_ns;
    });
    std::vector<CommInfo> out;
    std::map<uint64_t, uint64_t> id_of;
    for (const capture::CommEntry* c : mine) {
        CommInfo ci;
        ci.ptr = c->key.comm;
        ci.nranks = c->val.nranks;
        ci.rank = c->val.rank;
        ci.destroyed = c->val.destroyed != 0;
        switch (c->val.origin) {
        case CD_COMM_FROM_ID:
            ci.origin = CommOrigin::InitRank;
            ci.id = capture::nccl_comm_hash(
                std::span<const uint8_t, CD_UNIQUE_ID_BYTES>(c->val.unique_id, CD_UNIQUE_ID_BYTES));
            break;
        case CD_COMM_FROM_SPLIT: {
            // NCCL passes no size or rank for a split child: they stay unknown.
            ci.origin = CommOrigin::Split;
            ci.parent_ptr = c->val.parent;
            auto parent = id_of.find(c->val.parent);
            if (parent != id_of.end() && c->val.split_index >= 0)
                ci.id = capture::nccl_split_comm_id(parent->second, c->val.color,
                                                    static_cast<uint32_t>(c->val.split_index));
            break;
        }
        case CD_COMM_FROM_ALL:
            ci.origin = CommOrigin::InitAll;
            break;
        default:
            ci.origin = CommOrigin::Unknown;
        }
        if (ci.id) id_of[ci.ptr] = *ci.id;
        used.erase(ci.ptr);
        out.push_back(std::move(ci));
    }
    for (uint64_t ptr : used) {
        CommInfo ci;
        ci.ptr = ptr;
        ci.origin = CommOrigin::BeforeAttach;
        out.push_back(std::move(ci));
    }
    return out;
}

}  // namespace commdbg::snapshot
