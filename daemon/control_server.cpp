// SPDX-License-Identifier: Apache-2.0
#include "control_server.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "session_output.hpp"
#include "trace_session.hpp"

namespace commdbg {

namespace {

constexpr int kMaxConnections = 64;
constexpr int kIdleTimeoutMs = 30000;  // a half-sent request does not hold a thread forever

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
    {
        std::lock_guard lock(mu_);
        for (auto& [id, s] : sessions_) s->stop = true;
    }
    (void)!write(wake_[1], "x", 1);
    if (acceptor_.joinable()) acceptor_.join();
    // Connection threads see stopping_ within their poll period.
    for (int i = 0; i < 200 && connections_ > 0; ++i) usleep(25000);
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
        if (connections_ >= kMaxConnections) {
            send_all(fd, error_response("commdbgd is busy (" + std::to_string(kMaxConnections) +
                                        " connections) — retry shortly"));
            close(fd);
            continue;
        }
        ++connections_;
        std::thread([this, fd] {
            serve(fd);
            close(fd);
            --connections_;
        }).detach();
    }
}

void ControlServer::serve(int fd) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
    PeerCred peer{static_cast<uint32_t>(cred.pid), cred.uid, cred.gid};
    LineReader reader;
    char buf[4096];
    while (!stopping_) {
        pollfd p{fd, POLLIN, 0};
        int r = poll(&p, 1, kIdleTimeoutMs);
        if (r == 0) {
            send_all(fd, error_response("request timed out (no complete line within 30 s)"));
            return;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            return;
        }
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) return;
        for (const auto& line : reader.feed(std::string_view(buf, static_cast<size_t>(n)))) {
            auto req = parse_request(line);
            std::string reply;
            if (!req) {
                reply = error_response(req.error());
            } else {
                reply = handle(*req, peer, fd);
            }
            if (!reply.empty() && !send_all(fd, reply)) return;
        }
        if (reader.overflowed()) {
            send_all(fd, error_response("request too large (> " + std::to_string(kMaxRequestBytes) + " bytes)"));
            return;
        }
    }
}

std::string ControlServer::handle(const Request& req, const PeerCred& peer, int fd) {
    Access a = authorize(req, peer, [this](int pid) { return counter_.owner_of(static_cast<uint32_t>(pid)); });
    if (a == Access::Deny) return error_response(deny_message(req, peer));
    std::optional<uint32_t> only_uid;
    if (a == Access::AllowOwnOnly) only_uid = peer.uid;
    if (req.op == "status") return ok_response(counter_.status());
    if (req.op == "counts") {
        std::optional<uint32_t> pid;
        if (req.pid) pid = static_cast<uint32_t>(*req.pid);
        return ok_response(counter_.counts(pid, req.by_comm, only_uid));
    }
    if (req.op == "sessions") {
        nlohmann::json list = nlohmann::json::array();
        std::lock_guard lock(mu_);
        for (const auto& [id, s] : sessions_) {
            if (only_uid && s->owner_uid != *only_uid) continue;
            list.push_back({{"id", id},
                            {"pid", s->pid},
                            {"uid", s->owner_uid},
                            {"duration_s", s->duration_s},
                            {"running_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - s->started).count()}});
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

std::string ControlServer::attach(const Request& req, const PeerCred& peer, int fd) {
    SessionOptions so;
    so.limits.max_records = req.max_records;
    so.limits.max_depth = req.max_depth;
    so.probes = req.probes;
    so.records = !req.counts_only;
    so.ringbuf_bytes = req.ringbuf_kb * 1024;
    std::string who = "attach " + std::to_string(*req.pid);
    // A slot first: a session holds BPF maps, a ring buffer, its model (up to
    // its record budget) and then its outputs.
    {
        std::lock_guard lock(mu_);
        if (session_slots_ >= max_sessions_)
            return error_response(who + ": commdbgd already runs " + std::to_string(max_sessions_) +
                                  " tracing sessions, its limit — wait for one to end or end one "
                                  "(`commdbg sessions`, `commdbg detach ID`), or trace with `commdbg attach "
                                  "--no-daemon`; commdbgd --max-sessions raises the limit");
        ++session_slots_;
    }
    struct SlotRelease {
        ControlServer* s;
        ~SlotRelease() {
            std::lock_guard lock(s->mu_);
            --s->session_slots_;
        }
    } release{this};
    auto created = TraceSession::create(so);
    if (!created) return error_response(who + ": " + created.error());
    TraceSession& ts = *created.value();
    if (auto r = ts.add_process(*req.pid, false, false); !r) return error_response(who + ": " + r.error());
    auto session = std::make_shared<ActiveSession>();
    session->owner_uid = peer.uid;
    session->pid = *req.pid;
    session->duration_s = req.duration_s;
    session->started = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(mu_);
        session->id = next_session_++;
        sessions_[session->id] = session;
    }
    // First line: the session is running (the client may detach it by id).
    send_all(fd, ok_response({{"session", session->id}, {"state", "tracing"}, {"target", describe_pid(*req.pid)},
                              {"library_files", ts.attached_files().size()}}));
    // A client that hangs up ends its session too.
    auto stop = [&] {
        if (session->stop || stopping_) return true;
        pollfd p{fd, POLLRDHUP, 0};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
    };
    bool exited = run_attach_window(ts, *req.pid, req.duration_s, stop);
    SessionOutput out = render_session(
        ts, req.noise_level, {.table_color = req.want_table_color, .json = req.want_json, .trace = req.want_trace});
    {
        std::lock_guard lock(mu_);
        sessions_.erase(session->id);
    }
    if (exited) out.messages.push_back("pid " + std::to_string(*req.pid) + " exited; report covers its life since attach");
    // The outputs follow the last line as raw bytes, in the order "payload"
    // lists them: as JSON strings they would be escaped into one more copy of
    // tens of MB each, and parsed back into another at the client.
    const auto parts = named_outputs(out);
    nlohmann::json payload = nlohmann::json::array();
    for (const auto& [name, text] : parts) payload.push_back({{"name", name}, {"bytes", text->size()}});
    if (!send_all(fd, ok_response({{"session", session->id},
                                   {"state", "done"},
                                   {"messages", out.messages},
                                   {"payload", std::move(payload)}})))
        return "";
    for (const auto& [name, text] : parts) {
        if (!send_all(fd, *text)) break;
        std::string().swap(*text);
    }
    return "";  // all sent, or the client is gone
}

}  // namespace commdbg
