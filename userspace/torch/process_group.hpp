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

// Those of kGroupClasses the file at `path` has a vtable for, and the
// file's headers (its load segments, for its load bias in a process).
// Fails only when the file cannot be read.
struct GroupClasses {
    host::ElfData file;
    std::vector<GroupClass> classes;
};
Result<GroupClasses> derive_group_classes(const std::string& path);

}  // namespace commdbg::torch
