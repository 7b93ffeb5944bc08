// SPDX-License-Identifier: Apache-2.0
#include "control_protocol.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include <climits>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace commdbg::protocol {

using json = nlohmann::json;

// ---- framing -----------------------------------------------------------------

LineReader::LineReader(size_t max) : max_(max == 0 ? 1 : max) {}

std::string LineReader::error() const {
    if (!overflowed_) return {};
    return "request too large (> " + std::to_string(max_) + " bytes)";
}

std::vector<std::string> LineReader::feed(std::string_view bytes) {
    std::vector<std::string> lines;
    if (overflowed_) return lines;
    buffer_.append(bytes.data(), bytes.size());
    size_t start = 0;
    for (;;) {
        size_t nl = buffer_.find('\n', start + scanned_);
        if (nl == std::string::npos) break;
        size_t len = nl - start;
        if (len > max_) break;  // complete but over-long: caught below
        if (len > 0 && buffer_[nl - 1] == '\r') --len;
        if (len > 0) lines.emplace_back(buffer_, start, len);
        start = nl + 1;
        scanned_ = 0;
    }
    buffer_.erase(0, start);
    // A line is over-long once max bytes have arrived without its '\n'.
    size_t nl = buffer_.find('\n', scanned_);
    if ((nl == std::string::npos ? buffer_.size() : nl) > max_) {
        overflowed_ = true;
        buffer_.clear();
        buffer_.shrink_to_fit();
        scanned_ = 0;
        return lines;
    }
    scanned_ = buffer_.size();
    return lines;
}

// ---- parsing -----------------------------------------------------------------

namespace {

constexpr const char* kOps = "status, counts, attach, sessions, detach";

// Deepest [ / { nesting outside strings; stops counting past the limit.
size_t nesting_depth(std::string_view s) {
    size_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (char c : s) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        switch (c) {
        case '"': in_string = true; break;
        case '[':
        case '{':
            if (++depth > deepest) deepest = depth;
            if (deepest > kMaxNestingDepth) return deepest;
            break;
        case ']':
        case '}':
            if (depth > 0) --depth;
            break;
        default: break;
        }
    }
    return deepest;
}

std::string in_quotes(std::string_view s) { return "\"" + bounded(s) + "\""; }

std::string field_error(const std::string& op, const std::string& field, const char* problem) {
    return op + ": field \"" + field + "\" " + problem;
}

// Integer in [lo, hi]; nlohmann keeps integers as int64 or uint64, floats apart.
std::optional<uint64_t> get_uint(const json& v, uint64_t lo, uint64_t hi) {
    uint64_t n;
    if (v.is_number_unsigned()) n = v.get<uint64_t>();
    else if (v.is_number_integer()) {
        int64_t i = v.get<int64_t>();
        if (i < 0) return std::nullopt;
        n = static_cast<uint64_t>(i);
    } else {
        return std::nullopt;
    }
    if (n < lo || n > hi) return std::nullopt;
    return n;
}

struct OpFields {
    const char* op;
    std::vector<const char*> fields;
};

const OpFields kOpFields[] = {
    {"status", {}},
    {"counts", {"pid", "by_comm", "flight"}},
    {"attach", {"pid", "duration_s", "noise_level", "max_records", "max_depth", "probes",
                "counts_only", "stack_args", "ringbuf_kb", "outputs", "follow", "py_stack", "py_depth"}},
    {"sessions", {}},
    {"detach", {"id"}},
};

std::optional<std::string> fill_field(Request& r, const std::string& key, const json& v) {
    const std::string& op = r.op;
    if (key == "pid") {
        auto n = get_uint(v, 1, INT_MAX);
        if (!n) return field_error(op, key, "must be a positive integer");
        r.pid = static_cast<int>(*n);
    } else if (key == "by_comm" || key == "flight" || key == "counts_only" || key == "follow" || key == "stack_args") {
        if (!v.is_boolean()) return field_error(op, key, "must be true or false");
        bool& field = key == "by_comm"       ? r.by_comm
                      : key == "flight"      ? r.flight
                      : key == "follow"      ? r.follow
                      : key == "stack_args"  ? r.stack_args
                                             : r.counts_only;
        field = v.get<bool>();
    } else if (key == "duration_s") {
        if (!v.is_number()) return field_error(op, key, "must be a number of seconds");
        double d = v.get<double>();
        if (auto problem = limits::duration_problem(d)) return field_error(op, key, problem->c_str());
        r.duration_s = d == 0 ? 0 : d;  // -0.0 is 0
    } else if (key == "noise_level") {
        auto n = get_uint(v, 0, 3);
        if (!n) return field_error(op, key, "must be an integer from 0 to 3");
        r.noise_level = static_cast<int>(*n);
    } else if (key == "max_records" || key == "max_depth") {
        const bool records = key == "max_records";
        const size_t hi = records ? limits::kMaxRecordsCeiling : limits::kMaxDepthCeiling;
        auto n = get_uint(v, 1, hi);
        if (!n) return field_error(op, key, ("must be an integer from 1 to " + std::to_string(hi)).c_str());
        (records ? r.max_records : r.max_depth) = static_cast<size_t>(*n);
    } else if (key == "py_stack") {
        const char* what = "must be \"off\", \"default\" or \"ops\"";
        if (!v.is_string()) return field_error(op, key, what);
        auto mode = python::parse_py_stack_mode(v.get<std::string>());
        if (!mode) return field_error(op, key, what);
        r.py_stack = *mode;
    } else if (key == "py_depth") {
        auto n = get_uint(v, 1, CD_MAX_PY_FRAMES);
        if (!n) return field_error(op, key, ("must be an integer from 1 to " + std::to_string(CD_MAX_PY_FRAMES)).c_str());
        r.py_depth = static_cast<uint32_t>(*n);
    } else if (key == "ringbuf_kb") {
        auto n = get_uint(v, limits::kMinRingbufKb, limits::kMaxRingbufKb);
        if (!n)
            return field_error(op, key,
                               ("must be an integer from " + std::to_string(limits::kMinRingbufKb) + " to " +
                                std::to_string(limits::kMaxRingbufKb) + " (KiB)")
                                   .c_str());
        r.ringbuf_kb = static_cast<size_t>(*n);
    } else if (key == "outputs") {
        const char* what = "must be an array of \"json\", \"trace\", \"table_color\"";
        if (!v.is_array()) return field_error(op, key, what);
        r.want_json = r.want_trace = r.want_table_color = false;
        for (const auto& o : v) {
            if (o == "json") r.want_json = true;
            else if (o == "trace") r.want_trace = true;
            else if (o == "table_color") r.want_table_color = true;
            else return field_error(op, key, what);
        }
    } else if (key == "probes") {
        if (!v.is_array()) return field_error(op, key, "must be an array of probe names");
        r.probes.clear();
        for (const auto& p : v) {
            if (!p.is_string() || p.get_ref<const std::string&>().empty())
                return field_error(op, key, "must be an array of non-empty strings");
            r.probes.push_back(p.get<std::string>());
        }
    } else if (key == "id") {
        auto n = get_uint(v, 1, UINT64_MAX);
        if (!n) return field_error(op, key, "must be a session id (an integer >= 1)");
        r.id = *n;
    }
    return std::nullopt;
}

Result<Request> validate(const json& j) {
    using R = Result<Request>;
    if (!j.is_object()) return R::fail("request must be a JSON object");
    auto op_it = j.find("op");
    if (op_it == j.end()) return R::fail(std::string("request has no \"op\" field (one of ") + kOps + ")");
    if (!op_it->is_string()) return R::fail(std::string("field \"op\" must be a string (one of ") + kOps + ")");
    Request r;
    r.op = op_it->get<std::string>();
    const OpFields* spec = nullptr;
    for (const auto& s : kOpFields)
        if (r.op == s.op) spec = &s;
    if (!spec) return R::fail("unknown op " + in_quotes(r.op) + " (one of " + kOps + ")");

    for (const auto& [key, v] : j.items()) {
        if (key == "op") continue;
        bool known = false;
        for (const char* f : spec->fields) known = known || key == f;
        if (!known) {
            std::string allowed;
            for (const char* f : spec->fields) allowed += (allowed.empty() ? "" : ", ") + std::string(f);
            return R::fail(r.op + ": unknown field " + in_quotes(key) +
                           (allowed.empty() ? " (it takes no fields)" : " (allowed: " + allowed + ")"));
        }
        if (auto err = fill_field(r, key, v)) return R::fail(*err);
    }
    if (r.op == "attach" && !r.pid) return R::fail("attach: field \"pid\" is required (a positive integer)");
    if (r.op == "detach" && !r.id) return R::fail("detach: field \"id\" is required (a session id)");
    return r;
}

}  // namespace

Result<Request> parse_request(std::string_view line) {
    using R = Result<Request>;
    if (line.size() > kMaxRequestBytes)
        return R::fail("request too large (> " + std::to_string(kMaxRequestBytes) + " bytes)");
    // The JSON parser stops at a NUL as at the end of input: the bytes after
    // it would be ignored, not refused.
    if (size_t nul = line.find('\0'); nul != std::string_view::npos)
        return R::fail("request has a NUL byte at offset " + std::to_string(nul) +
                       ": a request is one line of JSON text, ended by a newline");
    // Checked before parsing: the parser must never see a nesting bomb.
    if (nesting_depth(line) > kMaxNestingDepth)
        return R::fail("not valid JSON: nesting deeper than " + std::to_string(kMaxNestingDepth) + " levels");
    try {
        json j = json::parse(line.begin(), line.end());
        return validate(j);
    } catch (const json::parse_error& e) {
        // nlohmann quotes the whole offending token: keep the reply small.
        std::string what = e.what();
        if (what.size() > 256) what = what.substr(0, 256) + "...";
        return R::fail("not valid JSON: " + what);
    } catch (const std::exception& e) {
        return R::fail(std::string("invalid request: ") + e.what());
    }
}

// ---- authorization -----------------------------------------------------------

Access authorize(const Request& req, const PeerCred& peer,
                 const std::function<std::optional<host::ProcessCreds>(int pid)>& creds_of) {
    if (peer.uid == 0) return Access::Allow;
    if (req.op == "status") return Access::Allow;
    if (req.op == "sessions" || req.op == "detach") return Access::AllowOwnOnly;
    if (req.op != "counts" && req.op != "attach") return Access::Deny;
    if (!req.pid) return req.op == "counts" ? Access::AllowOwnOnly : Access::Deny;
    // Without a way to learn who a process is, a process-scoped request is refused.
    if (!creds_of) return Access::Deny;
    // An unknown pid is let through so the reply says "no such process".
    auto creds = creds_of(*req.pid);
    if (creds && !may_read_process(*creds, peer.uid, peer.gid)) return Access::Deny;
    return req.op == "counts" ? Access::AllowOwnOnly : Access::Allow;
}

std::string deny_message(const Request& req, const PeerCred& peer) {
    std::string what = req.op.empty() ? std::string("request") : bounded(req.op);
    if ((req.op == "attach" || req.op == "counts") && req.pid)
        return "permission denied — " + what + " " + std::to_string(*req.pid) + ": uid " +
               std::to_string(peer.uid) +
               " may not read that process (another user's, a set-user-ID or set-group-ID program, or "
               "not dumpable: the kernel's ptrace rule); run as root or as the process owner";
    return "permission denied — " + what + ": not allowed for uid " + std::to_string(peer.uid) +
           "; run as root";
}

// ---- what users other than root may ask for ----------------------------------

nlohmann::json to_json(const UnprivilegedLimits& l) {
    return {{"sessions_per_uid", l.sessions_per_uid},
            {"ringbuf_kb", l.ringbuf_kb},
            {"max_records", l.max_records},
            {"duration_s", l.duration_s},
            {"connections_per_uid", l.connections_per_uid},
            {"probe_files", l.probe_files}};
}

std::optional<std::string> unprivileged_problem(const Request& req, uint32_t uid, const UnprivilegedLimits& l) {
    if (uid == 0 || req.op != "attach") return std::nullopt;
    const std::string who = " allowed to uid " + std::to_string(uid) + " — ";
    const std::string or_root = ", or run commdbg as root";
    if (req.ringbuf_kb > l.ringbuf_kb)
        return "--ringbuf-kb " + std::to_string(req.ringbuf_kb) + " is over the " + std::to_string(l.ringbuf_kb) +
               " KiB" + who + "ask for " + std::to_string(l.ringbuf_kb) + " or less" + or_root;
    if (req.max_records > l.max_records)
        return "--max-records " + std::to_string(req.max_records) + " is over the " + std::to_string(l.max_records) +
               who + "ask for " + std::to_string(l.max_records) + " or less" + or_root;
    if (!l.probe_files)
        for (const auto& p : req.probes)
            if (p.find('/') != std::string::npos || p.ends_with(".json"))
                return "--probes " + bounded(p) + ": through commdbgd, uid " + std::to_string(uid) +
                       " may name built-in specs only (`commdbg probes list`), since the daemon would read the "
                       "file as root — ask root to trace with that spec file";
    if (req.duration_s > l.duration_s)
        return "--duration " + limits::format_seconds(req.duration_s) + " is over the " +
               limits::format_seconds(l.duration_s) + who + "ask for " + limits::format_seconds(l.duration_s) +
               " or less (without -d a window ends there too)" + or_root;
    return std::nullopt;
}

double session_window_s(const Request& req, uint32_t uid, const UnprivilegedLimits& l) {
    if (uid == 0 || req.duration_s > 0) return req.duration_s;
    return l.duration_s;
}

// ---- responses ---------------------------------------------------------------

namespace {
// Client bytes may reach a message (an invalid-UTF-8 token in a parse error):
// replace them rather than let dump() throw.
std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}
}  // namespace

std::string error_response(std::string_view message) {
    json j = json::object();
    j["error"] = std::string(message);
    return "{\"ok\":false," + dump(j).substr(1) + "\n";
}

std::string ok_response(json body) {
    if (body.is_null()) body = json::object();
    if (!body.is_object()) body = json{{"result", std::move(body)}};
    body.erase("ok");
    std::string rest = dump(body);  // "{...}"
    if (rest == "{}") return "{\"ok\":true}\n";
    return "{\"ok\":true," + rest.substr(1) + "\n";
}

bool send_all(int fd, std::string_view s, int stall_ms) {
    size_t off = 0;
    const int flags = MSG_NOSIGNAL | (stall_ms >= 0 ? MSG_DONTWAIT : 0);
    while (off < s.size()) {
        ssize_t n = ::send(fd, s.data() + off, s.size() - off, flags);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && stall_ms >= 0) {
            pollfd p{fd, POLLOUT, 0};
            int r = poll(&p, 1, stall_ms);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;  // no room for stall_ms: the peer stopped reading
            continue;
        }
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

}  // namespace commdbg::protocol
