// SPDX-License-Identifier: Apache-2.0
// Checks for command-line options whose messages name the valid range in
// words: CLI11's own print the range of a double (309 digits).  Shared by
// commdbg and commdbgd.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include "limits.hpp"

namespace commdbg {

namespace option_detail {

// A whole decimal number, no sign, no suffix; nullopt otherwise or past 2^64.
inline std::optional<unsigned long long> parse_count(const std::string& s) {
    if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::stoull(s);
}

}  // namespace option_detail

inline CLI::Validator integer_in(size_t lo, size_t hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            auto n = option_detail::parse_count(s);
            if (n && *n >= lo && *n <= hi) return {};
            return "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + " (got " +
                   s.substr(0, 32) + ")";
        },
        "INT in [" + std::to_string(lo) + " - " + std::to_string(hi) + "]");
}

inline CLI::Validator duration_seconds() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            char* end = nullptr;
            errno = 0;
            double d = std::strtod(s.c_str(), &end);
            if (s.empty() || !end || *end != '\0') return "must be a number of seconds (got " + s.substr(0, 32) + ")";
            if (auto problem = limits::duration_problem(d)) return *problem + " (got " + s.substr(0, 32) + ")";
            return {};
        },
        "SECONDS");
}

inline CLI::Validator process_id() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            auto n = option_detail::parse_count(s);
            if (n && *n >= 1 && *n <= 4194304) return {};  // the kernel's PID_MAX_LIMIT
            return "must be a process id, a positive integer (got " + s.substr(0, 32) + ")";
        },
        "PID");
}

}  // namespace commdbg
