// SPDX-License-Identifier: Apache-2.0
// Recoverable errors are values that carry a message a user can act on;
// CommdbgError is the one exception type, for fatal user errors, caught in main.
#pragma once

#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace commdbg {

// [[nodiscard]]: an ignored failure is a silent one; a caller that means to
// ignore one says so with (void).
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T v) : value_(std::move(v)) {}
    static Result fail(std::string msg) {
        Result r;
        r.error_ = std::move(msg);
        return r;
    }
    bool ok() const { return value_.has_value(); }
    explicit operator bool() const { return ok(); }
    T& value() { return *value_; }
    const T& value() const { return *value_; }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }
    T& operator*() { return *value_; }
    const std::string& error() const { return error_; }

private:
    Result() = default;
    std::optional<T> value_;
    std::string error_;
};

// Runs `f` where no exception may escape: a handler called from a C frame
// (libbpf's ring_buffer__poll), where one would be undefined behaviour.
// Returns what went wrong, or nullopt when `f` returned.
template <typename F>
std::optional<std::string> run_without_throwing(F&& f) noexcept {
    try {
        f();
        return std::nullopt;
    } catch (const std::exception& e) {
        return std::string(e.what());
    } catch (...) {
        return std::string("unknown exception");
    }
}

// Outside text echoed in a message (a name from a request, a file, a
// command line): at most `max` bytes of it, "..." marking the cut, so a
// message stays small whatever it quotes.
inline std::string bounded(std::string_view s, size_t max = 64) {
    std::string out(s.substr(0, max));
    if (s.size() > max) out += "...";
    return out;
}

class CommdbgError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace commdbg
