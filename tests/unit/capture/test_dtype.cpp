// SPDX-License-Identifier: Apache-2.0
// The BPF program's bytes counters and userspace's datatype table must agree
// on every size: a disagreement would show bytes that no call moved.
#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>

#include "nccl.hpp"
#include "nccl_dtype.h"

using namespace commdbg;
using namespace commdbg::capture;

TEST(Dtype, BpfSizeEqualsUserspaceSizeForEveryByteValue) {
    for (uint32_t t = 0; t < 256; ++t) {
        const auto user = nccl_datatype_size(t);
        // The BPF side says 0 where userspace has no entry.
        EXPECT_EQ(dtype_size(t), user ? *user : 0u) << "ncclDataType_t " << t;
        // A named type has a size and a sized one a name.
        EXPECT_EQ(nccl_datatype_name(t).has_value(), user.has_value()) << "ncclDataType_t " << t;
    }
}

TEST(Dtype, BpfSizeIsZeroForNoDtypeAndOutOfRangeValues) {
    EXPECT_EQ(dtype_size(CD_DTYPE_NONE), 0u);
    EXPECT_EQ(dtype_size(12), 0u);
    EXPECT_EQ(dtype_size(0x100), 0u);
}

// nccl.h 2.28: ncclInt8 = 0 .. ncclFloat8e5m2 = 11, with the sizes NCCL documents.
TEST(Dtype, NcclDefinedTypesHaveNcclDocumentedSizes) {
    struct Expected {
        uint32_t value;
        std::string_view name;
        uint32_t size;
    };
    const Expected nccl[] = {{0, "int8", 1},    {1, "uint8", 1},     {2, "int32", 4},    {3, "uint32", 4},
                             {4, "int64", 8},   {5, "uint64", 8},    {6, "float16", 2},  {7, "float32", 4},
                             {8, "float64", 8}, {9, "bfloat16", 2},  {10, "fp8e4m3", 1}, {11, "fp8e5m2", 1}};
    for (const auto& e : nccl) {
        EXPECT_EQ(nccl_datatype_name(e.value), e.name) << e.value;
        EXPECT_EQ(nccl_datatype_size(e.value), e.size) << e.name;
        EXPECT_EQ(dtype_size(e.value), e.size) << e.name;
    }
}
