// SPDX-License-Identifier: Apache-2.0
// commdbgd control protocol: line framing (split across feeds, many per feed,
// over-long lines), request parsing with defaults and field-naming errors,
// nesting bombs refused before the parser sees them, the authorization matrix
// for root / process owner / other user, and the response encoding.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "control_protocol.hpp"

namespace commdbg::protocol {
namespace {

using json = nlohmann::json;
using Strings = std::vector<std::string>;

// ---- LineReader --------------------------------------------------------------

TEST(LineReader, JoinsALineSplitAcrossFeeds) {
    LineReader r;
    EXPECT_TRUE(r.feed("{\"op\":").empty());
    EXPECT_TRUE(r.feed("\"sta").empty());
    EXPECT_EQ(r.feed("tus\"}\n"), Strings{"{\"op\":\"status\"}"});
    EXPECT_FALSE(r.overflowed());
}

TEST(LineReader, ReturnsEveryLineOfOneFeedInOrderAndKeepsTheTail) {
    LineReader r;
    EXPECT_EQ(r.feed("a\nb\nc\npart"), (Strings{"a", "b", "c"}));
    EXPECT_EQ(r.feed("ial\n"), Strings{"partial"});
}

TEST(LineReader, DropsCarriageReturnAndSkipsBlankLines) {
    LineReader r;
    EXPECT_EQ(r.feed("a\r\n\n\r\nb\n"), (Strings{"a", "b"}));
}

TEST(LineReader, ByteAtATimeFeedingYieldsTheSameLines) {
    LineReader r;
    Strings got;
    for (char c : std::string("one\ntwo\nthree\n"))
        for (auto& l : r.feed(std::string_view(&c, 1))) got.push_back(l);
    EXPECT_EQ(got, (Strings{"one", "two", "three"}));
}

TEST(LineReader, LineOfExactlyMaxBytesIsAccepted) {
    LineReader r(8);
    EXPECT_TRUE(r.feed("12345678").empty());
    EXPECT_FALSE(r.overflowed());
    EXPECT_EQ(r.feed("\n"), Strings{"12345678"});
}

TEST(LineReader, MaxBytesWithoutNewlineOverflowsAndStaysOverflowed) {
    LineReader r(8);
    EXPECT_EQ(r.feed("ok\n123456789"), Strings{"ok"});  // lines before the bad one survive
    EXPECT_TRUE(r.overflowed());
    EXPECT_EQ(r.error(), "request too large (> 8 bytes)");
    EXPECT_TRUE(r.feed("\nfine\n").empty());
    EXPECT_TRUE(r.overflowed());
}

TEST(LineReader, OverLongLineArrivingWholeWithItsNewlineOverflows) {
    LineReader r(8);
    EXPECT_TRUE(r.feed("123456789\nnext\n").empty());
    EXPECT_TRUE(r.overflowed());
}

TEST(LineReader, DefaultLimitIs64KiBWithTheDocumentedMessage) {
    LineReader r;
    EXPECT_TRUE(r.feed(std::string(kMaxRequestBytes, 'x')).empty());
    EXPECT_FALSE(r.overflowed());
    EXPECT_TRUE(r.feed("x").empty());
    EXPECT_TRUE(r.overflowed());
    EXPECT_EQ(r.error(), "request too large (> 65536 bytes)");
}

// ---- parse_request: valid requests and defaults ------------------------------

Request parse_ok(const std::string& line) {
    auto r = parse_request(line);
    EXPECT_TRUE(r.ok()) << line << " -> " << r.error();
    return r.ok() ? r.value() : Request{};
}

std::string parse_err(const std::string& line) {
    auto r = parse_request(line);
    EXPECT_FALSE(r.ok()) << line << " was accepted";
    return r.ok() ? std::string() : r.error();
}

TEST(ParseRequest, StatusAndSessionsTakeNoFields) {
    EXPECT_EQ(parse_ok(R"({"op":"status"})").op, "status");
    EXPECT_EQ(parse_ok(R"({"op":"sessions"})").op, "sessions");
    EXPECT_EQ(parse_err(R"({"op":"status","pid":1})"),
              "status: unknown field \"pid\" (it takes no fields)");
}

TEST(ParseRequest, CountsDefaultsToAllProcessesWithoutComm) {
    auto r = parse_ok(R"({"op":"counts"})");
    EXPECT_EQ(r.op, "counts");
    EXPECT_FALSE(r.pid);
    EXPECT_FALSE(r.by_comm);
    r = parse_ok(R"({"op":"counts","pid":77,"by_comm":true})");
    EXPECT_EQ(r.pid, 77);
    EXPECT_TRUE(r.by_comm);
    EXPECT_FALSE(r.flight);
    EXPECT_TRUE(parse_ok(R"({"op":"counts","by_comm":true,"flight":true})").flight);
    EXPECT_EQ(parse_err(R"({"op":"counts","flight":1})"), "counts: field \"flight\" must be true or false");
}

TEST(ParseRequest, AttachWithOnlyPidGetsTheDefaults) {
    auto r = parse_ok(R"({"op":"attach","pid":4242})");
    EXPECT_EQ(r.pid, 4242);
    EXPECT_EQ(r.duration_s, 0);
    EXPECT_EQ(r.noise_level, 1);
    EXPECT_EQ(r.max_records, 200000u);
    EXPECT_EQ(r.max_depth, 128u);
    EXPECT_TRUE(r.probes.empty());
    EXPECT_FALSE(r.counts_only);
    EXPECT_FALSE(r.stack_args);
    EXPECT_EQ(r.ringbuf_kb, 8192u);
    EXPECT_TRUE(r.want_json && r.want_trace && r.want_table_color);
    EXPECT_FALSE(r.id);
}

TEST(ParseRequest, AttachOutputsNameWhatTheReplyCarries) {
    auto r = parse_ok(R"({"op":"attach","pid":9,"outputs":["trace"]})");
    EXPECT_TRUE(r.want_trace);
    EXPECT_FALSE(r.want_json);
    EXPECT_FALSE(r.want_table_color);
    r = parse_ok(R"({"op":"attach","pid":9,"outputs":[]})");
    EXPECT_FALSE(r.want_json || r.want_trace || r.want_table_color);
    r = parse_ok(R"({"op":"attach","pid":9,"outputs":["json","table_color"]})");
    EXPECT_TRUE(r.want_json && r.want_table_color);
    EXPECT_FALSE(r.want_trace);
    const std::string err = "attach: field \"outputs\" must be an array of \"json\", \"trace\", \"table_color\"";
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"outputs":"json"})"), err);
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"outputs":["json","svg"]})"), err);
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"outputs":[1]})"), err);
    EXPECT_EQ(parse_err(R"({"op":"counts","outputs":["json"]})").find("counts: "), 0u);
}

TEST(ParseRequest, AttachTakesEveryField) {
    auto r = parse_ok(R"({"op":"attach","pid":9,"duration_s":2.5,"noise_level":3,)"
                      R"("max_records":10,"max_depth":4,"probes":["nccl","torch"],"counts_only":true,)"
                      R"("ringbuf_kb":64,"stack_args":true})");
    EXPECT_EQ(r.pid, 9);
    EXPECT_TRUE(r.stack_args);
    EXPECT_DOUBLE_EQ(r.duration_s, 2.5);
    EXPECT_EQ(r.noise_level, 3);
    EXPECT_EQ(r.max_records, 10u);
    EXPECT_EQ(r.max_depth, 4u);
    EXPECT_EQ(r.probes, (Strings{"nccl", "torch"}));
    EXPECT_TRUE(r.counts_only);
    EXPECT_EQ(r.ringbuf_kb, 64u);
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"ringbuf_kb":2})"),
              "attach: field \"ringbuf_kb\" must be an integer from 4 to 1048576 (KiB)");
    EXPECT_DOUBLE_EQ(parse_ok(R"({"op":"attach","pid":9,"duration_s":86400})").duration_s, 86400);
    EXPECT_EQ(parse_ok(R"({"op":"attach","pid":9,"noise_level":0})").noise_level, 0);
}

TEST(ParseRequest, DetachNeedsAPositiveId) {
    EXPECT_EQ(parse_ok(R"({"op":"detach","id":3})").id, 3u);
    EXPECT_EQ(parse_ok(R"({"op":"detach","id":18446744073709551615})").id, UINT64_MAX);
    EXPECT_EQ(parse_err(R"({"op":"detach"})"), "detach: field \"id\" is required (a session id)");
    EXPECT_EQ(parse_err(R"({"op":"detach","id":0})"),
              "detach: field \"id\" must be a session id (an integer >= 1)");
    EXPECT_EQ(parse_err(R"({"op":"detach","id":"3"})"),
              "detach: field \"id\" must be a session id (an integer >= 1)");
}

TEST(ParseRequest, SurroundingWhitespaceIsAllowed) {
    EXPECT_EQ(parse_ok("  {\"op\" : \"status\"}\t ").op, "status");
}

// ---- parse_request: each invalid field ---------------------------------------

TEST(ParseRequest, AttachWithoutPidIsRefused) {
    EXPECT_EQ(parse_err(R"({"op":"attach"})"), "attach: field \"pid\" is required (a positive integer)");
}

TEST(ParseRequest, PidMustBeAPositiveIntegerThatFitsAnInt) {
    const std::string msg = "attach: field \"pid\" must be a positive integer";
    for (const char* pid : {"0", "-1", "1.5", "1.0", "\"42\"", "null", "true", "[1]", "2147483648",
                            "99999999999999999999"})
        EXPECT_EQ(parse_err(std::string(R"({"op":"attach","pid":)") + pid + "}"), msg) << pid;
    EXPECT_EQ(parse_ok(R"({"op":"attach","pid":2147483647})").pid, 2147483647);
    EXPECT_EQ(parse_err(R"({"op":"counts","pid":0})"), "counts: field \"pid\" must be a positive integer");
}

// The same rule as `commdbg attach -d` without the daemon (limits.hpp): 0 is
// "until detached or the process exits", up to 30 days.
TEST(ParseRequest, DurationIsZeroForUntilDetachedOrUpToThirtyDays) {
    for (const char* d : {"0", "-0.0", "2.5", "100000", "2592000"})
        EXPECT_DOUBLE_EQ(parse_ok(std::string(R"({"op":"attach","pid":1,"duration_s":)") + d + "}").duration_s,
                         std::stod(d))
            << d;
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"duration_s":-1})"),
              "attach: field \"duration_s\" must not be negative (0 or leave it out: until Ctrl-C or the process "
              "exits)");
    for (const char* d : {"2592000.5", "1e9"})
        EXPECT_EQ(parse_err(std::string(R"({"op":"attach","pid":1,"duration_s":)") + d + "}"),
                  "attach: field \"duration_s\" must be at most 2592000 seconds (30 days); leave it out to trace "
                  "until Ctrl-C or the process exits")
            << d;
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"duration_s":"5"})"),
              "attach: field \"duration_s\" must be a number of seconds");
}

// Ceilings for everyone, root included (limits.hpp).
TEST(ParseRequest, RecordBudgetAndDepthHaveTheSessionCeilings) {
    EXPECT_EQ(parse_ok(R"({"op":"attach","pid":1,"max_records":20000000})").max_records, 20000000u);
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"max_records":20000001})"),
              "attach: field \"max_records\" must be an integer from 1 to 20000000");
    EXPECT_EQ(parse_ok(R"({"op":"attach","pid":1,"max_depth":4096})").max_depth, 4096u);
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"max_depth":4097})"),
              "attach: field \"max_depth\" must be an integer from 1 to 4096");
}

TEST(ParseRequest, NoiseLevelMustBeZeroToThree) {
    const std::string msg = "attach: field \"noise_level\" must be an integer from 0 to 3";
    for (const char* n : {"4", "-1", "1.5", "\"1\""})
        EXPECT_EQ(parse_err(std::string(R"({"op":"attach","pid":1,"noise_level":)") + n + "}"), msg) << n;
}

TEST(ParseRequest, LimitsMustBeAtLeastOne) {
    for (const auto& [f, hi] : std::map<std::string, std::string>{{"max_records", "20000000"}, {"max_depth", "4096"}})
        for (const char* n : {"0", "-5", "2.5", "\"10\""})
            EXPECT_EQ(parse_err(std::string(R"({"op":"attach","pid":1,")") + f + "\":" + n + "}"),
                      "attach: field \"" + f + "\" must be an integer from 1 to " + hi)
                << f << "=" << n;
}

TEST(ParseRequest, ProbesMustBeAnArrayOfNonEmptyStrings) {
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"probes":"nccl"})"),
              "attach: field \"probes\" must be an array of probe names");
    for (const char* p : {R"([1])", R"([""])", R"(["nccl",null])", R"([["nccl"]])"})
        EXPECT_EQ(parse_err(std::string(R"({"op":"attach","pid":1,"probes":)") + p + "}"),
                  "attach: field \"probes\" must be an array of non-empty strings")
            << p;
}

TEST(ParseRequest, BooleansMustBeBooleans) {
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"counts_only":1})"),
              "attach: field \"counts_only\" must be true or false");
    EXPECT_EQ(parse_err(R"({"op":"attach","pid":1,"stack_args":"yes"})"),
              "attach: field \"stack_args\" must be true or false");
    EXPECT_EQ(parse_err(R"({"op":"counts","by_comm":"yes"})"),
              "counts: field \"by_comm\" must be true or false");
}

TEST(ParseRequest, UnknownOpListsTheOps) {
    EXPECT_EQ(parse_err(R"({"op":"foo"})"),
              "unknown op \"foo\" (one of status, counts, attach, sessions, detach)");
    // Echoed client text is bounded.
    EXPECT_LT(parse_err(R"({"op":")" + std::string(10000, 'a') + "\"}").size(), 200u);
}

TEST(ParseRequest, MissingOrNonStringOpIsRefused) {
    EXPECT_EQ(parse_err(R"({"pid":1})"),
              "request has no \"op\" field (one of status, counts, attach, sessions, detach)");
    EXPECT_EQ(parse_err(R"({"op":1})"),
              "field \"op\" must be a string (one of status, counts, attach, sessions, detach)");
}

TEST(ParseRequest, ExtraFieldIsRejectedNamingTheAllowedOnes) {
    EXPECT_EQ(parse_err(R"({"op":"counts","pid":1,"verbose":true})"),
              "counts: unknown field \"verbose\" (allowed: pid, by_comm, flight)");
    // A field of another op is just as unknown.
    EXPECT_EQ(parse_err(R"({"op":"detach","id":1,"pid":2})"),
              "detach: unknown field \"pid\" (allowed: id)");
}

TEST(ParseRequest, NotJsonSaysSo) {
    for (const char* l : {"", "status", "{\"op\":\"status\"", "{\"op\":\"status\"} trailing", "{'op':1}",
                          "\xff\xfe", "{\"op\":\"\xc3\x28\"}"}) {
        std::string e = parse_err(l);
        EXPECT_EQ(e.rfind("not valid JSON: ", 0), 0u) << l << " -> " << e;
    }
}

TEST(ParseRequest, NotJsonErrorIsBoundedInSize) {
    std::string e = parse_err("{\"op\":\"" + std::string(60000, 'a'));
    EXPECT_EQ(e.rfind("not valid JSON: ", 0), 0u);
    EXPECT_LT(e.size(), 400u);
}

TEST(ParseRequest, NulByteAnywhereInTheLineIsRefused) {
    // The JSON parser took a NUL for the end of input and ignored what followed.
    using namespace std::string_literals;
    for (const std::string& l : {"{\"op\":\"status\"}\0"s, "{\"op\":\"status\"}\0{\"op\":\"detach\"}"s,
                                 "{\"op\":\"sta\0tus\"}"s, "\0"s}) {
        std::string e = parse_err(l);
        EXPECT_NE(e.find("NUL byte at offset " + std::to_string(l.find('\0'))), std::string::npos) << e;
        EXPECT_NE(e.find("one line of JSON text"), std::string::npos) << e;
    }
}

TEST(ParseRequest, NonObjectIsRefused) {
    for (const char* l : {"[]", "[{\"op\":\"status\"}]", "\"status\"", "42", "null", "true"})
        EXPECT_EQ(parse_err(l), "request must be a JSON object") << l;
}

TEST(ParseRequest, NestingBombsAreRefusedWithoutParsing) {
    for (char open : {'[', '{'}) {
        EXPECT_EQ(parse_err(std::string(60000, open)), "not valid JSON: nesting deeper than 32 levels");
        EXPECT_EQ(parse_err("{\"op\":" + std::string(60000, open)),
                  "not valid JSON: nesting deeper than 32 levels");
        // Past the line limit the size check answers first; still an error.
        EXPECT_FALSE(parse_request(std::string(100000, open)).ok());
    }
    // Well-formed but deep: still refused, the parser never recurses on it.
    std::string deep = R"({"op":"attach","pid":1,"probes":)" + std::string(40, '[') + std::string(40, ']') + "}";
    EXPECT_EQ(parse_err(deep), "not valid JSON: nesting deeper than 32 levels");
}

TEST(ParseRequest, BracketsInsideStringsDoNotCountAsNesting) {
    std::string name = std::string(1000, '[') + "\\\"" + std::string(1000, '{');
    auto r = parse_ok(R"({"op":"attach","pid":1,"probes":[")" + name + "\"]}");
    ASSERT_EQ(r.probes.size(), 1u);
    EXPECT_EQ(r.probes[0].size(), 2001u);
}

TEST(ParseRequest, NestingAtTheLimitStillParses) {
    // 32 levels: the object plus 31 arrays; reaches field validation.
    std::string l = R"({"op":"attach","pid":1,"probes":)" + std::string(31, '[') + std::string(31, ']') + "}";
    EXPECT_EQ(parse_err(l), "attach: field \"probes\" must be an array of non-empty strings");
}

TEST(ParseRequest, OverLongLineIsRefused) {
    EXPECT_EQ(parse_err(std::string(kMaxRequestBytes + 1, ' ')), "request too large (> 65536 bytes)");
}

// ---- authorize ---------------------------------------------------------------

constexpr uint32_t kAlice = 1000, kBob = 1001;

host::ProcessCreds creds(uint32_t uid, bool dumpable = true) {
    host::ProcessCreds c;
    c.uids.fill(uid);
    c.gids.fill(uid);  // each user's gid is its uid here
    c.dumpable = dumpable;
    return c;
}

// Alice's processes past 200 are hers by their real uid, not to the kernel.
const std::map<int, host::ProcessCreds> kOwners = [] {
    std::map<int, host::ProcessCreds> m = {{100, creds(0)}, {200, creds(kAlice)}, {300, creds(kBob)},
                                     {400, creds(kAlice, false)}};
    host::ProcessCreds setuid_root = creds(kAlice);
    setuid_root.uids = {kAlice, 0, 0, 0};  // a set-uid-root program she started (passwd)
    m[500] = setuid_root;
    host::ProcessCreds setgid = creds(kAlice);
    setgid.gids = {kAlice, 42, 42, 42};
    m[600] = setgid;
    host::ProcessCreds saved_root = creds(kAlice);
    saved_root.uids[2] = 0;  // root that set only its real and effective uid to hers
    m[700] = saved_root;
    return m;
}();

std::optional<host::ProcessCreds> owner_of(int pid) {
    auto it = kOwners.find(pid);
    if (it == kOwners.end()) return std::nullopt;
    return it->second;
}

Access access(const std::string& line, uint32_t uid) {
    auto r = parse_request(line);
    EXPECT_TRUE(r.ok()) << r.error();
    return authorize(r.value(), PeerCred{1, uid, uid}, owner_of);
}

TEST(Authorize, RootMayDoAnything) {
    for (const char* l : {R"({"op":"status"})", R"({"op":"sessions"})", R"({"op":"counts"})",
                          R"({"op":"counts","pid":300})", R"({"op":"attach","pid":300})",
                          R"({"op":"attach","pid":100})", R"({"op":"detach","id":1})"})
        EXPECT_EQ(access(l, 0), Access::Allow) << l;
}

TEST(Authorize, AnyUserMayAskStatus) {
    EXPECT_EQ(access(R"({"op":"status"})", kAlice), Access::Allow);
}

TEST(Authorize, NonRootSeesOnlyTheirOwnSessionsCountsAndDetaches) {
    EXPECT_EQ(access(R"({"op":"sessions"})", kAlice), Access::AllowOwnOnly);
    EXPECT_EQ(access(R"({"op":"counts"})", kAlice), Access::AllowOwnOnly);
    EXPECT_EQ(access(R"({"op":"counts","by_comm":true})", kAlice), Access::AllowOwnOnly);
    EXPECT_EQ(access(R"({"op":"detach","id":7})", kAlice), Access::AllowOwnOnly);
}

TEST(Authorize, CountsOfAnExplicitPidRequireOwningIt) {
    EXPECT_EQ(access(R"({"op":"counts","pid":200})", kAlice), Access::AllowOwnOnly);
    EXPECT_EQ(access(R"({"op":"counts","pid":300})", kAlice), Access::Deny);
    EXPECT_EQ(access(R"({"op":"counts","pid":100})", kAlice), Access::Deny);
    EXPECT_EQ(access(R"({"op":"counts","pid":999})", kAlice), Access::AllowOwnOnly);
}

TEST(Authorize, AttachOnlyToOwnProcessesUnknownPidLetThrough) {
    EXPECT_EQ(access(R"({"op":"attach","pid":200})", kAlice), Access::Allow);
    EXPECT_EQ(access(R"({"op":"attach","pid":300})", kAlice), Access::Deny);
    EXPECT_EQ(access(R"({"op":"attach","pid":100})", kAlice), Access::Deny);
    EXPECT_EQ(access(R"({"op":"attach","pid":300})", kBob), Access::Allow);
    EXPECT_EQ(access(R"({"op":"attach","pid":999})", kAlice), Access::Allow);
}

// The kernel would not let her read these (ptrace_may_access): neither may she through the root daemon.
TEST(Authorize, NonDumpableAndSetIdProcessesOfTheCallerAreDenied) {
    for (int pid : {400, 500, 600, 700}) {
        const std::string p = std::to_string(pid);
        EXPECT_EQ(access(R"({"op":"attach","pid":)" + p + "}", kAlice), Access::Deny) << pid;
        EXPECT_EQ(access(R"({"op":"counts","pid":)" + p + "}", kAlice), Access::Deny) << pid;
        EXPECT_EQ(access(R"({"op":"attach","pid":)" + p + "}", 0), Access::Allow) << pid;
    }
    // Her gid must be the process's too.
    Request attach = parse_request(R"({"op":"attach","pid":200})").value();
    EXPECT_EQ(authorize(attach, PeerCred{1, kAlice, kAlice}, owner_of), Access::Allow);
    EXPECT_EQ(authorize(attach, PeerCred{1, kAlice, 42}, owner_of), Access::Deny);
}

TEST(Authorize, WithoutAnOwnerLookupProcessScopedRequestsAreDenied) {
    Request attach = parse_request(R"({"op":"attach","pid":200})").value();
    EXPECT_EQ(authorize(attach, PeerCred{1, kAlice, kAlice}, nullptr), Access::Deny);
    EXPECT_EQ(authorize(attach, PeerCred{1, 0, 0}, nullptr), Access::Allow);
}

TEST(Authorize, UnknownOpIsDeniedToNonRoot) {
    Request r;
    r.op = "reboot";
    EXPECT_EQ(authorize(r, PeerCred{1, kAlice, kAlice}, owner_of), Access::Deny);
}

TEST(Authorize, DenyMessageNamesTheOpThePidAndTheWayOut) {
    Request r = parse_request(R"({"op":"attach","pid":4242})").value();
    const std::string why =
        ": uid 1000 may not read that process (another user's, a set-user-ID or set-group-ID program, or not "
        "dumpable: the kernel's ptrace rule); run as root or as the process owner";
    EXPECT_EQ(deny_message(r, PeerCred{1, kAlice, kAlice}), "permission denied — attach 4242" + why);
    r = parse_request(R"({"op":"counts","pid":300})").value();
    EXPECT_EQ(deny_message(r, PeerCred{1, kAlice, kAlice}), "permission denied — counts 300" + why);
}

// ---- what users other than root may ask for -------------------------------------

TEST(UnprivilegedLimits, RootIsHeldOnlyToTheSessionCeilings) {
    auto r = parse_ok(R"({"op":"attach","pid":9,"ringbuf_kb":1048576,"max_records":20000000,"duration_s":2592000})");
    EXPECT_FALSE(unprivileged_problem(r, 0));
    EXPECT_DOUBLE_EQ(session_window_s(r, 0), 2592000);
    EXPECT_DOUBLE_EQ(session_window_s(parse_ok(R"({"op":"attach","pid":9})"), 0), 0);
}

TEST(UnprivilegedLimits, OtherUsersAreToldTheLimitInTheCliOptionNames) {
    auto problem = [](const std::string& fields, uint32_t uid) {
        auto p = unprivileged_problem(parse_ok(R"({"op":"attach","pid":9,)" + fields + "}"), uid);
        return p ? *p : std::string("(none)");
    };
    EXPECT_EQ(problem(R"("ringbuf_kb":1048576)", 65534),
              "--ringbuf-kb 1048576 is over the 65536 KiB allowed to uid 65534 — ask for 65536 or less, or run "
              "commdbg as root");
    EXPECT_EQ(problem(R"("max_records":200001)", 65534),
              "--max-records 200001 is over the 200000 allowed to uid 65534 — ask for 200000 or less, or run "
              "commdbg as root");
    EXPECT_EQ(problem(R"("duration_s":3600.5)", 1000),
              "--duration 3600.5 s is over the 3600 s allowed to uid 1000 — ask for 3600 s or less (without -d a "
              "window ends there too), or run commdbg as root");
    EXPECT_EQ(problem(R"("ringbuf_kb":65536,"max_records":200000,"duration_s":3600)", 65534), "(none)");
}

// The daemon reads spec files as root: another user naming one could learn
// whether a file exists and pieces of it from the parse error.
TEST(UnprivilegedLimits, OtherUsersNameBuiltInSpecsOnly) {
    auto probes = [](const std::string& list, uint32_t uid) {
        return unprivileged_problem(parse_ok(R"({"op":"attach","pid":9,"probes":)" + list + "}"), uid);
    };
    auto p = probes(R"(["nccl","/etc/shadow"])", 65534);
    ASSERT_TRUE(p);
    EXPECT_EQ(*p, "--probes /etc/shadow: through commdbgd, uid 65534 may name built-in specs only (`commdbg probes "
                  "list`), since the daemon would read the file as root — ask root to trace with that spec file");
    EXPECT_TRUE(probes(R"(["my-spec.json"])", 65534));
    EXPECT_TRUE(probes(R"(["/root"])", 1000));
    EXPECT_FALSE(probes(R"(["nccl","torch-aten"])", 65534));
    EXPECT_FALSE(probes(R"(["/etc/commdbg/spec.json"])", 0));
}

TEST(UnprivilegedLimits, AnotherUsersWindowWithoutDurationEndsAtTheLongestAllowed) {
    EXPECT_DOUBLE_EQ(session_window_s(parse_ok(R"({"op":"attach","pid":9})"), 65534), 3600);
    EXPECT_DOUBLE_EQ(session_window_s(parse_ok(R"({"op":"attach","pid":9,"duration_s":10})"), 65534), 10);
}

TEST(UnprivilegedLimits, StatusStatesEveryLimit) {
    EXPECT_EQ(to_json(kUnprivilegedLimits),
              json::parse(R"({"sessions_per_uid":2,"ringbuf_kb":65536,"max_records":200000,"duration_s":3600.0,)"
                          R"("connections_per_uid":8,"probe_files":false})"));
}

// ---- responses ---------------------------------------------------------------

TEST(Responses, ErrorResponseIsOneJsonLine) {
    std::string s = error_response("bad \"thing\"\nhere");
    EXPECT_EQ(s, "{\"ok\":false,\"error\":\"bad \\\"thing\\\"\\nhere\"}\n");
    EXPECT_EQ(s.find('\n'), s.size() - 1);
}

TEST(Responses, ErrorResponseSurvivesInvalidUtf8) {
    std::string s = error_response("bad \xff byte");
    auto j = json::parse(s);
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["error"], "bad \xEF\xBF\xBD byte");
}

TEST(Responses, OkResponsePutsOkFirst) {
    EXPECT_EQ(ok_response(json{{"a", 1}, {"z", "y"}}), "{\"ok\":true,\"a\":1,\"z\":\"y\"}\n");
    EXPECT_EQ(ok_response(json::object()), "{\"ok\":true}\n");
    EXPECT_EQ(ok_response(nullptr), "{\"ok\":true}\n");
    // The body cannot claim failure.
    EXPECT_EQ(ok_response(json{{"ok", false}, {"b", 2}}), "{\"ok\":true,\"b\":2}\n");
    EXPECT_EQ(ok_response(json::array({1, 2})), "{\"ok\":true,\"result\":[1,2]}\n");
}

TEST(Responses, NotJsonErrorFromTheParserMakesAValidReply) {
    auto r = parse_request("{\"op\":\xff}");
    ASSERT_FALSE(r.ok());
    std::string reply = error_response(r.error());
    json parsed;
    EXPECT_NO_THROW(parsed = json::parse(reply));
    EXPECT_EQ(parsed["ok"], false);
}

}  // namespace
}  // namespace commdbg::protocol
