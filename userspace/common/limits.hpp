// SPDX-License-Identifier: Apache-2.0
// The limits and defaults of a tracing session, in one place: `commdbg
// attach` with or without commdbgd, `commdbg run` and the control protocol
// all take the same values and say the same thing about a bad one.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstddef>
#include <optional>
#include <string>

namespace commdbg::limits {

inline constexpr size_t kDefaultMaxRecords = 200000;
inline constexpr size_t kDefaultMaxDepth = 128;
inline constexpr size_t kDefaultRingbufKb = 8192;

// Kernel counter keys (symbol, communicator, datatype) one process may hold
// in the node-wide counter map; past them its calls are still counted exactly,
// per symbol, without that breakdown.  A torch session takes ~3000 (one per op).
inline constexpr size_t kDefaultCounterKeysPerProcess = 8192;

// commdbgd: library files (libnccl copies) probed for one user other than
// root.  A node has a few NCCL builds, a container or venv per job a few
// more; each file takes ~20 uprobes and a stop of the process that maps it.
inline constexpr size_t kLibraryFilesPerUid = 64;
// What the Python resolver (py_objects.hpp) caches of a target's objects --
// code objects, line tables, types, named frames, module trees and paths --
// in bytes, whatever the target builds: its strings are the target's to make
// long and many.  commdbgd's unit allows 512 MiB in all (MemoryMax=512M): a
// quarter for names, program-wide, leaves the rest to the --max-sessions
// (default 4) sessions' records and outputs, so no target gets the daemon
// OOM-killed.  32 MiB per process holds a real model's names many times (a
// 10000-module tree is ~1 MiB) and lets four processes fill theirs.
inline constexpr size_t kPyCacheBytesPerProcess = 32u << 20;
inline constexpr size_t kPyCacheBytesTotal = 128u << 20;

// Ceilings for anyone (root included): past them a session could take the
// node's memory (bench_model prints the bytes per retained record, in the
// model and held while rendering the outputs).
inline constexpr size_t kMaxRecordsCeiling = 20'000'000;
inline constexpr size_t kMaxDepthCeiling = 4096;
inline constexpr size_t kMinRingbufKb = 4;
inline constexpr size_t kMaxRingbufKb = 1u << 20;  // 1 GiB
// A window longer than 30 days is a typo; 0 means "until Ctrl-C or exit".
inline constexpr double kMaxDurationS = 30.0 * 86400;

// Why `seconds` is not a valid --duration, or nothing.  0 is valid (no limit).
inline std::optional<std::string> duration_problem(double seconds) {
    if (!std::isfinite(seconds)) return "must be a finite number of seconds";
    if (seconds < 0) return "must not be negative (0 or leave it out: until Ctrl-C or the process exits)";
    if (seconds > kMaxDurationS)
        return "must be at most " + std::to_string(static_cast<long>(kMaxDurationS)) +
               " seconds (30 days); leave it out to trace until Ctrl-C or the process exits";
    return std::nullopt;
}

// "12.5 s", "30 s": a duration as a person writes it (no trailing zeros).
inline std::string format_seconds(double seconds) {
    char b[64];
    snprintf(b, sizeof(b), "%.6g s", seconds);
    return b;
}

}  // namespace commdbg::limits
