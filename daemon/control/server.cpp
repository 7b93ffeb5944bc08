// SPDX-License-Identifier: Apache-2.0
#include "server.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "limits.hpp"
#include "procfs.hpp"
#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg {

namespace {

using Clock = std::chrono::steady_clock;

// Who `pid` is to the kernel's ptrace rule; nullopt when there is no such
// process.  One that is there but cannot be read is nobody's but root's.
std::optional<ProcessCreds> creds_of(int pid) {
    auto c = read_creds(pid);
    if (c) return *c;
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
    ProcessCreds root_only;
    root_only.dumpable = false;
    return root_only;
}

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::open(const std::string& path, NodeCounter& counter,
                                                           size_t max_sessions) {
    using R = Result<std::unique_ptr<ControlServer>>;
    std::unique_ptr<ControlServer> s(new ControlServer(counter, max_sessions));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) return R::fail("commdbgd: --socket " + path + ": path too long");
    std::strcpy(addr.sun_path, path.c_str());
    s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->listen_fd_ < 0) return R::fail(std::string("commdbgd: socket: ") + std::strerror(errno));
    // A stale socket from a killed daemon would block the restart.
    if (connect(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
        return R::fail("commdbgd: " + path + ": another commdbgd is serving it — stop it or use --socket");
    ::unlink(path.c_str());
    if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
        return R::fail("commdbgd: bind " + path + ": " + std::strerror(errno) +
                       " — does the directory exist and is it writable?");
    // Everyone may connect; what they may do is decided per request from
    // their credentials (SO_PEERCRED).
    chmod(path.c_str(), 0666);
    if (listen(s->listen_fd_, 64) != 0) return R::fail(std::string("commdbgd: listen: ") + std::strerror(errno));
    if (pipe2(s->wake_, O_CLOEXEC) != 0) return R::fail(std::string("commdbgd: pipe: ") + std::strerror(errno));
    s->path_ = path;
    return R(std::move(s));
}

ControlServer::~ControlServer() {
    stop();
    if (listen_fd_ >= 0) close(listen_fd_);
    for (int fd : wake_)
        if (fd >= 0) close(fd);
    if (!path_.empty()) ::unlink(path_.c_str());
}

void ControlServer::start() { acceptor_ = std::thread([this] { accept_loop(); }); }

void ControlServer::stop() {
    if (stopping_.exchange(true)) return;
    // Sessions see stopping_ within their poll period and still send what
    // they saw (marked cut short); idle connections wake on the pipe.
    (void)!write(wake_[1], "x", 1);
    if (acceptor_.joinable()) acceptor_.join();
    // Bounded: rendering a full budget takes seconds, a send that cannot
    // proceed gives up after kSendStallMs.
    for (int i = 0; i < 2400 && connections_ > 0; ++i) usleep(25000);
}

void ControlServer::accept_loop() {
    while (!stopping_) {
        pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if (p[1].revents) return;
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            close(fd);
            continue;
        }
        PeerCred peer{static_cast<uint32_t>(cred.pid), cred.uid, cred.gid};
        if (std::string why = take_connection(peer.uid); !why.empty()) {
            // A fresh socket's buffer takes this line without blocking.
            send_all(fd, error_response(why), 0);
            close(fd);
            continue;
        }
        ++connections_;
        std::thread([this, fd, peer] {
            serve(fd, peer);
            close(fd);
            release_connection(peer.uid);
            --connections_;
        }).detach();
    }
}

std::string ControlServer::take_connection(uint32_t uid) {
    std::lock_guard lock(conn_mu_);
    if (uid != 0) {
        const size_t per_uid = kUnprivilegedLimits.connections_per_uid;
        auto mine = open_by_uid_.find(uid);
        if (mine != open_by_uid_.end() && mine->second >= per_uid)
            return "commdbgd: uid " + std::to_string(uid) + " already has " + std::to_string(per_uid) +
                   " connections open, the most one user other than root may hold — end idle clients of "
                   "this user (commdbg attach/status/counts, scripts holding the socket) and retry";
        if (open_unprivileged_ >= kMaxConnections - kRootConnections)
            return "commdbgd is busy (" + std::to_string(open_unprivileged_) +
                   " connections of users other than root open) — retry shortly; root may still connect";
    } else if (open_ >= kMaxConnections) {
        return "commdbgd is busy (" + std::to_string(open_) + " connections open) — retry shortly";
    }
    ++open_;
    if (uid != 0) {
        ++open_unprivileged_;
        ++open_by_uid_[uid];
    }
    return {};
}

void ControlServer::release_connection(uint32_t uid) {
    std::lock_guard lock(conn_mu_);
    --open_;
    if (uid != 0) {
        --open_unprivileged_;
        if (--open_by_uid_[uid] == 0) open_by_uid_.erase(uid);
    }
}

void ControlServer::serve(int fd, const PeerCred& peer) {
    LineReader reader;
    char buf[4096];
    auto deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
    while (!stopping_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            send_all(fd, error_response("request timed out: no complete request line within " +
                                        limits::format_seconds(kRequestDeadlineMs / 1000.0) +
                                        " of connecting or of the last reply — send one JSON object per line"),
                     kSendStallMs);
            return;
        }
        pollfd p[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
        int r = poll(p, 2, static_cast<int>(left));
        if (r < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if (p[1].revents) return;  // stopping
        if (r == 0) continue;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        for (const auto& line : reader.feed(std::string_view(buf, static_cast<size_t>(n)))) {
            auto req = parse_request(line);
            std::string reply;
            if (!req) {
                reply = error_response(req.error());
            } else {
                reply = handle(*req, peer, fd);
            }
            if (!reply.empty() && !send_all(fd, reply, kSendStallMs)) return;
            deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
        }
        if (reader.overflowed()) {
            send_all(fd, error_response("request too large (> " + std::to_string(kMaxRequestBytes) + " bytes)"),
                     kSendStallMs);
            return;
        }
    }
}

std::string ControlServer::handle(const Request& req, const PeerCred& peer, int fd) {
    Access a = authorize(req, peer, creds_of);
    if (a == Access::Deny) return error_response(deny_message(req, peer));
    std::optional<uint32_t> only_uid;
    if (a == Access::AllowOwnOnly) only_uid = peer.uid;
    // Counts of the processes the kernel would let the caller read, as of now
    // (a set-uid program it started is counted under its real uid).
    NodeCounter::ProcessFilter may_see;
    if (only_uid)
        may_see = [peer](uint32_t pid) {
            auto c = read_creds(static_cast<int>(pid));
            return c && may_read_process(*c, peer.uid, peer.gid);
        };
    if (req.op == "status") {
        nlohmann::json st = counter_.status();
        st["max_sessions"] = max_sessions_;
        st["unprivileged_limits"] = to_json(kUnprivilegedLimits);
        return ok_response(std::move(st));
    }
    if (req.op == "counts") return counts(req, may_see);
    if (req.op == "sessions") {
        nlohmann::json list = nlohmann::json::array();
        std::lock_guard lock(mu_);
        for (const auto& [id, s] : sessions_) {
            if (only_uid && s->owner_uid != *only_uid) continue;
            list.push_back({{"id", id},
                            {"pid", s->pid},
                            {"uid", s->owner_uid},
                            {"state", s->state},
                            {"duration_s", s->duration_s},
                            {"running_s", std::chrono::duration<double>(Clock::now() - s->started).count()}});
        }
        return ok_response({{"sessions", list}});
    }
    if (req.op == "detach") {
        std::lock_guard lock(mu_);
        auto it = sessions_.find(*req.id);
        if (it == sessions_.end() || (only_uid && it->second->owner_uid != *only_uid))
            return error_response("detach " + std::to_string(*req.id) + ": no such session — see `commdbg sessions`");
        it->second->stop = true;
        return ok_response({{"detached", *req.id}});
    }
    if (req.op == "attach") {
        std::string r = attach(req, peer, fd);
        // The session's model and outputs (hundreds of MB at a full budget)
        // are freed by now: hand the pages back to the node, not to the heap.
        malloc_trim(0);
        return r;
    }
    return error_response("unknown op \"" + req.op + "\"");
}

// counts of one pid that is not counted: a thread of a counted process gets
// its process's counts; anything else an error saying what it is.
std::string ControlServer::counts(const Request& req, const NodeCounter::ProcessFilter& may_see) {
    std::optional<uint32_t> pid;
    if (req.pid) pid = static_cast<uint32_t>(*req.pid);
    nlohmann::json reply = counter_.counts(pid, req.by_comm, may_see);
    if (!pid || !reply.value("processes", nlohmann::json::array()).empty()) return ok_response(std::move(reply));
    const std::string who = "counts --pid " + std::to_string(*pid);
    const std::string p = std::to_string(*pid);
    int tgid = tgid_of(static_cast<int>(*pid));
    if (tgid <= 0) return error_response(who + ": no such process");
    const std::string not_counted =
        " has made no call into a probed library (libnccl, ...) since commdbgd started, or runs outside its "
        "--scope-cgroup; `commdbg counts` lists the processes it counts";
    if (static_cast<uint32_t>(tgid) != *pid) {
        const std::string t = std::to_string(tgid);
        nlohmann::json of_process = counter_.counts(static_cast<uint32_t>(tgid), req.by_comm, may_see);
        if (of_process.value("processes", nlohmann::json::array()).empty())
            return error_response(who + ": " + p + " is a thread of pid " + t + ", which is not counted: it" +
                                  not_counted);
        of_process["note"] = p + " is a thread of pid " + t + ": these are the counts of pid " + t;
        return ok_response(std::move(of_process));
    }
    return error_response(who + ": pid " + p + " is not counted by commdbgd: it" + not_counted);
}

namespace {

SessionOptions session_options(const Request& req, const PeerCred& peer) {
    SessionOptions so;
    so.owner_uid = peer.uid;
    so.owner_gid = peer.gid;
    so.limits.max_records = req.max_records;
    so.limits.max_depth = req.max_depth;
    so.probes = req.probes;
    so.records = !req.counts_only;
    so.stack_args = req.stack_args;
    so.ringbuf_bytes = req.ringbuf_kb * 1024;
    so.py_stack = req.py_stack;
    so.py_depth = req.py_depth;
    return so;
}

}  // namespace

std::string ControlServer::take_session_slot(const std::shared_ptr<ActiveSession>& session, const std::string& who) {
    const uint32_t uid = session->owner_uid;
    const std::string what_to_do = " — wait for one to end or end one (`commdbg sessions`, `commdbg detach ID`)";
    std::lock_guard lock(mu_);
    size_t mine = 0;
    for (const auto& [id, s] : sessions_) mine += s->owner_uid == uid;
    // Another user sees and ends only its own sessions: say how many those are.
    const std::string yours =
        uid == 0 ? std::string() : " (" + std::to_string(mine) + " of them yours; root sees and ends all)";
    if (session_slots_ >= max_sessions_)
        return error_response(who + ": commdbgd already runs " + std::to_string(max_sessions_) +
                              " tracing sessions, its limit" + yours + what_to_do +
                              ", or trace with `commdbg attach --no-daemon`; commdbgd --max-sessions raises "
                              "the limit");
    if (uid != 0) {
        const size_t per_uid = kUnprivilegedLimits.sessions_per_uid;
        if (mine >= per_uid)
            return error_response(who + ": uid " + std::to_string(uid) + " already runs " + std::to_string(mine) +
                                  " tracing sessions in commdbgd, the most one user "
                                  "other than root may run" + what_to_do + ", or ask root");
        // The last slot stays free for root, who can then see and end the others.
        if (max_sessions_ > 1 && session_slots_ + 1 >= max_sessions_)
            return error_response(who + ": commdbgd runs " + std::to_string(session_slots_) + " of its " +
                                  std::to_string(max_sessions_) +
                                  " tracing sessions and keeps the last one for root" + yours + what_to_do +
                                  ", or ask root");
    }
    ++session_slots_;
    session->id = next_session_++;
    sessions_[session->id] = session;
    return {};
}

void ControlServer::release_session_slot(uint64_t id) {
    std::lock_guard lock(mu_);
    sessions_.erase(id);
    --session_slots_;
}

void ControlServer::set_state(ActiveSession& session, const char* state) {
    std::lock_guard lock(mu_);
    session.state = state;
}

std::string ControlServer::attach(const Request& req, const PeerCred& peer, int fd) {
    const std::string who = "attach " + std::to_string(*req.pid);
    // Users other than root may not size the root daemon's memory or hold it
    // for long (UnprivilegedLimits).
    if (auto problem = unprivileged_problem(req, peer.uid)) return error_response(who + ": " + *problem);
    auto session = std::make_shared<ActiveSession>();
    session->owner_uid = peer.uid;
    session->pid = *req.pid;
    session->duration_s = session_window_s(req, peer.uid);
    session->started = Clock::now();
    // A slot first: a session holds BPF maps, a ring buffer, its model (up to
    // its record budget) and then its outputs.  It is listed from now on.
    if (std::string refused = take_session_slot(session, who); !refused.empty()) return refused;
    struct SlotRelease {
        ControlServer* s;
        uint64_t id;
        ~SlotRelease() { s->release_session_slot(id); }
    } release{this, session->id};
    auto created = TraceSession::create(session_options(req, peer));
    if (!created) return error_response(who + ": " + created.error());
    // Children forked during the window are traced as with --no-daemon;
    // never stopped at a loader change (its parent may be a shell).
    if (auto r = created.value()->add_process(*req.pid, req.follow, false); !r)
        return error_response(who + ": " + r.error());
    set_state(*session, "tracing");
    trace_and_send(req, peer, fd, *session, std::move(created.value()));
    return "";  // all sent, or the client is gone
}

void ControlServer::trace_and_send(const Request& req, const PeerCred& peer, int fd, ActiveSession& session,
                                   std::unique_ptr<TraceSession> ts) {
    // First line: the session is running (the client may detach it by id)
    // and the most it runs.
    nlohmann::json first = {{"session", session.id},
                            {"state", "tracing"},
                            {"target", describe_pid(*req.pid)},
                            {"library_files", ts->attached_files().size()},
                            {"duration_s", session.duration_s}};
    if (session.duration_s != req.duration_s) first["window_limited_for_uid"] = peer.uid;
    if (!send_all(fd, ok_response(std::move(first)), kSendStallMs)) return;
    // A client that hangs up ends its session too.
    auto stop = [&] {
        if (session.stop || stopping_) return true;
        pollfd p{fd, POLLRDHUP, 0};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
    };
    const auto window_start = Clock::now();
    bool exited = run_attach_window(*ts, *req.pid, session.duration_s, stop);
    const double traced_s = std::chrono::duration<double>(Clock::now() - window_start).count();
    // Ended by the daemon's shutdown, not by the window, the process, a
    // detach or the client: the client must say so.
    const bool cut_short =
        stopping_ && !exited && !session.stop && (session.duration_s == 0 || traced_s < session.duration_s);
    set_state(session, "sending");
    SessionOutput out = render_session(
        *ts, req.noise_level, {.table_color = req.want_table_color, .json = req.want_json, .trace = req.want_trace});
    if (exited) out.messages.push_back("pid " + std::to_string(*req.pid) + " exited; report covers its life since attach");
    // The probes, maps and model go now: only the outputs are left to send.
    ts.reset();
    nlohmann::json last = {{"session", session.id}, {"state", "done"}, {"traced_s", traced_s}};
    if (cut_short) last["cut_short"] = "commdbgd is stopping";
    send_outputs(fd, std::move(last), out);
}

void ControlServer::send_outputs(int fd, nlohmann::json last, SessionOutput& out) {
    // The outputs follow the last line as raw bytes, in the order "payload"
    // lists them: as JSON strings they would be escaped into one more copy of
    // tens of MB each, and parsed back into another at the client.
    const auto parts = named_outputs(out);
    nlohmann::json payload = nlohmann::json::array();
    for (const auto& [name, text] : parts) payload.push_back({{"name", name}, {"bytes", text->size()}});
    last["messages"] = out.messages;
    last["payload"] = std::move(payload);
    // Each send gives up after kSendStallMs without progress: a client that
    // stopped reading ends its session here and frees the slot.
    if (!send_all(fd, ok_response(std::move(last)), kSendStallMs)) return;
    for (const auto& [name, text] : parts) {
        if (!send_all(fd, *text, kSendStallMs)) break;
        std::string().swap(*text);
    }
}

}  // namespace commdbg
