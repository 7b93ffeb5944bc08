// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "nccl.hpp"
#include "symbol_table.hpp"

using namespace commdbg;
using namespace commdbg::capture;

namespace {

std::array<uint8_t, CD_UNIQUE_ID_BYTES> id_from(uint8_t (*f)(int)) {
    std::array<uint8_t, CD_UNIQUE_ID_BYTES> id{};
    for (int i = 0; i < CD_UNIQUE_ID_BYTES; ++i) id[i] = f(i);
    return id;
}

// ncclResult_t's enumerators as `header` defines them: value -> name.
std::map<int64_t, std::string> result_enum(const std::string& header) {
    std::ifstream in(header);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    std::map<int64_t, std::string> out;
    const size_t end = s.find("} ncclResult_t;");
    const size_t begin = s.rfind("typedef enum", end);
    if (end == std::string::npos || begin == std::string::npos) return out;
    const std::string body = s.substr(begin, end - begin);
    const std::regex e("(nccl[A-Za-z]+)\\s*=\\s*([0-9]+)");
    for (auto it = std::sregex_iterator(body.begin(), body.end(), e); it != std::sregex_iterator(); ++it)
        if ((*it)[1] != "ncclNumResults") out[std::stoll((*it)[2])] = (*it)[1];
    return out;
}

}  // namespace

// The names a recorded return is shown with are nccl.h's own: the real
// header where CUDA's is installed, and the stub's (which copies it) always.
TEST(Nccl, ResultNamesAreNcclHsEnumerators) {
    std::vector<std::string> headers = {std::string(SOURCE_DIR) + "/tests/stub_nccl/nccl_stub.h"};
    for (const char* d : {"/usr/local/cuda/include/nccl.h", "/usr/include/nccl.h"})
        if (std::filesystem::exists(d)) headers.push_back(d);
    for (const auto& dir : std::filesystem::directory_iterator("/usr/local"))
        if (dir.path().filename().string().rfind("cuda-", 0) == 0 && std::filesystem::exists(dir.path() / "include/nccl.h"))
            headers.push_back(dir.path() / "include/nccl.h");
    for (const std::string& h : headers) {
        const std::map<int64_t, std::string> names = result_enum(h);
        ASSERT_GE(names.size(), 8u) << h;
        for (const auto& [value, name] : names) EXPECT_EQ(nccl_result_name(value), name) << h;
        EXPECT_FALSE(nccl_result_name(static_cast<int64_t>(names.size()))) << h;
    }
    EXPECT_FALSE(nccl_result_name(-1));
}

TEST(Nccl, DatatypeSizesAndNamesFollowNcclH) {
    const uint32_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    const char* names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",   "uint64",
                           "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
    for (uint64_t t = 0; t < 12; ++t) {
        EXPECT_EQ(nccl_datatype_size(t), sizes[t]) << t;
        EXPECT_EQ(nccl_datatype_name(t), names[t]) << t;
    }
    EXPECT_FALSE(nccl_datatype_size(12));
    EXPECT_FALSE(nccl_datatype_name(12));
    EXPECT_FALSE(nccl_datatype_size(~0ull));
}

TEST(Nccl, RedopNamesAndUserOpsUnnamed) {
    EXPECT_EQ(nccl_redop_name(0), "sum");
    EXPECT_EQ(nccl_redop_name(1), "prod");
    EXPECT_EQ(nccl_redop_name(2), "max");
    EXPECT_EQ(nccl_redop_name(3), "min");
    EXPECT_EQ(nccl_redop_name(4), "avg");
    EXPECT_FALSE(nccl_redop_name(5));
}

TEST(Nccl, CollNamesAreCommCountsSuffixes) {
    EXPECT_EQ(coll_name(CD_COLL_ALL_REDUCE), "all_reduce");
    EXPECT_EQ(coll_name(CD_COLL_ALL_GATHER), "all_gather");
    EXPECT_EQ(coll_name(CD_COLL_REDUCE_SCATTER), "reduce_scatter");
    EXPECT_EQ(coll_name(CD_COLL_BROADCAST), "broadcast");
    EXPECT_EQ(coll_name(CD_COLL_REDUCE), "reduce");
    EXPECT_EQ(coll_name(CD_COLL_ALL_TO_ALL), "all_to_all");
    EXPECT_EQ(coll_name(CD_COLL_GATHER), "gather");
    EXPECT_EQ(coll_name(CD_COLL_SCATTER), "scatter");
    EXPECT_EQ(coll_name(CD_COLL_SEND), "send");
    EXPECT_EQ(coll_name(CD_COLL_RECV), "recv");
    EXPECT_EQ(coll_name(CD_COLL_BARRIER), "barrier");
}

// Expected values computed independently (python3, 64-bit DJB2a with each
// byte taken as a signed char, as NCCL's getHash does on x86-64).
TEST(Nccl, CommHashMatchesNcclGetHash) {
    auto zero = id_from([](int) -> uint8_t { return 0; });
    EXPECT_EQ(nccl_comm_hash(zero), 0x90116b2eaa8b6505ull);
    auto low = id_from([](int i) -> uint8_t { return i & 0x7f; });
    EXPECT_EQ(nccl_comm_hash(low), 0xbf47c767cbdf3105ull);
}

TEST(Nccl, CommHashSignExtendsBytesAbove0x7f) {
    auto id = id_from([](int i) -> uint8_t { return (i * 7 + 3) % 256; });
    EXPECT_EQ(nccl_comm_hash(id), 0x7cf8d8b1c466da05ull);
    // What an unsigned-char implementation would compute: must differ.
    EXPECT_NE(nccl_comm_hash(id), 0x65e6256f15c8ee05ull);
}

TEST(Nccl, SplitIdIsDeterministicAndSeparatesInputs) {
    uint64_t a = nccl_split_comm_id(0x1234, 0, 0);
    EXPECT_EQ(a, nccl_split_comm_id(0x1234, 0, 0));
    EXPECT_NE(a, nccl_split_comm_id(0x1234, 1, 0));
    EXPECT_NE(a, nccl_split_comm_id(0x1234, 0, 1));
    EXPECT_NE(a, nccl_split_comm_id(0x1235, 0, 0));
    EXPECT_NE(nccl_split_comm_id(0x1234, -1, 0), nccl_split_comm_id(0x1234, 0, 0));
}

TEST(SymbolTable, CookiePacksEveryFieldWhereEventsHSaysSo) {
    SymbolInfo s;
    s.name = "ncclReduce";
    s.layer = "nccl";
    s.role = CD_ROLE_COLLECTIVE;
    s.coll = CD_COLL_REDUCE;
    s.slots = {2, 3, 6, 4, 5, CD_SLOT_NONE};
    s.tail = CD_TAIL_UNIQUE_ID;
    s.return_probe = true;
    uint64_t c = make_cookie(0xabcde, s);
    EXPECT_EQ(CD_COOKIE_SYM(c), 0xabcdeu);
    EXPECT_EQ(CD_COOKIE_ROLE(c), static_cast<uint32_t>(CD_ROLE_COLLECTIVE));
    EXPECT_EQ(CD_COOKIE_COUNT(c), 2u);
    EXPECT_EQ(CD_COOKIE_DTYPE(c), 3u);
    EXPECT_EQ(CD_COOKIE_COMM(c), 6u);
    EXPECT_EQ(CD_COOKIE_REDOP(c), 4u);
    EXPECT_EQ(CD_COOKIE_PEER(c), 5u);
    EXPECT_EQ(CD_COOKIE_OUT(c), CD_SLOT_NONE);
    EXPECT_EQ(CD_COOKIE_TAIL(c), static_cast<uint32_t>(CD_TAIL_UNIQUE_ID));
    EXPECT_EQ(CD_COOKIE_COLL(c), static_cast<uint32_t>(CD_COLL_REDUCE));
    EXPECT_EQ(CD_COOKIE_RET(c), 1u);
    // comm is slot 6, a stack word: counting and records both read the stack.
    EXPECT_EQ(CD_COOKIE_STACK_COUNT(c), 1u);
    EXPECT_EQ(CD_COOKIE_STACK_RECORD(c), 1u);
    EXPECT_EQ(CD_COOKIE_PY_STACK(c), 0u);
    EXPECT_EQ(c >> 59, 0u);
    s.py_stack = true;  // bit 59, and nothing above it
    uint64_t with_stack = make_cookie(0xabcde, s);
    EXPECT_EQ(CD_COOKIE_PY_STACK(with_stack), 1u);
    EXPECT_EQ(with_stack >> 60, 0u);
    EXPECT_EQ(with_stack & ~(uint64_t{1} << 59), c);
    s.py_stack = false;
    s.return_probe = false;
    EXPECT_EQ(CD_COOKIE_RET(make_cookie(1, s)), 0u);
}

// A user-memory read costs more than the rest of a counted entry: the BPF
// side reads the stack words only when the cookie says a slot is one.
TEST(SymbolTable, CookieSaysWhenCountingOrRecordsNeedStackWords) {
    SymbolInfo s;
    s.role = CD_ROLE_COLLECTIVE;
    s.slots = {2, 3, 5, 4, CD_SLOT_NONE, CD_SLOT_NONE};  // all registers
    uint64_t regs = make_cookie(1, s);
    EXPECT_EQ(CD_COOKIE_STACK_COUNT(regs), 0u);
    EXPECT_EQ(CD_COOKIE_STACK_RECORD(regs), 0u);
    s.slots.stream = 6;  // ncclAllReduce's stream: records only
    uint64_t stream = make_cookie(1, s);
    EXPECT_EQ(CD_COOKIE_STACK_COUNT(stream), 0u);
    EXPECT_EQ(CD_COOKIE_STACK_RECORD(stream), 1u);
    s.slots.stream = CD_SLOT_NONE;
    s.slots.recvbuf = 7;
    EXPECT_EQ(CD_COOKIE_STACK_RECORD(make_cookie(1, s)), 1u);
    s.slots.recvbuf = CD_SLOT_NONE;
    s.slots.peer = 7;  // counted (communicator rank / split colour)
    uint64_t peer = make_cookie(1, s);
    EXPECT_EQ(CD_COOKIE_STACK_COUNT(peer), 1u);
    EXPECT_EQ(CD_COOKIE_STACK_RECORD(peer), 1u);
}

TEST(SymbolTable, InternDedupsOnLayerAndName) {
    SymbolTable t;
    SymbolInfo a;
    a.name = "allreduce";
    a.layer = "c10d";
    SymbolInfo b = a;
    b.layer = "nccl";
    uint32_t ia = t.intern(a);
    uint32_t ib = t.intern(b);
    EXPECT_NE(ia, ib);
    EXPECT_EQ(t.intern(a), ia);
    EXPECT_EQ(t.size(), 2u);
    ASSERT_NE(t.find(ib), nullptr);
    EXPECT_EQ(t.find(ib)->layer, "nccl");
    EXPECT_EQ(t.from_cookie(make_cookie(ia, a))->layer, "c10d");
    EXPECT_EQ(t.find(2), nullptr);
}
