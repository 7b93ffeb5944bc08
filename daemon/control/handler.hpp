// SPDX-License-Identifier: Apache-2.0
// What each control request means (userspace/protocol/control_protocol.hpp):
// who may make it, and its reply.  No socket code: the transport
// (server.hpp) frames the lines and sends the replies.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>

#include "attach.hpp"
#include "control_protocol.hpp"
#include "counter.hpp"

namespace commdbg::daemon {

class RequestHandler {
public:
    // stopping: the daemon is stopping (attach sessions end, sending what they saw).
    RequestHandler(NodeCounter& counter, size_t max_sessions, const std::atomic<bool>& stopping)
        : counter_(counter), sessions_(max_sessions, stopping) {}

    // The reply to one request line of `peer`; nullopt when the request sent
    // its replies itself (attach streams its session to `client`).
    std::optional<std::string> handle(std::string_view line, const protocol::PeerCred& peer, Connection& client);

private:
    std::optional<std::string> answer(const protocol::Request& req, const protocol::PeerCred& peer, Connection& client);
    std::string counts(const protocol::Request& req, const NodeCounter::ProcessFilter& may_see);

    NodeCounter& counter_;
    AttachSessions sessions_;
};

}  // namespace commdbg::daemon
