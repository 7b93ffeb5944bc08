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
#include "counter.hpp"
#include "result.hpp"
#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg {

// A session from the moment it takes a slot until its outputs are sent: what
// holds a slot is always listed by `commdbg sessions`.
struct ActiveSession {
    uint64_t id = 0;
    uint32_t owner_uid = 0;
    int pid = 0;
    double duration_s = 0;  // the most it runs; 0: until detached or the process exits
    std::chrono::steady_clock::time_point started;
    const char* state = "starting";  // starting | tracing | sending (under ControlServer::mu_)
    std::atomic<bool> stop{false};  // detached
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
    ControlServer(NodeCounter& c, size_t max_sessions) : counter_(c), max_sessions_(max_sessions) {}
    void accept_loop();
    // Why a connection of `uid` is refused now, or "" (and it is counted).
    std::string take_connection(uint32_t uid);
    void release_connection(uint32_t uid);
    void serve(int fd, const PeerCred& peer);
    std::string counts(const Request& req, const NodeCounter::ProcessFilter& may_see);
    std::string handle(const Request& req, const PeerCred& peer, int fd);
    // Sends the session's lines and outputs itself: returns an error reply
    // to send, or "" when everything was sent.
    std::string attach(const Request& req, const PeerCred& peer, int fd);
    // attach's steps.  A slot: "" when taken (the session is listed from
    // now on), else the error reply that says why not.
    std::string take_session_slot(const std::shared_ptr<ActiveSession>& session, const std::string& who);
    void release_session_slot(uint64_t id);
    void set_state(ActiveSession& session, const char* state);
    void trace_and_send(const Request& req, const PeerCred& peer, int fd, ActiveSession& session,
                        std::unique_ptr<TraceSession> ts);
    void send_outputs(int fd, nlohmann::json last, SessionOutput& out);

    NodeCounter& counter_;
    size_t max_sessions_;
    std::string path_;
    int listen_fd_ = -1;
    int wake_[2] = {-1, -1};
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
    std::atomic<int> connections_{0};  // serving threads still running
    std::mutex conn_mu_;
    size_t open_ = 0, open_unprivileged_ = 0;
    std::map<uint32_t, size_t> open_by_uid_;

    std::mutex mu_;
    std::map<uint64_t, std::shared_ptr<ActiveSession>> sessions_;
    uint64_t next_session_ = 1;
    size_t session_slots_ = 0;  // sessions starting or running (<= max_sessions_)
};

}  // namespace commdbg
