// SPDX-License-Identifier: Apache-2.0
// Patterns from spec and profile files (pattern.hpp): matched without
// backtracking, bytes as bytes, and refused when they are too long or would
// compile too large.
#include <gtest/gtest.h>

#include <string>

#include "bounded_time.hpp"
#include "pattern.hpp"

namespace commdbg {
namespace {

using timing::finishes_within;
using timing::kPatternTimeBound;

Pattern compiled(const std::string& text) {
    auto p = Pattern::compile(text);
    if (!p) throw std::runtime_error(p.error());
    return p.value();
}

TEST(Pattern, FullAndPartialMatchAndACapturedGroup) {
    Pattern p = compiled("a(b*)c");
    EXPECT_TRUE(p.full_match("abbc"));
    EXPECT_FALSE(p.full_match("xabbc"));
    EXPECT_TRUE(p.partial_match("xabbcx"));
    std::string g;
    ASSERT_TRUE(p.full_match("abbc", 1, g));
    EXPECT_EQ(g, "bb");
    EXPECT_FALSE(p.full_match("abd", 1, g));
}

TEST(Pattern, NestedLazyRepetitionsAnswerInBoundedTime) {
    // Exponential for a backtracking matcher on a text that does not match.
    std::string re = "^";
    for (int i = 0; i < 12; ++i) re += "(.*?)*";
    re += "Q$";
    Pattern p = compiled(re);
    const std::string miss(4000, 'a');
    auto got = finishes_within(kPatternTimeBound, [p, miss] {
        return std::pair{p.partial_match(miss), p.partial_match(miss + "Q")};
    });
    ASSERT_TRUE(got) << "no answer within " << kPatternTimeBound.count() << " s";
    EXPECT_FALSE(got->first);
    EXPECT_TRUE(got->second);
}

TEST(Pattern, BytesAreMatchedAsBytesNotUtf8) {
    // Symbol names and labels are bytes; invalid UTF-8 must still match '.'.
    EXPECT_TRUE(compiled("^a.b$").partial_match("a\xff" "b"));
    EXPECT_TRUE(compiled("^..$").full_match("\xc3\xa9"));  // "é" is two bytes
    EXPECT_TRUE(compiled("caf\xc3\xa9").full_match("caf\xc3\xa9"));
}

TEST(Pattern, SyntaxErrorSaysWhatAndWhere) {
    auto p = Pattern::compile("^at::(unclosed");
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().find("invalid regular expression"), std::string::npos) << p.error();
    EXPECT_NE(p.error().find("missing )"), std::string::npos) << p.error();
    // ECMAScript's lookahead and backreferences need backtracking: refused.
    EXPECT_FALSE(Pattern::compile("a(?=b)"));
    EXPECT_FALSE(Pattern::compile("(a)\\1"));
}

TEST(Pattern, PatternCompilingOverTheMemoryBoundIsRefused) {
    // Short text, large program: 100 repetitions of a 1000-fold class.
    std::string re;
    for (int i = 0; i < 100; ++i) re += "[a-z]{1000}";
    ASSERT_LE(re.size(), kMaxPatternBytes);
    auto p = Pattern::compile(re);
    ASSERT_FALSE(p);
    EXPECT_NE(p.error().find(std::to_string(kMaxPatternMemory >> 10) + " KiB"), std::string::npos) << p.error();
}

TEST(Pattern, LengthOverTheLimitIsAProblemAtTheLimitIsNot) {
    EXPECT_FALSE(pattern_length_problem(std::string(kMaxPatternBytes, 'a')));
    auto problem = pattern_length_problem(std::string(kMaxPatternBytes + 1, 'a'));
    ASSERT_TRUE(problem);
    EXPECT_NE(problem->find(std::to_string(kMaxPatternBytes) + "-byte limit"), std::string::npos) << *problem;
}

}  // namespace
}  // namespace commdbg
