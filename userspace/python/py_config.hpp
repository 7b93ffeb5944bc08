// SPDX-License-Identifier: Apache-2.0
// From a discovered interpreter (python_runtime.hpp) to what the BPF frame
// walker reads (events.h, cd_py_cfg), checked so that the kernel never walks
// with a layout it cannot use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "events.h"
#include "python_runtime.hpp"
#include "result.hpp"

namespace commdbg::python {

// How Python stacks are captured: off, at collectives / c10d / scopes
// (default), or also at every op (`--py-stack ops`: ops are many).
enum class PyStackMode : uint8_t { Off, Default, Ops };
// "off" | "default" | "ops" (inline: the control protocol's fuzzer links no more than it)
inline std::optional<PyStackMode> parse_py_stack_mode(const std::string& s) {
    if (s == "off") return PyStackMode::Off;
    if (s == "default") return PyStackMode::Default;
    if (s == "ops") return PyStackMode::Ops;
    return std::nullopt;
}

// Fails (with what to do) for a layout the walker cannot follow, e.g. a key
// past glibc's first block of key slots.
Result<cd_py_cfg> py_walk_config(const PyLayout& l, uint32_t max_frames);

}  // namespace commdbg::python
