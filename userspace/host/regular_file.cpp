// SPDX-License-Identifier: Apache-2.0
#include "regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace commdbg::host {

bool regular_file_contains(const std::string& path, std::string_view text, size_t max_bytes) {
    // O_NONBLOCK: a FIFO put where the file was expected does not hold the open.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat st {};
    std::string data;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        data.resize(std::min(max_bytes, static_cast<size_t>(st.st_size)));
        size_t got = 0;
        while (got < data.size()) {
            const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
            if (n <= 0) break;
            got += static_cast<size_t>(n);
        }
        data.resize(got);
    }
    ::close(fd);
    return !text.empty() && data.find(text) != std::string::npos;
}

}  // namespace commdbg::host
