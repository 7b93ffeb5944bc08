// SPDX-License-Identifier: Apache-2.0
// A built-in probe spec by name, for tests that plan it on a real library.
#pragma once

#include <stdexcept>
#include <string>

#include "probe_spec.hpp"

namespace commdbg::capture::test {

inline const ProbeSpec& builtin(const std::string& name) {
    for (const auto& s : builtin_specs())
        if (s.name == name) return s;
    throw std::runtime_error("no built-in spec " + name);
}

}  // namespace commdbg::capture::test
