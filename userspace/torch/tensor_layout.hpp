// SPDX-License-Identifier: Apache-2.0
// Where a c10::TensorImpl keeps its shape, element count and dtype, derived
// from the machine code of one libc10 file's own exported readers
// (TensorImpl::sizes_custom, strides_custom, numel_custom, HandleResize),
// and the reading of a live tensor with it.  Nothing is assumed of a torch
// version: a file whose code has another shape gives an error, and a tensor
// whose fields disagree (numel is not the product of the sizes) gives one
// too, never a wrong shape.  The facts, per torch build, and the proofs:
// docs/design/tensor-layout.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remote_memory.hpp"
#include "result.hpp"

namespace commdbg::torch {

// More dims than this is a pointer gone wrong, not a tensor (torch's own limit is 64).
inline constexpr size_t kMaxTensorDims = 64;

// Byte offsets from a TensorImpl*, and what the file says of dtypes.
struct TensorLayout {
    uint32_t dim = 0;           // sizes_and_strides_.size_: the dim count (u64)
    uint32_t sizes = 0;         // inline sizes (dim <= inline_dims), else a pointer to sizes then strides
    uint32_t inline_dims = 0;   // how many dims sit inline
    uint32_t numel = 0;         // numel_ (i64)
    uint32_t data_type = 0;     // data_type_: a caffe2::TypeMeta index (u16)
    uint32_t symbolic_at = 0;   // the byte holding has_symbolic_sizes_strides_
    uint8_t symbolic_mask = 0;  // and its bit: when set the stored sizes are not the shape
    uint16_t undefined = 0;     // the TypeMeta index of Undefined: indices below are ScalarTypes
    std::vector<uint8_t> itemsizes;  // bytes per element of each ScalarType, from the file's own table
    uint16_t named = 0;         // dtype names are known for the indices below this (see dtype_name)
};

// Derives the layout from the libc10 file at `path` (as this process can
// open it: a MappedFile's open_path).  The error says which reader's code
// did not have the expected shape.
Result<TensorLayout> derive_tensor_layout(const std::string& path);

// One tensor, read from a live process.
struct TensorMeta {
    std::vector<int64_t> sizes;
    std::string dtype;  // torch's name ("float32"), or "scalar_type_<index>" for one not named
    int64_t numel = 0;
    uint64_t bytes = 0;  // numel * the element size
};

// Reads the TensorImpl at `impl` (an at::Tensor's one pointer).  Fails on a
// read that fails, a symbolic shape, and fields that disagree.
Result<TensorMeta> read_tensor(host::RemoteMemory& mem, const TensorLayout& l, uint64_t impl);

// How many of torch's ScalarType names hold for a file whose element sizes
// are `itemsizes`: the enum is append-only, and its sizes are checked name
// by name up to the first that differs.
uint16_t named_scalar_types(const std::vector<uint8_t>& itemsizes);

// torch's name of ScalarType `index` when the file's element sizes agree
// with torch's enum up to it, else "scalar_type_<index>".
std::string dtype_name(const TensorLayout& l, uint16_t index);

}  // namespace commdbg::torch
