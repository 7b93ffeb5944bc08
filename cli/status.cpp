// SPDX-License-Identifier: Apache-2.0
// commdbg status | counts | sessions | detach: questions for commdbgd.
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "commands.hpp"
#include "daemon_client.hpp"

namespace commdbg::cli {

namespace {

struct DaemonOptions {
    std::string socket;
    bool json = false;
    int pid = 0;
    bool by_comm = false;
    std::string id;  // checked here: CLI11's range check would print a 309-digit bound
};

// A session id as `commdbg sessions` prints it: an integer >= 1.
std::optional<uint64_t> session_id(const std::string& s) {
    if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    errno = 0;
    unsigned long long v = strtoull(s.c_str(), nullptr, 10);
    if (errno != 0 || v == 0) return std::nullopt;
    return v;
}

Result<nlohmann::json> ask(const DaemonOptions& o, const nlohmann::json& req) {
    std::string path = socket_path(o.socket);
    auto client = DaemonClient::connect(path);
    if (!client)
        return Result<nlohmann::json>::fail("no commdbgd answers at " + path +
                                            " — start it (systemctl start commdbgd) or give --socket");
    return client->call(req);
}

int print_status(const nlohmann::json& j) {
    std::cout << "commdbgd " << j.value("version", "?") << " on " << j.value("host", "?") << ", up "
              << static_cast<long>(j.value("uptime_s", 0.0)) << " s"
              << (j.value("scope_cgroup", "").empty() ? "" : ", scope " + j.value("scope_cgroup", "")) << "\n"
              << "processes counted: " << j.value("processes", 0) << "\n"
              << "events: " << j.value("events", 0) << ", resumed after a new library: "
              << j.value("resumed_after_new_library", 0) << "\n"
              << "series exported: " << j.value("series", 0) << " (overflow " << j.value("series_overflow", 0) << ")\n";
    if (j.contains("unprivileged_limits")) {
        const nlohmann::json l = j["unprivileged_limits"];
        std::cout << "tracing sessions at once: " << j.value("max_sessions", 0) << "; users other than root: "
                  << l.value("sessions_per_uid", 0) << " sessions each, --ringbuf-kb <= " << l.value("ringbuf_kb", 0)
                  << ", --max-records <= " << l.value("max_records", 0) << ", --duration <= "
                  << limits::format_seconds(l.value("duration_s", 0.0)) << " (also without -d), "
                  << l.value("connections_per_uid", 0) << " connections each"
                  << (l.value("probe_files", true) ? "" : ", built-in --probes only") << "\n";
    }
    std::cout << "library files attached:\n";
    const nlohmann::json files = j.value("library_files", nlohmann::json::array());
    for (const auto& f : files)
        std::cout << "  " << f.value("spec", "") << "  " << f.value("path", "") << "  (" << f.value("probes", 0)
                  << " probes)\n";
    std::cout << "drops by cause:";
    const nlohmann::json drops = j.value("drops", nlohmann::json::object());
    for (const auto& [k, v] : drops.items()) std::cout << " " << k << "=" << v;
    std::cout << "\n";
    return 0;
}

int print_counts(const nlohmann::json& j) {
    if (j.contains("note")) std::cerr << "commdbg: counts: note: " << j.value("note", "") << "\n";
    // (Locals: a range-for over .items() of a temporary would dangle.)
    const nlohmann::json procs = j.value("processes", nlohmann::json::array());
    for (const auto& p : procs) {
        std::cout << "pid " << p.value("pid", 0) << "  " << p.value("command", "") << "\n";
        const nlohmann::json env = p.value("env", nlohmann::json::object());
        for (const auto& [k, v] : env.items()) std::cout << "  " << k << "=" << v.get<std::string>() << "\n";
        const nlohmann::json counts = p.value("comm_counts", nlohmann::json::object());
        for (const auto& [k, v] : counts.items())
            std::cout << "  " << k << " calls=" << v << " bytes=" << p["comm_bytes"].value(k, 0ull) << "\n";
    }
    if (j.contains("communicators")) {
        std::cout << "communicators (calls per rank seen on " << j.value("host", "this node") << "):\n";
        for (const auto& c : j["communicators"]) {
            std::cout << "  " << c.value("comm_id", "") << " nranks=" << c.value("nranks", -1) << "\n";
            const nlohmann::json ranks = c.value("ranks", nlohmann::json::array());
            for (const auto& r : ranks)
                std::cout << "    rank " << r.value("rank", -1) << " pid " << r.value("pid", 0) << " calls "
                          << r.value("calls", 0) << "\n";
        }
    }
    return 0;
}

CLI::App* daemon_command(CLI::App& app, const char* name, const char* help, std::shared_ptr<DaemonOptions> o) {
    CLI::App* sub = app.add_subcommand(name, help);
    sub->add_option("--socket", o->socket, "commdbgd control socket (default $COMMDBG_SOCKET or /run/commdbg/commdbgd.sock)");
    return sub;
}

void run(const char* what, const DaemonOptions& o, const nlohmann::json& req,
         const std::function<int(const nlohmann::json&)>& print) {
    auto r = ask(o, req);
    if (!r) {
        // The daemon's errors may name the request themselves ("detach 5: ..."): once is enough.
        const std::string& e = r.error();
        const bool named = e.rfind(std::string(what) + " ", 0) == 0 || e.rfind(std::string(what) + ":", 0) == 0;
        std::cerr << "commdbg: " << (named ? "" : std::string(what) + ": ") << e << "\n";
        throw CommandDone{1};
    }
    r->erase("ok");
    if (o.json) {
        std::cout << r->dump(2) << "\n";
        throw CommandDone{0};
    }
    throw CommandDone{print(*r)};
}

}  // namespace

void register_daemon_commands(CLI::App& app) {
    auto o = std::make_shared<DaemonOptions>();
    CLI::App* status = daemon_command(app, "status", "commdbgd: version, uptime, processes, library files, drops", o);
    status->add_flag("--json", o->json, "Print the reply as JSON");
    status->callback([o] { run("status", *o, {{"op", "status"}}, print_status); });

    CLI::App* counts = daemon_command(app, "counts", "commdbgd: exact collective counts per process", o);
    counts->add_option("--pid", o->pid, "Only this process (a thread id: its process)")->check(process_id());
    counts->add_flag("--by-comm", o->by_comm, "Per communicator id, the calls of each rank seen on this node");
    counts->add_flag("--json", o->json, "Print the reply as JSON");
    counts->callback([o] {
        nlohmann::json req = {{"op", "counts"}, {"by_comm", o->by_comm}};
        if (o->pid) req["pid"] = o->pid;
        run("counts", *o, req, print_counts);
    });

    CLI::App* sessions = daemon_command(app, "sessions", "commdbgd: tracing sessions running now", o);
    sessions->add_flag("--json", o->json, "Print the reply as JSON");
    sessions->callback([o] {
        run("sessions", *o, {{"op", "sessions"}}, [](const nlohmann::json& j) {
            const nlohmann::json list = j.value("sessions", nlohmann::json::array());
            for (const auto& s : list)
                std::cout << "session " << s.value("id", 0) << "  pid " << s.value("pid", 0) << "  uid "
                          << s.value("uid", 0) << "  " << s.value("state", "tracing") << " "
                          << static_cast<long>(s.value("running_s", 0.0)) << " s"
                          << (s.value("duration_s", 0.0) > 0
                                  ? " of " + limits::format_seconds(s.value("duration_s", 0.0))
                                  : std::string(" (until detached or the process exits)"))
                          << "\n";
            return 0;
        });
    });

    CLI::App* detach = daemon_command(app, "detach", "commdbgd: end a tracing session now (its client prints what it saw)", o);
    detach->add_option("id", o->id, "Session id (see `commdbg sessions`)")->required();
    detach->callback([o] {
        auto id = session_id(o->id);
        if (!id) {
            std::cerr << "commdbg: detach " << o->id.substr(0, 32)
                      << ": not a session id — ids are integers from 1 up, as `commdbg sessions` lists them\n";
            throw CommandDone{2};
        }
        run("detach", *o, {{"op", "detach"}, {"id", *id}}, [](const nlohmann::json& j) {
            std::cout << "detached session " << j.value("detached", 0) << "\n";
            return 0;
        });
    });
}

}  // namespace commdbg::cli
