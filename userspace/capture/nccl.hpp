// SPDX-License-Identifier: Apache-2.0
// NCCL vocabulary: datatypes, reduction ops, collective names, communicator ids.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "events.h"

namespace commdbg::capture {

// Bytes per element of an ncclDataType_t; nullopt for values NCCL does not define.
std::optional<uint32_t> nccl_datatype_size(uint64_t dtype);
// "float32", "bfloat16", ...; "dtype(N)" style is left to callers for unknown values.
std::optional<std::string_view> nccl_datatype_name(uint64_t dtype);
std::optional<std::string_view> nccl_redop_name(uint64_t op);
// ncclResult_t's enumerator name ("ncclSuccess", "ncclRemoteError"); none
// for a value nccl.h does not define.
std::optional<std::string_view> nccl_result_name(int64_t result);

// "all_reduce", "all_gather", ... (the suffix of comm_counts keys).
std::string_view coll_name(cd_coll c);

// NCCL's own commHash: DJB2a over the 128-byte ncclUniqueId, bytes taken as
// signed char.  Equal on every rank and to what NCCL_DEBUG logs.
uint64_t nccl_comm_hash(std::span<const uint8_t, CD_UNIQUE_ID_BYTES> unique_id);

// Id of the n-th (0-based) child split off `parent_id` with `color`: the same
// on every rank of the new communicator, since all of them split in order.
uint64_t nccl_split_comm_id(uint64_t parent_id, int32_t color, uint32_t nth_split);

}  // namespace commdbg::capture
