// SPDX-License-Identifier: Apache-2.0
// Regular expressions read from probe specs and lifecycle profiles, matched
// against text from the traced process (symbol names, scope labels).  RE2:
// no backtracking, so a match takes time linear in the text whatever the
// pattern; the pattern's size and compiled memory are bounded when the file
// is read, so a hostile one is refused there with a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "result.hpp"

namespace re2 {
class RE2;
}  // namespace re2

namespace commdbg {

// Longest pattern a spec or profile may give (bytes, as written).
inline constexpr size_t kMaxPatternBytes = 4096;
// Why `text`, as written in a file, is too long to compile, or nothing.
std::optional<std::string> pattern_length_problem(std::string_view text);
// RE2's memory for one compiled pattern (its program and match cache).
inline constexpr int64_t kMaxPatternMemory = 1 << 20;

// Bytes, not UTF-8 characters, as the names it reads are (Latin-1 mode:
// '.' is one byte, a literal non-ASCII character its bytes in order).
// Copies share the compiled program, which RE2 lets threads use at once.
class Pattern {
public:
    // The RE2 syntax; the error says what is wrong, without a prefix.
    // Callers check the length of what the user wrote first.
    static Result<Pattern> compile(std::string_view text);

    bool full_match(std::string_view s) const;     // the whole of `s`
    bool partial_match(std::string_view s) const;  // anywhere in `s`
    // Whole-text match, with capture group `group` (1-based) in `captured`
    // (empty when the group took no part).
    bool full_match(std::string_view s, int group, std::string& captured) const;
    int groups() const;  // capture groups in the pattern
    const std::string& text() const { return text_; }

private:
    Pattern() = default;
    std::string text_;
    std::shared_ptr<const re2::RE2> re_;
};

}  // namespace commdbg
