// SPDX-License-Identifier: Apache-2.0
// tests/testprogs/hang_job.py, started and waited for until it hangs: 3 gloo
// ranks, rank 2 never reaches step `hang_at`'s all-reduce.
#pragma once

#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.hpp"

namespace commdbg::e2e {

using nlohmann::json;

inline const std::string kJob = std::string(SOURCE_DIR) + "/tests/testprogs/hang_job.py";

struct HungJob {
    std::unique_ptr<Background> job;
    int stuck_pid = 0;
    std::string stuck_function;
    std::vector<int> rank_pids;  // by rank
    std::vector<std::string> groups;  // by rank: torch's name of its default group
    int launcher_pid = 0;
    int hang_at = 0;             // the step the stuck rank never all-reduces (0-based)
    int numel = 0;               // the elements of each all-reduce's tensor
    std::string dtype;           // and its dtype, as torch names it ("float32")
    std::map<int, std::string> reduce_ops;  // torch's ReduceOp.RedOpType members: value -> name ("SUM")
    std::vector<std::string> ops;  // by rank: the ReduceOp name of its hang_at all-reduce ("SUM")
    std::vector<int> roots;        // by rank: the root of its hang_at broadcast (root_mismatch)
    // The stuck rank's number (its index in rank_pids); -1 before it said so.
    int stuck_rank() const {
        for (size_t i = 0; i < rank_pids.size(); ++i)
            if (rank_pids[i] == stuck_pid) return static_cast<int>(i);
        return -1;
    }
    // The ranks end first, so that the launcher (and trixie_run.sh, which
    // unmounts what it mounted) sees them die and ends by itself.
    ~HungJob() {
        for (int pid : rank_pids)
            if (pid > 0) kill(pid, SIGKILL);
        if (job) job->wait(60);
    }
};

// Starts the job and waits until it hangs: every rank up, the stuck one
// about to block, and `settle_s` for the others to enter the all-reduce.
inline void start_hung(HungJob& h, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                       int settle_s = 2) {
    h.job = std::make_unique<Background>(argv, env);
    h.rank_pids.assign(3, 0);
    h.groups.assign(3, "");
    h.ops.assign(3, "");
    h.roots.assign(3, -1);
    auto plan = json::parse(h.job->wait_for_line("\"mode\"", 120), nullptr, false);
    if (plan.is_discarded() || !plan.is_object()) return;
    h.launcher_pid = plan["pid"].get<int>();
    h.hang_at = plan["hang_at"].get<int>();
    h.numel = plan["numel"].get<int>();
    h.dtype = plan["dtype"].get<std::string>();
    const json ops = plan.value("reduce_ops", json::object());
    for (const auto& [value, name] : ops.items()) h.reduce_ops[std::stoi(value)] = name.get<std::string>();
    for (int i = 0; i < 3; ++i) {
        auto line = h.job->wait_for_line("{\"rank\": " + std::to_string(i) + ",", 120);
        if (line.empty()) return;
        auto j = json::parse(line, nullptr, false);
        if (j.is_discarded()) continue;
        h.rank_pids.at(j["rank"].get<int>()) = j["pid"].get<int>();
        h.groups.at(j["rank"].get<int>()) = j["group"].get<std::string>();
        h.ops.at(j["rank"].get<int>()) = j.value("op", "");
        h.roots.at(j["rank"].get<int>()) = j.value("root", -1);
    }
    auto stuck = json::parse(h.job->wait_for_line("\"stuck\"", 60), nullptr, false);
    if (stuck.is_discarded() || !stuck.is_object()) return;
    h.stuck_pid = stuck["pid"].get<int>();
    h.stuck_function = stuck["function"].get<std::string>();
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));
}

}  // namespace commdbg::e2e
