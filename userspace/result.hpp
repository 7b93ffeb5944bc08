// SPDX-License-Identifier: Apache-2.0
// Recoverable errors are values that carry a message a user can act on;
// CommdbgError is the one exception type, for fatal user errors, caught in main.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace commdbg {

template <typename T>
class Result {
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

class CommdbgError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace commdbg
