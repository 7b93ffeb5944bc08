// SPDX-License-Identifier: Apache-2.0
// Which object a probed c10d method runs on, and where it keeps its rank and
// size, from one libtorch file: the class's vtable (an object whose first
// word is it is of that class), its base through the C++ ABI's typeinfo
// (__si_class_type_info: the base's typeinfo at +16, a relocation in the
// file), and the base's `(int rank, int size)` constructor's stores.  The
// proofs per torch build: docs/design/tensor-layout.md, section 4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "elf_symbols.hpp"
#include "result.hpp"

namespace commdbg::torch {

// The Itanium C++ ABI: a vtable's address point (what an object's first
// word holds) follows offset-to-top and the typeinfo pointer.
inline constexpr uint64_t kVtableAddressPoint = 16;

struct GroupClass {
    std::string name;                  // "c10d::ProcessGroupGloo"
    uint64_t vtable = 0;               // link-time address of its vtable's address point
    std::optional<uint32_t> rank, size;  // byte offsets of rank_ and size_; unset: unknown
    std::string why_no_rank;           // when unset
};

// The process-group classes whose methods torch-c10d probes, mangled.
inline constexpr std::string_view kGroupClasses[] = {"N4c10d16ProcessGroupGlooE", "N4c10d16ProcessGroupNCCLE",
                                                     "N4c10d12ProcessGroupE"};

// Where a c10d::ReduceOp (the first member of every c10d options struct
// that reduces) keeps its op_, a one-byte RedOpType.  From the file's own
// code: the complete-object destructor its vtable points to destroys the
// one member after op_ (`supplement_`, an intrusive_ptr) at +S, through a
// function (libtorch_cpu) or inline (libtorch_python) whose `lock sub` on
// the pointee's refcount says how wide c10::intrusive_ptr_target's two
// counts are (w: 4 on torch 2.x, 8 on 1.13).  op_ is at 8 + 2w (after the vtable pointer and the counts), and
// only when S is where the ABI then puts the next 8-aligned member.
struct ReduceOpLayout {
    uint64_t vtable = 0;  // link-time address of its vtable's address point
    uint32_t op_at = 0;   // byte offset of op_
    uint32_t size = 0;    // bytes it occupies: supplement_, its last member, ends there
};

// Where c10d's BroadcastOptions, GatherOptions and ScatterOptions (one
// offset, the same in all three) and ReduceOptions keep rootRank (an
// int64_t), from the code of ProcessGroupGloo's broadcast, gather, scatter
// and reduce: each first checks opts.rootRank against the group's size_.
// A ReduceOptions' must lie just past its ReduceOp.
struct RootLayout {
    std::optional<uint32_t> broadcast;  // byte offset in Broadcast/Gather/ScatterOptions; unset: why_not
    std::optional<uint32_t> reduce;     // in ReduceOptions; unset: why_not
    std::string why_not;
};

// A RedOpType's name as torch's Python enum has it, lower-cased ("sum",
// "max", "premul_sum"; torch/csrc/distributed/c10d/Types.hpp, the same on
// 1.13 and 2.x); nullopt for another value.
std::optional<std::string_view> c10d_reduce_op_name(uint32_t op);

// Those of kGroupClasses the file at `path` has a vtable for, and the
// file's headers (its load segments, for its load bias in a process).
// Fails only when the file cannot be read.
struct GroupClasses {
    host::ElfData file;
    std::vector<GroupClass> classes;
    std::optional<ReduceOpLayout> reduce_op;  // unset: why_no_reduce_op
    std::string why_no_reduce_op;
    RootLayout roots;
};
Result<GroupClasses> derive_group_classes(const std::string& path);

// A file's own c10d::ReduceOp alone (libtorch_python has its own copy of the
// vtable, and the options Python makes hold it).  Fails only when the file
// cannot be read.
struct ReduceOpFacts {
    host::ElfData file;
    std::optional<ReduceOpLayout> reduce_op;  // unset: why_no_reduce_op
    std::string why_no_reduce_op;
};
Result<ReduceOpFacts> derive_reduce_op_facts(const std::string& path);

}  // namespace commdbg::torch
