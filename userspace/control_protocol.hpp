// SPDX-License-Identifier: Apache-2.0
// The commdbgd control protocol, without sockets: line framing, request
// parsing and validation, authorization and response encoding. Every input a
// client can send is answered with a value (an error reply at worst), never a
// throw or a crash; tests/fuzz/fuzz_control.cpp holds it to that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "result.hpp"

namespace commdbg {

// One JSON object per '\n'-terminated line, requests and responses alike.
inline constexpr size_t kMaxRequestBytes = 65536;
// nlohmann's value tree is recursive; deeper requests are refused unparsed.
inline constexpr size_t kMaxNestingDepth = 32;

// Splits a byte stream into lines. A line longer than the limit (no '\n'
// within max bytes) puts the reader in a sticky error state: the daemon
// answers error_response(error()) and closes the connection.
class LineReader {
public:
    explicit LineReader(size_t max = kMaxRequestBytes);

    // Complete lines seen so far, without '\n' (a trailing '\r' is dropped,
    // blank lines are skipped). Returns nothing once overflowed().
    std::vector<std::string> feed(std::string_view bytes);
    bool overflowed() const { return overflowed_; }
    // "request too large (> 65536 bytes)" once overflowed(), else empty.
    std::string error() const;

private:
    size_t max_;
    std::string buffer_;
    size_t scanned_ = 0;  // bytes of buffer_ already known to hold no '\n'
    bool overflowed_ = false;
};

// A validated request. Fields an op does not take keep their defaults.
struct Request {
    std::string op;  // status | counts | attach | sessions | detach
    std::optional<int> pid;
    bool by_comm = false;
    double duration_s = 0;  // 0: until detached
    int noise_level = 1;
    size_t max_records = 200000;
    size_t max_depth = 128;
    std::vector<std::string> probes;
    bool counts_only = false;
    size_t ringbuf_kb = 8192;  // the session's kernel ring buffer
    // What the reply carries besides the plain table ("outputs": names from
    // "json", "trace", "table_color"; absent: all of them).
    bool want_json = true, want_trace = true, want_table_color = true;
    std::optional<uint64_t> id;
};

// Parses and validates one line. Errors name the field and the problem, e.g.
// `attach: field "pid" must be a positive integer`.
Result<Request> parse_request(std::string_view line);

struct PeerCred {
    uint32_t pid, uid, gid;
};

// AllowOwnOnly: allowed, but the daemon must restrict the answer (sessions,
// counts) or the target (detach) to things the caller's uid owns.
enum class Access { Allow, AllowOwnOnly, Deny };

// owner_uid(pid) gives the uid owning a process, nullopt when it does not
// exist (an attach on it is allowed so the session reports "no such process").
Access authorize(const Request& req, const PeerCred& peer,
                 const std::function<std::optional<uint32_t>(int pid)>& owner_uid);

// The reply text for a Deny from authorize().
std::string deny_message(const Request& req, const PeerCred& peer);

// {"ok":false,"error":"..."}\n
// Writes all of `s` to a stream socket (no SIGPIPE); false when the peer is gone.
bool send_all(int fd, std::string_view s);

std::string error_response(std::string_view message);
// body with "ok":true first, '\n'-terminated; a non-object body goes under "result".
std::string ok_response(nlohmann::json body);

}  // namespace commdbg
