// SPDX-License-Identifier: Apache-2.0
// commdbg check: the FSDP lifecycle checks, made for CI.
//
//   commdbg check PID [--duration S]      trace a running job's process
//   commdbg check [--json F] -- CMD...    run a job traced from its start
//   commdbg check --from A.json B.json    check dumps gathered on several nodes
//
// Traces what the checks need (record_function scopes, c10d and NCCL
// collectives, Python stacks; no ATen ops), prints the verdict and exits 3
// when a violation was found (warnings do not fail), else with the
// command's status or 0.
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "commands.hpp"

namespace commdbg::cli {

namespace {

constexpr int kViolationsFound = 3;
// What the checks read: scopes carry the lifecycle, collectives the proof.
const std::vector<std::string> kCheckProbes = {"nccl", "torch-c10d", "torch-scopes"};

struct CheckOptions {
    std::vector<std::string> target;  // PID, or CMD ARGS... (after --)
    std::vector<std::string> from;
    std::vector<std::string> profile_files;
    std::vector<fsdp::Profile> profiles;
    double duration = 0;
    TraceCliOptions trace;
};

std::string no_lifecycle_note(const session::SessionOutput& out) {
    if (out.fsdp.processes > 0) return {};
    return "commdbg: check: no FSDP lifecycle seen — no traced process ran a record_function scope that a lifecycle "
           "profile knows (torch-fsdp2: FSDP::pre_forward, ...); is this an FSDP2 job on torch >= 2.4, and did the "
           "window cover a training step?\n";
}

// Renders, writes the files, prints the verdict; the exit status.
int finish_check(session::TraceSession& s, std::optional<int> wstatus, const TraceCliOptions& trace) {
    session::OutputWants wants{
        .table_color = false, .json = !trace.json_file.empty(), .trace = !trace.trace_file.empty()};
    session::SessionOutput out = render_session(s, trace.noise_level, wants);
    std::string verdict = out.fsdp.verdict;
    if (out.fsdp.processes > 0)
        verdict += fsdp::render_summary(out.fsdp.violations, out.fsdp.warnings, out.fsdp.processes);
    if (int rc = write_outputs(out, trace, &verdict); rc != 0) return rc;
    std::cerr << no_lifecycle_note(out);
    if (trace.cost) std::cerr << describe_cost(s.cost()) << describe_probe_hits(s.probe_hits());
    if (out.fsdp.violations > 0) return kViolationsFound;
    return wstatus ? exit_status(*wstatus) : 0;
}

struct DumpProcess {
    std::string name;
    fsdp::Findings report;
};

// Every process of every dump whose scopes a lifecycle profile recognises,
// in rank order where a communicator says the rank, into `out`; each dump
// read as it is parsed, keeping only what the checks use.  The exit status:
// 0, or 1 for a file that cannot be read, 2 for one that is no commdbg dump.
int checked_dumps(const std::vector<std::string>& files, const std::vector<fsdp::Profile>& profiles,
                  std::vector<DumpProcess>& out) {
    std::vector<std::pair<int, DumpProcess>> found;
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in) {
            std::cerr << "commdbg check: " << f << ": cannot read the file — check the path\n";
            return 1;
        }
        auto read = fsdp::read_dump(in, [&](fsdp::DumpedProcess&& p) {
            const fsdp::Profile* prof = fsdp::detect_profile(p.items, profiles);
            if (!prof) return;
            DumpProcess dp{f + (p.rank >= 0 ? " rank " + std::to_string(p.rank) : std::string()) + " (pid " +
                               std::to_string(p.pid) + ")",
                           fsdp::analyse(p.items, *prof,
                                              {.from_start = p.from_start, .records_lost = p.dropped_records,
                                               .process_ended = p.ended})};
            found.emplace_back(p.rank, std::move(dp));
        });
        if (!read) {
            std::cerr << "commdbg check: " << f << ": " << read.error()
                      << " — not a dump as commdbg writes it (`commdbg check --json F` writes one)\n";
            return 2;
        }
    }
    std::stable_sort(found.begin(), found.end(),
                     [](const auto& a, const auto& b) { return fsdp::rank_before(a.first, b.first); });
    for (auto& [rank, dp] : found) out.push_back(std::move(dp));
    return 0;
}

int check_from(const CheckOptions& o) {
    std::vector<DumpProcess> procs;
    if (int rc = checked_dumps(o.from, o.profiles, procs); rc != 0) return rc;
    if (procs.empty()) {
        std::cerr << "commdbg: check --from: no process in these dumps has FSDP lifecycle scopes — write the dumps "
                     "with `commdbg check --json F` (or --noise-level 2: scopes are level 2)\n";
        return 1;
    }
    std::vector<fsdp::RankView> views;
    size_t violations = 0, warnings = 0;
    nlohmann::ordered_json j = {{"processes", nlohmann::ordered_json::array()}};
    for (const auto& p : procs) {
        std::cout << "== " << p.name << " ==\n" << fsdp::render_section(p.report);
        views.push_back({p.name, &p.report});
        violations += p.report.violations.size();
        warnings += p.report.warnings.size();
        j["processes"].push_back({{"name", p.name}, {"fsdp", fsdp::to_json(p.report)}});
    }
    auto cross = fsdp::cross_rank(views);
    violations += cross.size();
    std::cout << fsdp::render_cross_rank(cross, procs.size());
    j["cross_rank"] = nlohmann::ordered_json::array();
    for (const auto& f : cross) j["cross_rank"].push_back(fsdp::to_json(f));
    std::cout << fsdp::render_summary(violations, warnings, procs.size());
    if (!o.trace.json_file.empty()) {
        try {
            write_output(o.trace.targets.front(), j.dump(2) + "\n");
        } catch (const std::exception& e) {
            std::cerr << "commdbg: check: writing " << o.trace.json_file << ": " << e.what() << "\n";
            return 1;
        }
    }
    return violations ? kViolationsFound : 0;
}

bool all_digits(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

int run_check(CheckOptions& o) {
    for (const auto& f : o.profile_files) {
        auto p = fsdp::load_profile(f);
        if (!p) {
            std::cerr << "commdbg: check: " << p.error() << "\n";
            return 2;
        }
        o.profiles.push_back(std::move(p.value()));
    }
    if (!o.from.empty()) {
        if (!o.target.empty()) {
            std::cerr << "commdbg: check: --from reads dumps; give no PID or command with it\n";
            return 2;
        }
        if (o.trace.table_opt->count() || o.trace.trace_opt->count()) {
            std::cerr << "commdbg: check --from: only --json applies (the verdict is printed)\n";
            return 2;
        }
        return check_trace_outputs(o.trace) ? check_from(o) : 2;
    }
    if (o.target.empty()) {
        std::cerr << "commdbg: check: give a PID, a command after --, or --from DUMPS (see --help)\n";
        return 2;
    }
    if (o.trace.counts_only) {
        std::cerr << "commdbg: check: --counts-only has no scopes to check; drop it\n";
        return 2;
    }
    if (o.trace.probes.empty()) o.trace.probes = kCheckProbes;
    o.trace.lifecycle_profiles = o.profiles;
    auto finish = [&](session::TraceSession& s, std::optional<int> w) { return finish_check(s, w, o.trace); };
    if (o.target.size() == 1 && all_digits(o.target[0])) {
        auto tgid = attach_target(std::stoi(o.target[0]), "check");
        if (!tgid) return 1;
        if (!check_trace_outputs(o.trace)) return 2;
        return attach_in_process("check", *tgid, o.duration, /*follow=*/true, o.trace, finish);
    }
    if (o.duration > 0) {
        std::cerr << "commdbg: check: --duration applies to a PID; a command is traced until it exits\n";
        return 2;
    }
    return trace_command("check", o.target, o.trace, finish);
}

}  // namespace

void register_check(CLI::App& app) {
    auto opts = std::make_shared<CheckOptions>();
    CLI::App* sub = app.add_subcommand(
        "check",
        "Run the FSDP lifecycle checks on a running process (PID), a command (-- CMD...) or JSON dumps (--from); "
        "exit 3 when a violation was found");
    sub->add_option("target", opts->target, "PID to attach to, or the command to run (after --)");
    sub->add_option("--from", opts->from,
                    "Check JSON dumps written elsewhere (`commdbg check --json F` on each node): the per-rank "
                    "checks on each, and the cross-rank check over all")
        ->expected(1, -1);
    sub->add_option("-d,--duration", opts->duration, "With a PID: seconds to trace (default: until Ctrl-C or it exits)")
        ->check(duration_seconds());
    sub->add_option("--profile", opts->profile_files,
                    "A lifecycle profile (JSON, the format of specs/lifecycle/torch-fsdp2.json) tried before the "
                    "built-in ones: another framework's labels");
    add_trace_options(sub, opts->trace);
    // Scopes are level 2: a dump written by check can be checked again (--from).
    opts->trace.noise_level = 2;
    // Not positionals_at_end: options may follow a PID (`check 4242 --json F`);
    // a command's own options come after `--`.
    sub->footer("The JSON dump is written at --noise-level 2 unless given; default probes: nccl, torch-c10d, "
                "torch-scopes. Exit status: 3 when a violation was found, else the command's status (or 0); "
                "warnings do not fail; 2 for a usage error or a --from dump that is not as commdbg writes it "
                "(the message names the file and the field).");
    sub->callback([opts] { throw CommandDone(run_check(*opts)); });
}

}  // namespace commdbg::cli
