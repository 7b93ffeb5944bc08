// SPDX-License-Identifier: Apache-2.0
#include "pattern.hpp"

#include <vector>

#include <re2/re2.h>

namespace commdbg {

std::optional<std::string> pattern_length_problem(std::string_view text) {
    if (text.size() <= kMaxPatternBytes) return std::nullopt;
    return "is " + std::to_string(text.size()) + " bytes, over the " + std::to_string(kMaxPatternBytes) +
           "-byte limit for a pattern — shorten it";
}

Result<Pattern> Pattern::compile(std::string_view text) {
    RE2::Options opts;
    opts.set_encoding(RE2::Options::EncodingLatin1);
    opts.set_log_errors(false);  // the error goes into our message, not to stderr
    opts.set_max_mem(kMaxPatternMemory);
    auto re = std::make_shared<const RE2>(re2::StringPiece(text.data(), text.size()), opts);
    if (!re->ok()) {
        if (re->error_code() == RE2::ErrorPatternTooLarge)
            return Result<Pattern>::fail("pattern compiles to more than " + std::to_string(kMaxPatternMemory >> 10) +
                                         " KiB (too many or too large repetitions) — simplify it");
        return Result<Pattern>::fail("invalid regular expression: " + re->error() +
                                     (re->error_arg().empty() ? "" : " at \"" + re->error_arg() + "\""));
    }
    Pattern p;
    p.text_ = std::string(text);
    p.re_ = std::move(re);
    return p;
}

bool Pattern::full_match(std::string_view s) const { return RE2::FullMatch(re2::StringPiece(s.data(), s.size()), *re_); }

bool Pattern::partial_match(std::string_view s) const {
    return RE2::PartialMatch(re2::StringPiece(s.data(), s.size()), *re_);
}

bool Pattern::full_match(std::string_view s, int group, std::string& captured) const {
    captured.clear();
    if (group < 1 || group > groups()) return full_match(s);
    std::vector<re2::StringPiece> sub(static_cast<size_t>(group) + 1);
    if (!re_->Match(re2::StringPiece(s.data(), s.size()), 0, s.size(), RE2::ANCHOR_BOTH, sub.data(),
                    static_cast<int>(sub.size())))
        return false;
    if (sub[group].data()) captured.assign(sub[group].data(), sub[group].size());
    return true;
}

int Pattern::groups() const { return re_->NumberOfCapturingGroups(); }

}  // namespace commdbg
