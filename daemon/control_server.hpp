// SPDX-License-Identifier: Apache-2.0
// The control socket: a Unix stream socket speaking one JSON object per line
// (userspace/control_protocol.hpp), authorised by the peer's credentials.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control_protocol.hpp"
#include "node_counter.hpp"
#include "result.hpp"

namespace commdbg {

struct ActiveSession {
    uint64_t id = 0;
    uint32_t owner_uid = 0;
    int pid = 0;
    double duration_s = 0;
    std::chrono::steady_clock::time_point started;
    std::atomic<bool> stop{false};
};

class ControlServer {
public:
    // max_sessions: tracing sessions run at once (each holds up to its
    // record budget and its outputs: ~0.3 GB at the default 200000 records).
    static Result<std::unique_ptr<ControlServer>> open(const std::string& path, NodeCounter& counter,
                                                       size_t max_sessions = kDefaultMaxSessions);
    static constexpr size_t kDefaultMaxSessions = 4;
    ~ControlServer();

    // Accepts and serves until stop(); each connection gets a thread (bounded).
    void start();
    void stop();

private:
    ControlServer(NodeCounter& c, size_t max_sessions) : counter_(c), max_sessions_(max_sessions) {}
    void accept_loop();
    void serve(int fd);
    std::string handle(const Request& req, const PeerCred& peer, int fd);
    // Sends the session's lines and outputs itself: returns an error reply
    // to send, or "" when everything was sent.
    std::string attach(const Request& req, const PeerCred& peer, int fd);

    NodeCounter& counter_;
    size_t max_sessions_;
    std::string path_;
    int listen_fd_ = -1;
    int wake_[2] = {-1, -1};
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
    std::atomic<int> connections_{0};

    std::mutex mu_;
    std::map<uint64_t, std::shared_ptr<ActiveSession>> sessions_;
    uint64_t next_session_ = 1;
    size_t session_slots_ = 0;  // sessions starting or running (<= max_sessions_)
};

}  // namespace commdbg
