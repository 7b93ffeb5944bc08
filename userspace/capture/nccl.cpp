// SPDX-License-Identifier: Apache-2.0
#include "nccl.hpp"

#include <array>

#include "arch.hpp"

namespace commdbg::capture {

namespace {

struct DatatypeInfo {
    std::string_view name;
    uint32_t size;  // bytes per element; bpf/nccl_dtype.h must agree (tests/unit/test_dtype.cpp)
};
// Indexed by ncclDataType_t (nccl.h 2.28: ncclInt8 = 0 .. ncclFloat8e5m2 = 11).
constexpr std::array<DatatypeInfo, 12> kDatatypes = {{
    {"int8", 1},    {"uint8", 1},   {"int32", 4},   {"uint32", 4},    {"int64", 8},   {"uint64", 8},
    {"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2}, {"fp8e4m3", 1}, {"fp8e5m2", 1}}};
// ncclSum = 0 .. ncclAvg = 4; values from 5 on are ncclNumOps / user-created ops.
constexpr std::array<std::string_view, 5> kRedopNames = {"sum", "prod", "max", "min", "avg"};
// ncclResult_t, nccl.h 2.28: ncclSuccess = 0 .. ncclInProgress = 7.
constexpr std::array<std::string_view, 8> kResultNames = {
    "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
    "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
constexpr std::array<std::string_view, CD_COLL_MAX> kCollNames = {
    "none",   "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
    "all_to_all", "gather", "scatter",    "send",           "recv",      "barrier"};

}  // namespace

std::optional<uint32_t> nccl_datatype_size(uint64_t dtype) {
    if (dtype >= kDatatypes.size()) return std::nullopt;
    return kDatatypes[dtype].size;
}

std::optional<std::string_view> nccl_datatype_name(uint64_t dtype) {
    if (dtype >= kDatatypes.size()) return std::nullopt;
    return kDatatypes[dtype].name;
}

std::optional<std::string_view> nccl_redop_name(uint64_t op) {
    if (op >= kRedopNames.size()) return std::nullopt;
    return kRedopNames[op];
}

std::optional<std::string_view> nccl_result_name(int64_t result) {
    if (result < 0 || static_cast<uint64_t>(result) >= kResultNames.size()) return std::nullopt;
    return kResultNames[static_cast<size_t>(result)];
}

std::string_view coll_name(cd_coll c) {
    auto i = static_cast<uint32_t>(c);
    return i < kCollNames.size() ? kCollNames[i] : std::string_view("unknown");
}

uint64_t nccl_comm_hash(std::span<const uint8_t, CD_UNIQUE_ID_BYTES> unique_id) {
    // NCCL's getHash(): `result = ((result << 5) + result) ^ string[c]` with
    // `const char* string`: each byte as the platform's char (arch.hpp).
    uint64_t h = 5381;
    for (uint8_t b : unique_id) h = ((h << 5) + h) ^ arch::nccl_hash_char(b);
    return h;
}

uint64_t nccl_split_comm_id(uint64_t parent_id, int32_t color, uint32_t nth_split) {
    // FNV-1a (64-bit) over the little-endian bytes of parent_id (8), color (4)
    // and nth_split (4): deterministic, so every rank of the child derives it.
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) {
            h ^= (v >> (8 * i)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    };
    mix(parent_id, 8);
    mix(static_cast<uint32_t>(color), 4);
    mix(nth_split, 4);
    return h;
}

}  // namespace commdbg::capture
