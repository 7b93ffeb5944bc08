// SPDX-License-Identifier: Apache-2.0
// Itanium C++ demangling for display; probing always uses the mangled name.
#pragma once

#include <string>
#include <string_view>

namespace commdbg::host {

// Returns the demangled form of `mangled`, or `mangled` unchanged when it is not a
// mangled C++ name (C symbols like "ncclAllReduce") or does not demangle.
std::string demangle(std::string_view mangled);

}  // namespace commdbg::host
