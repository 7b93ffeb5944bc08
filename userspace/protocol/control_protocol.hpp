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

#include "limits.hpp"
#include "procfs.hpp"
#include "py_config.hpp"
#include "result.hpp"

namespace commdbg::protocol {

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
    bool flight = false;  // counts, with by_comm: each rank's last collectives (the flight recorder)
    // 0: until detached or the process exits; limits::duration_problem() holds.
    double duration_s = 0;
    int noise_level = 1;
    size_t max_records = limits::kDefaultMaxRecords;  // <= limits::kMaxRecordsCeiling
    size_t max_depth = limits::kDefaultMaxDepth;      // <= limits::kMaxDepthCeiling
    std::vector<std::string> probes;
    bool counts_only = false;
    bool stack_args = false;  // records read stack-passed arguments only they show
    bool follow = true;  // trace the children the target forks (false: note each fork)
    size_t ringbuf_kb = limits::kDefaultRingbufKb;  // the session's kernel ring buffer
    python::PyStackMode py_stack = python::PyStackMode::Default;
    uint32_t py_depth = CD_DEFAULT_PY_FRAMES;       // 1..CD_MAX_PY_FRAMES
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

// creds_of(pid) gives a process's ids and dumpability (read_creds), nullopt
// when it does not exist (an attach on it is allowed so the session reports
// "no such process").  A user other than root gets a process only where the
// kernel would let it read that process itself (may_read_process): not
// another user's, not a set-uid/set-gid program it started, not one that
// made itself non-dumpable.
Access authorize(const Request& req, const PeerCred& peer,
                 const std::function<std::optional<host::ProcessCreds>(int pid)>& creds_of);

// The reply text for a Deny from authorize().
std::string deny_message(const Request& req, const PeerCred& peer);

// What a user other than root may ask of the root daemon, per uid: the
// sessions, kernel memory and model memory it may hold and for how long.
// Root is held only to the ceilings of limits.hpp.  `commdbg status` and
// docs/daemon.md ("Tracing sessions", "Control socket") state these numbers.
struct UnprivilegedLimits {
    size_t sessions_per_uid = 2;
    size_t ringbuf_kb = 65536;  // 64 MiB of kernel ring buffer per session
    size_t max_records = limits::kDefaultMaxRecords;
    double duration_s = 3600;  // longest window; an attach without -d ends there too
    size_t connections_per_uid = 8;  // open control connections
    // Spec files (--probes PATH) would be read by the daemon as root: a way
    // to probe for, and read parts of, files the user cannot read.  Built-in
    // specs only.
    bool probe_files = false;
};
inline constexpr UnprivilegedLimits kUnprivilegedLimits{};

nlohmann::json to_json(const UnprivilegedLimits& l);

// Why an attach asks for more than `uid` may have, in the CLI's option names
// ("--ringbuf-kb 1048576 is over the 65536 KiB allowed to uid 65534 — ..."),
// or nothing. Root (uid 0) is never refused here.
std::optional<std::string> unprivileged_problem(const Request& req, uint32_t uid,
                                                const UnprivilegedLimits& l = kUnprivilegedLimits);

// How long the session of an attach runs at most: its duration_s, or for a
// user other than root without one, the longest window it is allowed.  0: no limit.
double session_window_s(const Request& req, uint32_t uid, const UnprivilegedLimits& l = kUnprivilegedLimits);

// Writes all of `s` to a stream socket (no SIGPIPE); false when the peer is
// gone, or when no byte could be sent for stall_ms (>= 0: a peer that
// stopped reading).
bool send_all(int fd, std::string_view s, int stall_ms = -1);

// {"ok":false,"error":"..."}\n

std::string error_response(std::string_view message);
// body with "ok":true first, '\n'-terminated; a non-object body goes under "result".
std::string ok_response(nlohmann::json body);

}  // namespace commdbg::protocol
