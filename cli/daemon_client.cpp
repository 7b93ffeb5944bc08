// SPDX-License-Identifier: Apache-2.0
#include "daemon_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "control_protocol.hpp"

namespace commdbg::cli {

std::string socket_path(const std::string& flag) {
    if (!flag.empty()) return flag;
    if (const char* env = getenv("COMMDBG_SOCKET"); env && *env) return env;
    return "/run/commdbg/commdbgd.sock";
}

std::optional<DaemonClient> DaemonClient::connect(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) return std::nullopt;
    std::strcpy(addr.sun_path, path.c_str());
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::nullopt;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        return std::nullopt;
    }
    return DaemonClient(fd);
}

DaemonClient::~DaemonClient() {
    if (fd_ >= 0) close(fd_);
}

bool DaemonClient::send(const nlohmann::json& request) { return protocol::send_all(fd_, request.dump() + "\n"); }

namespace {

// Until `fd` has bytes to read (true) or *stop is set (false): polled every
// 100 ms, so a stop that came before the wait began is seen.
bool wait_readable(int fd, const std::atomic<int>& stop) {
    for (;;) {
        if (stop) return false;
        pollfd p{fd, POLLIN, 0};
        int n = poll(&p, 1, 100);
        if (n > 0) return true;
        if (n < 0 && errno != EINTR) return true;  // let recv say what is wrong
    }
}

}  // namespace

Result<nlohmann::json> DaemonClient::receive(const std::atomic<int>* stop) {
    using R = Result<nlohmann::json>;
    auto fail = [this](Failure why, std::string msg) {
        last_failure_ = why;
        return R::fail(std::move(msg));
    };
    last_failure_ = Failure::None;
    for (;;) {
        // Only bytes not looked at yet: a session's reply can be hundreds of
        // MB, read 64 KiB at a time.
        auto nl = buf_.find('\n', scanned_);
        scanned_ = nl == std::string::npos ? buf_.size() : 0;
        if (nl != std::string::npos) {
            std::string line = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object()) return fail(Failure::Malformed, "commdbgd sent a malformed reply");
            if (!j.value("ok", false))
                return fail(Failure::Refused, j.value("error", std::string("commdbgd refused the request")));
            return R(std::move(j));
        }
        if (stop && !wait_readable(fd_, *stop)) return fail(Failure::Interrupted, "interrupted");
        char tmp[65536];
        ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
        // The message stays "interrupted" for callers that still read the words.
        if (n < 0 && errno == EINTR) return fail(Failure::Interrupted, "interrupted");
        if (n <= 0) return fail(Failure::Closed, "commdbgd closed the connection");
        buf_.append(tmp, static_cast<size_t>(n));
    }
}

Result<std::string> DaemonClient::read_bytes(size_t n) {
    using R = Result<std::string>;
    std::string out;
    size_t from_buf = std::min(n, buf_.size());
    out.assign(buf_, 0, from_buf);
    buf_.erase(0, from_buf);
    scanned_ = 0;
    if (out.size() < n) out.resize(n);
    for (size_t have = from_buf; have < n;) {
        ssize_t got = recv(fd_, out.data() + have, n - have, 0);
        if (got < 0 && errno == EINTR) continue;  // the outputs are on their way: no detach now
        if (got <= 0) return R::fail("commdbgd closed the connection while sending the outputs");
        have += static_cast<size_t>(got);
    }
    return R(std::move(out));
}

Result<nlohmann::json> DaemonClient::call(const nlohmann::json& request) {
    // A daemon that refuses the connection (too many open) says why and
    // closes, maybe before our request is sent: its line is still there to read.
    bool sent = send(request);
    auto r = receive();
    if (!r && !sent && last_failure_ == Failure::Closed)
        return Result<nlohmann::json>::fail("commdbgd closed the connection before the request was sent");
    return r;
}

}  // namespace commdbg::cli
