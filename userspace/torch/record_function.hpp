// SPDX-License-Identifier: Apache-2.0
// torch >= 2's record_function exit, found in torch's own code: the function
// a Python `record_function` scope's __exit__ reaches, which no symbol names.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "elf_symbols.hpp"
#include "result.hpp"

namespace commdbg::torch {

// The name a probe spec gives it (specs/torch-scopes.json).
inline constexpr std::string_view kRecordFunctionExit = "torch::autograd::profiler::record_function_exit_new";

// record_function_ops.cpp's static
//   record_function_exit_new(const intrusive_ptr<PythonRecordFunction>& r) { r->record.end(); }
// (what torch.ops.profiler._record_function_exit._RecordFunction runs) is
// compiled as `[endbr64] mov (%rdi),%rdi; add $imm8,%rdi (or lea imm8(%rdi),%rdi);
// jmp at::RecordFunction::end()`: it loads the object from the handle and
// tail-calls end() on its member.  It lies in the translation unit of the
// exported record_function_enter_new: the one function of that form within
// kWindow bytes of it, whose jump reaches end() (directly or through a PLT
// stub whose GOT slot is relocated to end()).  The symbol it is probed at,
// or nullopt with `why` where there is not exactly one.  It is probed at its
// tail jump, not its entry: the kernel emulates a `jmp` (one exception),
// where the entry's `mov` is single-stepped out of line (a second one); the
// exit's probe reads no register (it closes the thread's innermost labelled
// scope), the stack there is the entry's (nothing is pushed, the return
// address is at %rsp), and every call runs it.
std::optional<host::ElfSymbol> derive_record_function_exit(const std::string& path, std::string& why);
inline constexpr uint64_t kRecordFunctionExitWindow = 256 * 1024;

}  // namespace commdbg::torch
