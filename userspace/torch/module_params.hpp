// SPDX-License-Identifier: Apache-2.0
// A module's parameters as CommDebugMode's get_parameter_info() /
// get_sharding_info() show them, read from outside: the module's own
// `_parameters` dict (recurse=False), each parameter's TensorImpl through
// the torch.Tensor object (THPVariable), and for a DTensor its local shard
// and placements.  Where the Python object keeps its TensorImpl is derived
// from the process's libtorch_python (the getter of Tensor._cdata), and the
// pointer read there is used only when its first word is c10::TensorImpl's
// vtable: never a shape read from something else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "result.hpp"

namespace commdbg::torch {

// Parameters kept per module; a module with more keeps its first ones and
// counts the rest.
inline constexpr size_t kMaxModuleParams = 256;

// The offset of the TensorImpl* in a THPVariable, from the machine code of
// THPVariable_get_cdata in the libtorch_python file at `path`.
Result<uint32_t> derive_variable_impl(const std::string& path);

struct ParamInfo {
    std::string name;                  // the key in the module's _parameters
    std::vector<int64_t> shape;        // the tensor's (a DTensor's: the global shape)
    std::string dtype;                 // torch's name ("float32")
    std::vector<int64_t> local_shape;  // a DTensor's local shard; else the shape
    // A DTensor's placements as CommDebugMode prints them ("(Shard(dim=0),)");
    // nullopt for a plain tensor, or a placement commdbg does not know.
    std::optional<std::string> placements;
    bool dtensor = false;
};

struct ModuleParams {
    std::vector<ParamInfo> params;
    uint32_t unread = 0;  // parameters whose tensor could not be read (or past kMaxModuleParams)
    // Some parameter is not readable yet but will be (an FSDP2 parameter
    // before its first unshard whose FSDPParam does not say all of it), or
    // none was readable: asking again later may read it.
    bool retry = false;
    // Its submodules (its _modules dict: key, module object), at most
    // kMaxModuleParams: a module that issues no record is seen through its parent.
    std::vector<std::pair<std::string, uint64_t>> children;
};

// What the record model asks: the parameters of module object `module` in
// process `pid`, nullopt when they cannot be read at all (no Python object
// layout, no libtorch_python layout).
class ParameterSource {
public:
    virtual ~ParameterSource() = default;
    virtual std::optional<ModuleParams> module_parameters(uint32_t pid, uint64_t module) = 0;
};

// A placements tuple's text as Python's repr of the tuple prints it.
std::string placements_text(const std::vector<std::string>& items);

}  // namespace commdbg::torch
