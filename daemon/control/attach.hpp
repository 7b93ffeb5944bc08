// SPDX-License-Identifier: Apache-2.0
// The attach sessions of the control socket: the slots they hold, the list
// `commdbg sessions` shows, and each session's run from its slot to its
// last output.  No socket code: a session reaches its client through a
// Connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "control_protocol.hpp"
#include "result.hpp"
#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg::daemon {

// The client a request came from, as request handling sees it.
class Connection {
public:
    virtual ~Connection() = default;
    // Sends all of `bytes`; false when the client is gone or stopped reading.
    virtual bool send(std::string_view bytes) = 0;
    // The client hung up (checked without waiting).
    virtual bool hung_up() = 0;
};

// A session from the moment it takes a slot until its outputs are sent: what
// holds a slot is always listed by `commdbg sessions`.
struct ActiveSession {
    uint64_t id = 0;
    uint32_t owner_uid = 0;
    int pid = 0;
    double duration_s = 0;  // the most it runs; 0: until detached or the process exits
    std::chrono::steady_clock::time_point started;
    const char* state = "starting";  // starting | tracing | sending (under AttachSessions::mu_)
    std::atomic<bool> stop{false};  // detached
};

class AttachSessions {
public:
    // max_sessions: tracing sessions run at once (each holds up to its
    // record budget and its outputs: ~0.3 GB at the default 200000 records).
    // stopping: the daemon is stopping; every session ends, sending what it saw.
    AttachSessions(size_t max_sessions, const std::atomic<bool>& stopping)
        : max_sessions_(max_sessions), stopping_(stopping) {}
    static constexpr size_t kDefaultMaxSessions = 4;
    size_t max_sessions() const { return max_sessions_; }

    // Traces req.pid and sends the session's lines and outputs itself; true
    // when all was sent or the client is gone.  Fails, before any line is
    // sent, with the message of the error reply to send instead.
    Result<bool> attach(const protocol::Request& req, const protocol::PeerCred& peer, Connection& client);
    // The sessions listed for `commdbg sessions`: all, or only_uid's.
    nlohmann::json list(std::optional<uint32_t> only_uid);
    // Asks session `id` to end; false when there is none (of only_uid's).
    bool detach(uint64_t id, std::optional<uint32_t> only_uid);

private:
    // attach's steps.  A slot: the session's id when taken (it is listed
    // from now on), else why not.
    Result<uint64_t> take_slot(const std::shared_ptr<ActiveSession>& session, const std::string& who);
    void release_slot(uint64_t id);
    void set_state(ActiveSession& session, const char* state);
    void trace_and_send(const protocol::Request& req, const protocol::PeerCred& peer, Connection& client,
                        ActiveSession& session, std::unique_ptr<session::TraceSession> ts);
    void send_outputs(Connection& client, nlohmann::json last, session::SessionOutput& out);

    const size_t max_sessions_;
    const std::atomic<bool>& stopping_;
    std::mutex mu_;
    std::map<uint64_t, std::shared_ptr<ActiveSession>> sessions_;
    uint64_t next_session_ = 1;
    size_t session_slots_ = 0;  // sessions starting or running (<= max_sessions_)
};

}  // namespace commdbg::daemon
