// SPDX-License-Identifier: Apache-2.0
// commdbg hang: the job hangs — which rank, which collective, where.
//
//   commdbg hang PID... [--interval S] [--json F]   the ranks' pids or their launcher's
//   commdbg hang --from A.json B.json               reports written on several nodes
//
// Reads every thread's Python stack of each rank from outside, twice, and
// names the ranks the others wait for.  Nothing is attached, stopped or
// signalled.  Exit 3 when a culprit is named, 0 when the ranks are moving,
// 1 when they are stuck with no culprit (or it failed), 2 for usage errors.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "daemon_client.hpp"
#include "hang.hpp"

namespace commdbg::cli {

namespace {

struct HangOptions {
    std::vector<int> pids;
    std::vector<std::string> from;
    double interval = 1.0;
    std::string json_file;
    std::string socket;
};

int write_and_render(const hang::Report& r, const HangOptions& o) {
    if (o.json_file == "-") {
        std::cout << hang::to_json(r).dump(2) << "\n";
    } else if (!o.json_file.empty()) {
        auto target = host::check_output("--json", o.json_file);
        if (!target) {
            std::cerr << "commdbg: hang: " << target.error() << "\n";
            return 2;
        }
        host::write_output(*target, hang::to_json(r).dump(2) + "\n");
    }
    if (o.json_file != "-" && o.json_file != "/dev/stdout") hang::render_table(r, std::cout);
    return r.verdict.exit_code();
}

int hang_from(const HangOptions& o) {
    hang::Report all;
    for (const std::string& path : o.from) {
        std::ifstream in(path);
        if (!in) {
            std::cerr << "commdbg: hang --from: cannot read " << path << " — give files `commdbg hang --json F` wrote\n";
            return 2;
        }
        auto j = nlohmann::json::parse(in, nullptr, false);
        auto r = j.is_discarded() ? Result<hang::Report>::fail("not JSON") : hang::from_json(j);
        if (!r) {
            std::cerr << "commdbg: hang --from: " << path << ": " << r.error() << "\n";
            return 2;
        }
        all.interval_s = std::max(all.interval_s, r->interval_s);
        for (auto& s : r->ranks) all.ranks.push_back(std::move(s));
    }
    hang::decide(all);
    return write_and_render(all, o);
}

int run_hang(const HangOptions& o) {
    if (!o.from.empty()) {
        if (!o.pids.empty()) {
            std::cerr << "commdbg: hang: give PIDs or --from DUMPS, not both\n";
            return 2;
        }
        return hang_from(o);
    }
    if (o.pids.empty()) {
        std::cerr << "commdbg: hang: give the PIDs of the job's ranks or of their launcher, or --from DUMPS "
                     "(see --help)\n";
        return 2;
    }
    auto ranks = hang::find_ranks(o.pids);
    if (!ranks) {
        std::cerr << "commdbg: hang " << ranks.error() << "\n";
        return 2;
    }
    if (geteuid() != 0)
        std::cerr << "commdbg: hang: not root — the stacks of processes of other users cannot be read\n";
    // commdbgd's exact counts and flight recorder, asked at each look.
    bool answered = false;
    hang::CommCounts counts = [&o, &answered]() -> std::optional<nlohmann::json> {
        auto client = DaemonClient::connect(socket_path(o.socket));
        if (!client) return std::nullopt;
        auto reply = client->call({{"op", "counts"}, {"by_comm", true}, {"flight", true}});
        if (!reply) return std::nullopt;
        answered = true;
        return *reply;
    };
    hang::Report report = hang::examine(*ranks, o.interval, counts);
    if (!answered)
        std::cerr << "commdbg: hang: note: commdbgd does not answer at " << socket_path(o.socket)
                  << ": judged by stacks alone, with no collective numbers per communicator (start commdbgd, "
                     "or give --socket)\n";
    return write_and_render(report, o);
}

}  // namespace

void register_hang(CLI::App& app) {
    auto opts = std::make_shared<HangOptions>();
    CLI::App* sub = app.add_subcommand(
        "hang", "Which rank the others wait for, in which collective, and where each rank is: from outside, on a job "
                "that is already stuck; exit 3 when a culprit is named");
    sub->add_option("pids", opts->pids,
                    "The ranks' pids, or their launcher's (torchrun, mp.spawn): the processes under it that load "
                    "libtorch_cpu or libnccl are its ranks")
        ->check(CLI::PositiveNumber);
    sub->add_option("--from", opts->from,
                    "Merge reports written by `commdbg hang --json F` on several nodes and give one verdict")
        ->expected(1, -1);
    sub->add_option("-i,--interval", opts->interval, "Seconds between the two looks at each rank (default 1)")
        ->check(CLI::Range(0.05, 60.0));
    sub->add_option("--json", opts->json_file, "Write the report as JSON to FILE ('-': stdout, no table)");
    sub->add_option("--socket", opts->socket,
                    "commdbgd control socket (default $COMMDBG_SOCKET or /run/commdbg/commdbgd.sock): when it "
                    "answers, its exact counts per communicator say which rank is behind and at which collective");
    sub->footer("Each rank's threads and their Python stacks are read from the process's memory (root, or the "
                "ranks' owner), twice; a thread inside torch.distributed's collective function (all_reduce, ...) "
                "waits in that collective. When commdbgd answers, its flight recorder names the first collective "
                "number whose signature (kind, count, datatype) differs between ranks, and its exact counts per "
                "communicator a rank that issued fewer collectives than the others, with the number it never "
                "issued, or a collective that returned an error. Verdicts: missing_ranks (ranks never issued the "
                "collective the others wait in), collective_mismatch (signatures or kinds differ), "
                "collective_error (a rank's collective returned an error), below_host (all wait in the same one), "
                "progressing, stuck. Exit status: 3 when a culprit is named, 0 when the ranks are moving, 1 "
                "when they are stuck with no culprit, 2 for a usage error. The job is never stopped or signalled.");
    sub->callback([opts] { throw CommandDone(run_hang(*opts)); });
}

}  // namespace commdbg::cli
