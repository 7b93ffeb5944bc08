// SPDX-License-Identifier: Apache-2.0
// The CLI's side of the control socket.
#pragma once

#include <atomic>
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
    DaemonClient(DaemonClient&& o) noexcept
        : fd_(o.fd_), buf_(std::move(o.buf_)), scanned_(o.scanned_), last_failure_(o.last_failure_) {
        o.fd_ = -1;
    }
    ~DaemonClient();

    // Why the last receive() (or call()) failed, for callers that act on
    // the kind rather than on the words of the message.
    enum class Failure {
        None,
        Interrupted,  // a signal arrived first: nothing was read, call again
        Closed,       // the daemon closed the connection
        Malformed,    // a line that is not a JSON object
        Refused,      // an {"ok":false} reply: error() holds its message
    };

    bool send(const nlohmann::json& request);
    // Next response line; fails on a closed connection, an {"ok":false}
    // reply or a signal (EINTR): last_failure() says which.  With `stop`, it
    // also fails as Interrupted once *stop is set, however the signal that
    // set it fell (a signal caught just before the wait interrupts nothing).
    Result<nlohmann::json> receive(const std::atomic<int>* stop = nullptr);
    Failure last_failure() const { return last_failure_; }
    bool interrupted() const { return last_failure_ == Failure::Interrupted; }
    Result<nlohmann::json> call(const nlohmann::json& request);
    // Exactly n raw bytes that follow a reply line (an attach's outputs).
    Result<std::string> read_bytes(size_t n);
    int fd() const { return fd_; }

private:
    explicit DaemonClient(int fd) : fd_(fd) {}
    int fd_ = -1;
    std::string buf_;
    size_t scanned_ = 0;  // bytes of buf_ known to hold no '\n'
    Failure last_failure_ = Failure::None;
};

}  // namespace commdbg::cli
