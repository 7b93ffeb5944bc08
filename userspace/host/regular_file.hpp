// SPDX-License-Identifier: Apache-2.0
// Reading a small file another process's tree holds: only a regular file,
// never blocking on a FIFO or device, never more than a bound.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace commdbg::host {

// Whether the regular file at `path` holds `text` in its first `max_bytes`.
// false where it is no regular file, cannot be opened or read.
bool regular_file_contains(const std::string& path, std::string_view text, size_t max_bytes);

}  // namespace commdbg::host
