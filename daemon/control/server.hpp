// SPDX-License-Identifier: Apache-2.0
// The control socket's transport: a Unix stream socket speaking one JSON
// object per line (userspace/protocol/control_protocol.hpp).  It accepts
// connections (bounded per user), reads the peer's credentials, frames the
// lines and writes the replies; what a request means is handler.hpp's.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "control_protocol.hpp"
#include "counter.hpp"
#include "handler.hpp"
#include "result.hpp"

namespace commdbg::daemon {

class ControlServer {
public:
    // max_sessions: tracing sessions run at once (AttachSessions).
    static Result<std::unique_ptr<ControlServer>> open(const std::string& path, NodeCounter& counter,
                                                       size_t max_sessions = kDefaultMaxSessions);
    static constexpr size_t kDefaultMaxSessions = AttachSessions::kDefaultMaxSessions;
    ~ControlServer();

    // Accepts and serves until stop(); each connection gets a thread (bounded).
    void start();
    // Ends every session (each still sends what it saw, marked cut short) and
    // waits for the connections to finish.
    void stop();

    // Open connections: at most kMaxConnections, of which users other than
    // root hold at most kMaxConnections - kRootConnections, each uid at most
    // UnprivilegedLimits::connections_per_uid.
    static constexpr size_t kMaxConnections = 64;
    static constexpr size_t kRootConnections = 8;
    // A whole request line must arrive within this much of connecting or of
    // the previous reply (a deadline, not an idle timer a trickle can renew).
    static constexpr int kRequestDeadlineMs = 5000;
    // A reply of which no byte can be sent for this long (the client stopped
    // reading) ends the connection and the session it carries.
    static constexpr int kSendStallMs = 10000;

private:
    ControlServer(NodeCounter& c, size_t max_sessions) : handler_(c, max_sessions, stopping_) {}
    void accept_loop();
    // Counts a connection of `uid`, or fails saying why it is refused now.
    Result<bool> take_connection(uint32_t uid);
    void release_connection(uint32_t uid);
    void serve(int fd, const protocol::PeerCred& peer);

    std::string path_;
    int listen_fd_ = -1;
    int wake_[2] = {-1, -1};
    std::atomic<bool> stopping_{false};
    RequestHandler handler_;
    std::thread acceptor_;
    std::atomic<int> connections_{0};  // serving threads still running
    std::mutex conn_mu_;
    size_t open_ = 0, open_unprivileged_ = 0;
    std::map<uint32_t, size_t> open_by_uid_;
};

}  // namespace commdbg::daemon
