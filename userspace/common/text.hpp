// SPDX-License-Identifier: Apache-2.0
// Numbers as people read them in outputs and messages.
#pragma once

#include <cstdint>
#include <string>

namespace commdbg {

std::string hex(uint64_t v);    // "0x1a2b"
std::string hex16(uint64_t v);  // "0x%016x"

}  // namespace commdbg
