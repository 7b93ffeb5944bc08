// SPDX-License-Identifier: Apache-2.0
// Where an nn.Module call enters native code: nn.Module._call_impl calls
// torch._C._get_tracing_state() first (torch 1.13 and 2.x), a pybind11
// binding in libtorch_python whose dispatcher (a lambda no symbol names)
// calls torch::jit::tracer::getTracingState().  A probe on that call fires
// once per binding call; one on getTracingState() itself fires too at every
// op torch 2.x's Python bindings dispatch (they all call it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "elf_symbols.hpp"
#include "result.hpp"

namespace commdbg::torch {

// The name a probe spec gives the module entry (specs/torch-modules.json).
inline constexpr std::string_view kModuleEntry = "torch._C._get_tracing_state";

// The binding's call sites of getTracingState() in libtorch_python at `path`:
//  - initPythonTracerBindings (exported) stores the binding's name, the
//    string "_get_tracing_state", at +0 of a pybind11 function_record and,
//    with no call between, its dispatcher's address at
//    +kFunctionRecordImpl of the same record (pybind11/attr.h: name, doc,
//    signature, the args vector, then impl);
//  - every path from the dispatcher's entry reaches a call of
//    getTracingState() (its PLT stub, the GOT slot's relocation checked)
//    before any other call, return or indirect jump.
// Those calls (one per path: torch 2.x's dispatcher has a setter path too),
// or an error that says which step failed.
Result<std::vector<host::ElfSymbol>> tracing_state_binding_calls(const std::string& path);
inline constexpr int64_t kFunctionRecordImpl = 0x30;

// Where the module entry is probed in the torch library at `path`, which the
// spec's derivation asks for libtorch_python and libtorch_cpu alike:
//  - libtorch_python: the binding's calls (above); none where they are not found;
//  - libtorch_cpu: nothing where libtorch_python beside it has those calls;
//    else getTracingState() itself, with `note` saying what that costs and why.
std::vector<host::ElfSymbol> module_entry_sites(const std::string& path, std::string& note);

}  // namespace commdbg::torch
