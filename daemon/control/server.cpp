// SPDX-License-Identifier: Apache-2.0
#include "server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "limits.hpp"

namespace commdbg::daemon {

namespace {

using Clock = std::chrono::steady_clock;

// A connection's socket as request handling sees it.  Every send gives up
// after kSendStallMs without progress (the client stopped reading).
class SocketConnection : public Connection {
public:
    explicit SocketConnection(int fd) : fd_(fd) {}
    bool send(std::string_view bytes) override { return protocol::send_all(fd_, bytes, ControlServer::kSendStallMs); }
    bool hung_up() override {
        pollfd p{fd_, POLLRDHUP, 0};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
    }

private:
    int fd_;
};

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
        protocol::PeerCred peer{static_cast<uint32_t>(cred.pid), cred.uid, cred.gid};
        if (auto taken = take_connection(peer.uid); !taken) {
            // A fresh socket's buffer takes this line without blocking.
            protocol::send_all(fd, protocol::error_response(taken.error()), 0);
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

Result<bool> ControlServer::take_connection(uint32_t uid) {
    using R = Result<bool>;
    std::lock_guard lock(conn_mu_);
    if (uid != 0) {
        const size_t per_uid = protocol::kUnprivilegedLimits.connections_per_uid;
        auto mine = open_by_uid_.find(uid);
        if (mine != open_by_uid_.end() && mine->second >= per_uid)
            return R::fail("commdbgd: uid " + std::to_string(uid) + " already has " + std::to_string(per_uid) +
                           " connections open, the most one user other than root may hold — end idle clients of "
                           "this user (commdbg attach/status/counts, scripts holding the socket) and retry");
        if (open_unprivileged_ >= kMaxConnections - kRootConnections)
            return R::fail("commdbgd is busy (" + std::to_string(open_unprivileged_) +
                           " connections of users other than root open) — retry shortly; root may still connect");
    } else if (open_ >= kMaxConnections) {
        return R::fail("commdbgd is busy (" + std::to_string(open_) + " connections open) — retry shortly");
    }
    ++open_;
    if (uid != 0) {
        ++open_unprivileged_;
        ++open_by_uid_[uid];
    }
    return true;
}

void ControlServer::release_connection(uint32_t uid) {
    std::lock_guard lock(conn_mu_);
    --open_;
    if (uid != 0) {
        --open_unprivileged_;
        if (--open_by_uid_[uid] == 0) open_by_uid_.erase(uid);
    }
}

void ControlServer::serve(int fd, const protocol::PeerCred& peer) {
    SocketConnection client(fd);
    protocol::LineReader reader;
    char buf[4096];
    auto deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
    while (!stopping_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            client.send(protocol::error_response("request timed out: no complete request line within " +
                                       limits::format_seconds(kRequestDeadlineMs / 1000.0) +
                                       " of connecting or of the last reply — send one JSON object per line"));
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
            auto reply = handler_.handle(line, peer, client);
            if (reply && !client.send(*reply)) return;
            deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
        }
        if (reader.overflowed()) {
            client.send(protocol::error_response("request too large (> " + std::to_string(protocol::kMaxRequestBytes) +
                                                 " bytes)"));
            return;
        }
    }
}

}  // namespace commdbg::daemon
