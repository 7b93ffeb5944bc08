// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the commdbgd control protocol: the input is a byte
// stream a client might send, fed to LineReader in chunks of varying size;
// every line goes through parse_request, authorize, deny_message and the
// response encoders. Any crash, sanitizer report or broken invariant (a reply
// that is not one JSON line) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "control_protocol.hpp"

namespace {

using namespace commdbg;
using namespace commdbg::protocol;

// Chunk sizes come from a PRNG seeded by the input's hash, not from input
// bytes, so seed files stay plain request lines.
struct XorShift {
    uint64_t s;
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
};

uint64_t fnv1a(const uint8_t* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h | 1;
}

void require(bool cond) {
    if (!cond) abort();
}

// A reply must be exactly one line of JSON object text.
void check_reply(const std::string& reply, bool ok) {
    require(!reply.empty() && reply.back() == '\n');
    require(reply.find('\n') == reply.size() - 1);
    auto j = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    require(j.is_object() && j.contains("ok") && j["ok"] == ok);
}

std::optional<host::ProcessCreds> fake_owner(int pid) {
    host::ProcessCreds c;
    switch (pid % 4) {
    case 0: return c;  // root's
    case 1: c.uids.fill(1000), c.gids.fill(1000); return c;
    case 2: c.uids.fill(1000), c.gids.fill(1000), c.dumpable = false; return c;
    default: return std::nullopt;
    }
}

void exercise(std::string_view line) {
    auto r = parse_request(line);
    if (!r.ok()) {
        require(!r.error().empty());
        check_reply(error_response(r.error()), false);
        return;
    }
    const Request& req = r.value();
    require(req.op == "status" || req.op == "counts" || req.op == "attach" || req.op == "sessions" ||
            req.op == "detach");
    require(req.op != "attach" || (req.pid && *req.pid > 0));
    require(req.op != "detach" || (req.id && *req.id >= 1));
    for (uint32_t uid : {0u, 1000u, 1001u}) {
        PeerCred peer{1, uid, uid};
        Access a = authorize(req, peer, fake_owner);
        if (uid == 0) require(a == Access::Allow);
        if (a == Access::Deny) check_reply(error_response(deny_message(req, peer)), false);
    }
    nlohmann::json body = {{"op", req.op}, {"probes", req.probes}};
    check_reply(ok_response(std::move(body)), true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view input(reinterpret_cast<const char*>(data), size);
    XorShift rng{fnv1a(data, size)};

    // An input without '\n' never leaves LineReader: parse it whole. With
    // newlines the stream below yields its lines; parsing twice halves exec/s.
    if (input.find('\n') == std::string_view::npos) exercise(input);

    // As a stream: default limit, or a tiny one to reach the overflow path.
    LineReader reader(rng.next() % 4 == 0 ? 1 + rng.next() % 64 : kMaxRequestBytes);
    size_t pos = 0;
    while (pos < size && !reader.overflowed()) {
        size_t chunk = 1 + rng.next() % (rng.next() % 2 ? 8 : 512);
        if (chunk > size - pos) chunk = size - pos;
        for (const auto& line : reader.feed(input.substr(pos, chunk))) {
            require(!line.empty() && line.find('\n') == std::string::npos);
            exercise(line);
        }
        pos += chunk;
    }
    if (reader.overflowed()) check_reply(error_response(reader.error()), false);
    return 0;
}
