// SPDX-License-Identifier: Apache-2.0
// Communicators of one process from the kernel's maps: ids (NCCL's commHash,
// or derived for splits), sizes and ranks, and those only seen in use.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bpf_session.hpp"
#include "snapshot.hpp"

namespace commdbg::snapshot {

// In creation order; communicators used by counted calls but never created
// while we watched come last, with origin BeforeAttach.
std::vector<CommInfo> communicators_of(uint32_t pid, const std::vector<capture::CommEntry>& comms,
                                       const std::vector<capture::CounterEntry>& counters);

// A c10d process group noted in the kernel (events.h, CD_TAIL_C10D_*).
struct C10dGroup {
    uint64_t ptr = 0;   // the object collectives are issued on (`this`)
    // The prefixes of the PrefixStore chain it was made with, outermost
    // last, '/'-joined: "default_pg/0" (torch 1.13's default group),
    // "default_pg/0/cpu" (2.x's CPU backend of it).  Its ranks meet under
    // these keys in the job's store, so every rank of the group has the
    // same.  Empty: unknown (made before commdbg watched).
    std::string name;
    int32_t rank = -1, nranks = -1;
};
// `pid`'s process groups (and torch 2.x's backends), named by their stores.
std::vector<C10dGroup> c10d_groups_of(uint32_t pid, const std::vector<capture::CommEntry>& comms);

// What tells one job's ranks from another job's on the node, for its c10d
// groups' names, which every job has alike: the job's rendezvous
// (MASTER_ADDR:MASTER_PORT, which torchrun sets and env:// reads), else
// torchelastic's run id, else the launcher the ranks share on one node
// (mp.spawn with a tcp:// init method): "127.0.0.1:29500", "run:abc",
// "launcher:4242.98765" (its pid and start time).  Empty: none is known.
std::string c10d_job(const std::map<std::string, std::string>& env, int ppid, uint64_t ppid_start_time);
// The id a c10d group has on every rank of one job,
// "c10d:127.0.0.1:29500/default_pg/0";
// nullopt when its name or its job is unknown.
std::optional<std::string> c10d_comm_id(const C10dGroup& g, const std::string& job);

}  // namespace commdbg::snapshot
