// SPDX-License-Identifier: Apache-2.0
#include "session_output.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>

#include "render.hpp"

namespace commdbg::session {

std::array<std::pair<const char*, std::string*>, 4> named_outputs(SessionOutput& o) {
    return {{{"table", &o.table}, {"table_color", &o.table_color}, {"json", &o.json}, {"trace", &o.trace}}};
}

namespace {

int rank_of(const snapshot::ProcessSnapshot& r) {
    for (const snapshot::CommInfo& c : r.comms)
        if (c.rank >= 0) return c.rank;
    return -1;
}

// The verdict of the lifecycle checks: each process's section, then across ranks.
void fsdp_verdict(const std::vector<snapshot::ProcessSnapshot>& reports, const std::vector<fsdp::Finding>& cross,
                  SessionOutput::Fsdp& out) {
    for (const auto* r : output::render_parts::by_pid(reports)) {
        if (!r->fsdp) continue;
        ++out.processes;
        out.violations += r->fsdp->violations.size();
        out.warnings += r->fsdp->warnings.size();
        out.verdict +=
            "== pid " + std::to_string(r->pid) + ": " + r->command + " ==\n" + fsdp::render_section(*r->fsdp);
    }
    out.violations += cross.size();
    out.verdict += fsdp::render_cross_rank(cross, out.processes);
}

}  // namespace

std::vector<fsdp::Finding> fsdp_cross_rank(const std::vector<snapshot::ProcessSnapshot>& reports) {
    std::vector<const snapshot::ProcessSnapshot*> ranks;
    for (const auto* r : output::render_parts::by_pid(reports))
        if (r->fsdp && !r->fsdp->empty()) ranks.push_back(r);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [](const auto* a, const auto* b) { return fsdp::rank_before(rank_of(*a), rank_of(*b)); });
    std::vector<fsdp::RankView> views;
    for (const auto* r : ranks)
        views.push_back({fsdp::rank_view_name(rank_of(*r), "pid " + std::to_string(r->pid)), &*r->fsdp});
    return fsdp::cross_rank(views);
}

SessionOutput render_session(TraceSession& s, int noise_level, const OutputWants& wants) {
    SessionOutput out;
    for (auto& m : s.take_messages()) out.messages.push_back("note: " + m);
    if (s.decode_errors())
        out.messages.push_back("warning: " + std::to_string(s.decode_errors()) + " malformed records were discarded");
    // Kernel-side losses by cause (session-wide): never silent.
    nlohmann::ordered_json kernel_drops = nlohmann::ordered_json::object();
    auto drops = s.kernel_drops();
    for (uint32_t i = 0; i < drops.size(); ++i)
        if (drops[i]) kernel_drops[capture::drop_cause_name(i)] = drops[i];
    if (!kernel_drops.empty())
        out.messages.push_back("warning: kernel-side losses by cause: " + kernel_drops.dump() +
                               " (counters stay exact; a larger --ringbuf-kb keeps more records)");
    auto reports = s.reports();
    const auto& syms = s.symbols();
    for (const auto& r : reports) {
        std::string head = reports.size() > 1 ? "== pid " + std::to_string(r.pid) + ": " + r.command + " ==\n" : "";
        std::string tail = reports.size() > 1 ? "\n" : "";
        out.table += head + output::render_table(r, syms, noise_level, false) + tail;
        if (wants.table_color) out.table_color += head + output::render_table(r, syms, noise_level, true) + tail;
    }
    const auto cross = fsdp_cross_rank(reports);
    fsdp_verdict(reports, cross, out.fsdp);
    if (!cross.empty()) {
        std::string section = fsdp::render_cross_rank(cross, out.fsdp.processes);
        out.table += section;
        if (wants.table_color) out.table_color += section;
    }
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    if (!kernel_drops.empty()) extra["kernel_drops"] = kernel_drops;
    if (out.fsdp.processes > 1) {
        nlohmann::ordered_json c = nlohmann::ordered_json::array();
        for (const auto& f : cross) c.push_back(fsdp::to_json(f));
        extra["cross_rank"] = std::move(c);
    }
    if (wants.json) out.json = output::to_json_text(reports, syms, noise_level, extra) + "\n";
    if (wants.trace) out.trace = output::chrome_trace_text(reports, syms) + "\n";
    return out;
}

bool run_attach_window(TraceSession& s, int pid, double duration_s, const std::function<bool()>& stop) {
    using clock = std::chrono::steady_clock;
    auto deadline = clock::now() + std::chrono::milliseconds(static_cast<long>(std::llround(duration_s * 1000)));
    auto gone = [&] { return s.exited(pid) || (kill(pid, 0) != 0 && errno == ESRCH); };
    while (!stop()) {
        int wait_ms = 100;
        if (duration_s > 0) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
            if (left <= 0) break;
            wait_ms = static_cast<int>(std::min<long>(left, 100));
        }
        s.poll(wait_ms);
        if (gone()) break;
    }
    s.drain();
    return gone();
}

}  // namespace commdbg::session
