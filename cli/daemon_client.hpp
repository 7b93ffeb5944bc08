// SPDX-License-Identifier: Apache-2.0
// The CLI's side of the control socket.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "result.hpp"

namespace commdbg::cli {

// --socket, else $COMMDBG_SOCKET, else the default path.
std::string socket_path(const std::string& flag);

class DaemonClient {
public:
    // nullopt when nothing answers there (no daemon): callers may run embedded.
    static std::optional<DaemonClient> connect(const std::string& path);
    DaemonClient(DaemonClient&& o) noexcept : fd_(o.fd_), buf_(std::move(o.buf_)), scanned_(o.scanned_) { o.fd_ = -1; }
    ~DaemonClient();

    bool send(const nlohmann::json& request);
    // Next response line; fails on a closed connection or an {"ok":false} reply.
    Result<nlohmann::json> receive();
    Result<nlohmann::json> call(const nlohmann::json& request);
    // Exactly n raw bytes that follow a reply line (an attach's outputs).
    Result<std::string> read_bytes(size_t n);
    int fd() const { return fd_; }

private:
    explicit DaemonClient(int fd) : fd_(fd) {}
    int fd_ = -1;
    std::string buf_;
    size_t scanned_ = 0;  // bytes of buf_ known to hold no '\n'
};

}  // namespace commdbg::cli
