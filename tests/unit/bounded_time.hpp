// SPDX-License-Identifier: Apache-2.0
// Runs `f` on a thread of its own and waits at most `limit` for its answer,
// so a test of a bound in time fails, rather than hangs the suite, when the
// code under test does not finish.  An overrunning thread is left behind:
// `f` must own everything it uses (capture by value).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace commdbg::timing {

template <typename F>
auto finishes_within(std::chrono::seconds limit, F f) -> std::optional<decltype(f())> {
    using T = decltype(f());
    struct State {
        std::mutex m;
        std::condition_variable cv;
        std::optional<T> answer;
    };
    auto st = std::make_shared<State>();
    std::thread([st, f = std::move(f)]() mutable {
        T v = f();
        std::lock_guard lock(st->m);
        st->answer = std::move(v);
        st->cv.notify_all();
    }).detach();
    std::unique_lock lock(st->m);
    st->cv.wait_for(lock, limit, [&] { return st->answer.has_value(); });
    return st->answer;
}

// Generous: the patterns ran for over 60 s; linear ones take microseconds.
inline constexpr std::chrono::seconds kPatternTimeBound{10};

}  // namespace commdbg::timing
