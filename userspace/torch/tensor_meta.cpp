// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <iterator>
#include <limits>

#include "tensor_layout.hpp"

namespace commdbg::torch {
namespace {

// c10::ScalarType in enum order (c10/core/ScalarType.h; append-only), as
// torch names them (str(torch.float32) less "torch."), with the element
// size that each file's own table must show for the name to be used.
struct ScalarName {
    const char* name;
    uint8_t size;
};
constexpr ScalarName kScalarTypes[] = {
    {"uint8", 1},         {"int8", 1},           {"int16", 2},           {"int32", 4},
    {"int64", 8},         {"float16", 2},        {"float32", 4},         {"float64", 8},
    {"complex32", 4},     {"complex64", 8},      {"complex128", 16},     {"bool", 1},
    {"qint8", 1},         {"quint8", 1},         {"qint32", 4},          {"bfloat16", 2},
    {"quint4x2", 1},      {"quint2x4", 1},       {"bits1x8", 1},         {"bits2x4", 1},
    {"bits4x2", 1},       {"bits8", 1},          {"bits16", 2},          {"float8_e5m2", 1},
    {"float8_e4m3fn", 1}, {"float8_e5m2fnuz", 1}, {"float8_e4m3fnuz", 1}, {"uint16", 2},
    {"uint32", 4},        {"uint64", 8},
};

}  // namespace

uint16_t named_scalar_types(const std::vector<uint8_t>& itemsizes) {
    uint16_t n = 0;
    while (n < itemsizes.size() && n < std::size(kScalarTypes) && itemsizes[n] == kScalarTypes[n].size) ++n;
    return n;
}

std::string dtype_name(const TensorLayout& l, uint16_t index) {
    if (index < l.named) return kScalarTypes[index].name;
    return "scalar_type_" + std::to_string(index);
}

Result<TensorMeta> read_tensor(host::RemoteMemory& mem, const TensorLayout& l, uint64_t impl) {
    using R = Result<TensorMeta>;
    auto unread = [&](const char* what) {
        return R::fail(std::string("cannot read the tensor's ") + what + " (errno " + std::to_string(mem.last_error()) +
                       ")");
    };
    uint64_t dims = 0;
    uint8_t flags = 0;
    if (!mem.get(impl + l.dim, dims) || !mem.get(impl + l.symbolic_at, flags)) return unread("dim count");
    if (flags & l.symbolic_mask) return R::fail("the tensor has a symbolic shape");
    if (dims > kMaxTensorDims) return R::fail("the tensor's dim count " + std::to_string(dims) + " is not plausible");
    uint64_t at = impl + l.sizes;
    if (dims > l.inline_dims && !mem.get(at, at)) return unread("sizes pointer");
    TensorMeta t;
    t.sizes.resize(dims);
    if (dims && !mem.read(at, t.sizes.data(), dims * sizeof(int64_t))) return unread("sizes");
    uint16_t type = 0;
    if (!mem.get(impl + l.numel, t.numel) || !mem.get(impl + l.data_type, type)) return unread("numel and dtype");
    // The fields must agree with each other: a wrong shape is worse than none.
    int64_t product = 1;
    for (int64_t s : t.sizes) {
        if (s < 0 || (s && product > std::numeric_limits<int64_t>::max() / s))
            return R::fail("the tensor's sizes are not plausible");
        product *= s;
    }
    if (product != t.numel) return R::fail("the tensor's numel is not the product of its sizes");
    if (type >= l.itemsizes.size())
        return R::fail("the tensor's dtype index " + std::to_string(type) + " is not a ScalarType");
    t.dtype = dtype_name(l, type);
    t.bytes = uint64_t(t.numel) * l.itemsizes[type];
    return t;
}

}  // namespace commdbg::torch
