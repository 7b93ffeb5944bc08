// SPDX-License-Identifier: Apache-2.0
// Where an output (--json, --table, --trace) goes, checked before tracing
// starts and written after it ends, without ever replacing something that is
// not a regular file: a device, a FIFO, a terminal or /dev/stdout is written
// through; a regular file is replaced atomically; a symlink keeps pointing
// where it did and its target gets the content.
#pragma once

#include <string>
#include <vector>

#include "result.hpp"

namespace commdbg::host {

struct OutputTarget {
    std::string option;    // "--json": named in every message
    std::string path;      // as the user gave it
    std::string resolved;  // after symlinks: the file that gets the content
    enum class Kind {
        Replace,        // regular file (or none yet): temp file + rename over `resolved`
        WriteThrough,   // device, FIFO, socket, terminal, /proc magic link: open and write
        Descriptor,     // /dev/stdout, /proc/self/fd/N, ...: write to our fd N, offset shared
    } kind = Kind::Replace;
    int fd = -1;  // Kind::Descriptor
};

// Checks one output before tracing starts: non-empty, not a directory, its
// directory exists and is writable, its filesystem has room.  The error says
// which option, what is wrong and what to do.
Result<OutputTarget> check_output(const std::string& option, const std::string& path);

// check_output for each (option, path) with a non-empty option, plus: no two
// outputs name the same file.  An empty path is an error, not "no output":
// callers pass only the options the user gave.
Result<std::vector<OutputTarget>> check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// Writes `content` to the target.  Throws CommdbgError naming the path and
// the errno text on failure; a Replace target is untouched then.
void write_output(const OutputTarget& target, const std::string& content);

// write_output(check_output("output", path)): for callers without options.
void write_file_atomic(const std::string& path, const std::string& content);

// Where an output whose own path failed is saved instead, so a window is
// never lost: $TMPDIR (else /tmp) / commdbg-<pid>-<stem>.<ext>, atomically.
// Returns the path written, or an error.
Result<std::string> save_fallback(const std::string& stem, const std::string& ext, const std::string& content);

}  // namespace commdbg::host
