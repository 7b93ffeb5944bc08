// SPDX-License-Identifier: Apache-2.0
// Numbers and names as people read them in outputs and messages.
#pragma once

#include <cstdint>
#include <string>

namespace commdbg {

std::string hex(uint64_t v);    // "0x1a2b"
std::string hex16(uint64_t v);  // "0x%016x"
std::string lower(std::string s);  // ASCII letters lower-cased: "LOCAL_RANK" -> "local_rank"

}  // namespace commdbg
