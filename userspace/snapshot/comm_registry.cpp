// SPDX-License-Identifier: Apache-2.0
#include "comm_registry.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <cstring>

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
        if (c->val.origin == CD_COMM_C10D_GROUP || c->val.origin == CD_COMM_C10D_STORE) continue;  // c10d_groups_of
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

namespace {
std::string name_of(const cd_comm_val& v) {
    return std::string(v.name, strnlen(v.name, sizeof(v.name)));
}
}  // namespace

std::vector<C10dGroup> c10d_groups_of(uint32_t pid, const std::vector<capture::CommEntry>& comms) {
    std::map<uint64_t, const cd_comm_val*> stores;
    for (const auto& c : comms)
        if (c.key.tgid == pid && c.val.origin == CD_COMM_C10D_STORE) stores[c.key.comm] = &c.val;
    // Inner stores first; a chain is a few links long (bounded, should an
    // address reused by another store make a loop).
    constexpr int kMaxLinks = 8;
    std::vector<C10dGroup> out;
    for (const auto& c : comms) {
        if (c.key.tgid != pid || c.val.origin != CD_COMM_C10D_GROUP) continue;
        std::vector<std::string> prefixes;
        auto s = stores.find(c.val.parent);
        for (int i = 0; i < kMaxLinks && s != stores.end(); ++i, s = stores.find(s->second->parent)) {
            std::string p = name_of(*s->second);
            while (!p.empty() && p.back() == '/') p.pop_back();
            if (!p.empty()) prefixes.insert(prefixes.begin(), p);
        }
        std::string name;
        for (const std::string& p : prefixes) name += (name.empty() ? "" : "/") + p;
        out.push_back({c.key.comm, std::move(name), c.val.rank, c.val.nranks});
    }
    return out;
}

std::string c10d_job(const std::map<std::string, std::string>& env, int ppid, uint64_t ppid_start_time) {
    auto get = [&](const char* k) {
        auto it = env.find(k);
        return it == env.end() ? std::string() : it->second;
    };
    if (!get("MASTER_ADDR").empty() && !get("MASTER_PORT").empty()) return get("MASTER_ADDR") + ":" + get("MASTER_PORT");
    if (!get("TORCHELASTIC_RUN_ID").empty()) return "run:" + get("TORCHELASTIC_RUN_ID");
    if (ppid > 1 && ppid_start_time) return "launcher:" + std::to_string(ppid) + "." + std::to_string(ppid_start_time);
    return "";
}

std::optional<std::string> c10d_comm_id(const C10dGroup& g, const std::string& job) {
    if (g.name.empty() || job.empty()) return std::nullopt;
    return "c10d:" + job + "/" + g.name;
}

}  // namespace commdbg::snapshot
