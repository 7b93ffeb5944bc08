// SPDX-License-Identifier: Apache-2.0
// Communicators of one process from the kernel's maps: ids (NCCL's commHash,
// or derived for splits), sizes and ranks, and those only seen in use.
#pragma once

#include <cstdint>
#include <vector>

#include "bpf_session.hpp"
#include "snapshot.hpp"

namespace commdbg::snapshot {

// In creation order; communicators used by counted calls but never created
// while we watched come last, with origin BeforeAttach.
std::vector<CommInfo> communicators_of(uint32_t pid, const std::vector<capture::CommEntry>& comms,
                                       const std::vector<capture::CounterEntry>& counters);

}  // namespace commdbg::snapshot
