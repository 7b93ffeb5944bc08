// SPDX-License-Identifier: Apache-2.0
#include "handler.hpp"

#include <malloc.h>
#include <sys/stat.h>

#include "procfs.hpp"

namespace commdbg::daemon {

namespace {

// Who `pid` is to the kernel's ptrace rule; nullopt when there is no such
// process.  One that is there but cannot be read is nobody's but root's.
std::optional<host::ProcessCreds> creds_of(int pid) {
    auto c = host::read_creds(pid);
    if (c) return *c;
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
    host::ProcessCreds root_only;
    root_only.dumpable = false;
    return root_only;
}

}  // namespace

std::optional<std::string> RequestHandler::handle(std::string_view line, const protocol::PeerCred& peer,
                                                  Connection& client) {
    auto req = protocol::parse_request(line);
    if (!req) return protocol::error_response(req.error());
    return answer(*req, peer, client);
}

std::optional<std::string> RequestHandler::answer(const protocol::Request& req, const protocol::PeerCred& peer,
                                                  Connection& client) {
    protocol::Access a = authorize(req, peer, creds_of);
    if (a == protocol::Access::Deny) return protocol::error_response(deny_message(req, peer));
    std::optional<uint32_t> only_uid;
    if (a == protocol::Access::AllowOwnOnly) only_uid = peer.uid;
    // Counts of the processes the kernel would let the caller read, as of now
    // (a set-uid program it started is counted under its real uid).
    NodeCounter::ProcessFilter may_see;
    if (only_uid)
        may_see = [peer](uint32_t pid) {
            auto c = host::read_creds(static_cast<int>(pid));
            return c && may_read_process(*c, peer.uid, peer.gid);
        };
    if (req.op == "status") {
        nlohmann::json st = counter_.status();
        st["max_sessions"] = sessions_.max_sessions();
        st["unprivileged_limits"] = to_json(protocol::kUnprivilegedLimits);
        return protocol::ok_response(std::move(st));
    }
    if (req.op == "counts") return counts(req, may_see);
    if (req.op == "sessions") return protocol::ok_response({{"sessions", sessions_.list(only_uid)}});
    if (req.op == "detach") {
        if (!sessions_.detach(*req.id, only_uid))
            return protocol::error_response("detach " + std::to_string(*req.id) +
                                            ": no such session — see `commdbg sessions`");
        return protocol::ok_response({{"detached", *req.id}});
    }
    if (req.op == "attach") {
        auto sent = sessions_.attach(req, peer, client);
        // The session's model and outputs (hundreds of MB at a full budget)
        // are freed by now: hand the pages back to the node, not to the heap.
        malloc_trim(0);
        if (!sent) return protocol::error_response(sent.error());
        return std::nullopt;
    }
    return protocol::error_response("unknown op \"" + req.op + "\"");
}

// counts of one pid that is not counted: a thread of a counted process gets
// its process's counts; anything else an error saying what it is.
std::string RequestHandler::counts(const protocol::Request& req, const NodeCounter::ProcessFilter& may_see) {
    std::optional<uint32_t> pid;
    if (req.pid) pid = static_cast<uint32_t>(*req.pid);
    nlohmann::json reply = counter_.counts(pid, req.by_comm, may_see, req.flight);
    if (!pid || !reply.value("processes", nlohmann::json::array()).empty())
        return protocol::ok_response(std::move(reply));
    const std::string who = "counts --pid " + std::to_string(*pid);
    const std::string p = std::to_string(*pid);
    auto task = host::read_tgid(static_cast<int>(*pid));
    const int tgid = task ? *task : 0;
    if (tgid <= 0) return protocol::error_response(who + ": no such process");
    const std::string not_counted =
        " has made no call into a probed library (libnccl, ...) since commdbgd started, or runs outside its "
        "--scope-cgroup; `commdbg counts` lists the processes it counts";
    if (static_cast<uint32_t>(tgid) != *pid) {
        const std::string t = std::to_string(tgid);
        nlohmann::json of_process = counter_.counts(static_cast<uint32_t>(tgid), req.by_comm, may_see, req.flight);
        if (of_process.value("processes", nlohmann::json::array()).empty())
            return protocol::error_response(who + ": " + p + " is a thread of pid " + t + ", which is not counted: it" +
                                  not_counted);
        of_process["note"] = p + " is a thread of pid " + t + ": these are the counts of pid " + t;
        return protocol::ok_response(std::move(of_process));
    }
    return protocol::error_response(who + ": pid " + p + " is not counted by commdbgd: it" + not_counted);
}

}  // namespace commdbg::daemon
