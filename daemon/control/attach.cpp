// SPDX-License-Identifier: Apache-2.0
#include "attach.hpp"

namespace commdbg::daemon {

namespace {

using Clock = std::chrono::steady_clock;

session::SessionOptions session_options(const protocol::Request& req, const protocol::PeerCred& peer) {
    session::SessionOptions so;
    so.owner_uid = peer.uid;
    so.owner_gid = peer.gid;
    so.limits.max_records = req.max_records;
    so.limits.max_depth = req.max_depth;
    so.probes = req.probes;
    so.records = !req.counts_only;
    so.stack_args = req.stack_args;
    so.ringbuf_bytes = req.ringbuf_kb * 1024;
    so.py_stack = req.py_stack;
    so.py_depth = req.py_depth;
    so.view_noise_level = req.want_trace ? 3 : req.noise_level;
    return so;
}

}  // namespace

nlohmann::json AttachSessions::list(std::optional<uint32_t> only_uid) {
    nlohmann::json list = nlohmann::json::array();
    std::lock_guard lock(mu_);
    for (const auto& [id, s] : sessions_) {
        if (only_uid && s->owner_uid != *only_uid) continue;
        list.push_back({{"id", id},
                        {"pid", s->pid},
                        {"uid", s->owner_uid},
                        {"state", s->state},
                        {"duration_s", s->duration_s},
                        {"running_s", std::chrono::duration<double>(Clock::now() - s->started).count()}});
    }
    return list;
}

bool AttachSessions::detach(uint64_t id, std::optional<uint32_t> only_uid) {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || (only_uid && it->second->owner_uid != *only_uid)) return false;
    it->second->stop = true;
    return true;
}

Result<uint64_t> AttachSessions::take_slot(const std::shared_ptr<ActiveSession>& session, const std::string& who) {
    using R = Result<uint64_t>;
    const uint32_t uid = session->owner_uid;
    const std::string what_to_do = " — wait for one to end or end one (`commdbg sessions`, `commdbg detach ID`)";
    std::lock_guard lock(mu_);
    size_t mine = 0;
    for (const auto& [id, s] : sessions_) mine += s->owner_uid == uid;
    // Another user sees and ends only its own sessions: say how many those are.
    const std::string yours =
        uid == 0 ? std::string() : " (" + std::to_string(mine) + " of them yours; root sees and ends all)";
    if (session_slots_ >= max_sessions_)
        return R::fail(who + ": commdbgd already runs " + std::to_string(max_sessions_) +
                       " tracing sessions, its limit" + yours + what_to_do +
                       ", or trace with `commdbg attach --no-daemon`; commdbgd --max-sessions raises "
                       "the limit");
    if (uid != 0) {
        const size_t per_uid = protocol::kUnprivilegedLimits.sessions_per_uid;
        if (mine >= per_uid)
            return R::fail(who + ": uid " + std::to_string(uid) + " already runs " + std::to_string(mine) +
                           " tracing sessions in commdbgd, the most one user "
                           "other than root may run" + what_to_do + ", or ask root");
        // The last slot stays free for root, who can then see and end the others.
        if (max_sessions_ > 1 && session_slots_ + 1 >= max_sessions_)
            return R::fail(who + ": commdbgd runs " + std::to_string(session_slots_) + " of its " +
                           std::to_string(max_sessions_) +
                           " tracing sessions and keeps the last one for root" + yours + what_to_do +
                           ", or ask root");
    }
    ++session_slots_;
    session->id = next_session_++;
    sessions_[session->id] = session;
    return session->id;
}

void AttachSessions::release_slot(uint64_t id) {
    std::lock_guard lock(mu_);
    sessions_.erase(id);
    --session_slots_;
}

void AttachSessions::set_state(ActiveSession& session, const char* state) {
    std::lock_guard lock(mu_);
    session.state = state;
}

Result<bool> AttachSessions::attach(const protocol::Request& req, const protocol::PeerCred& peer, Connection& client) {
    using R = Result<bool>;
    const std::string who = "attach " + std::to_string(*req.pid);
    // Users other than root may not size the root daemon's memory or hold it
    // for long (UnprivilegedLimits).
    if (auto problem = unprivileged_problem(req, peer.uid)) return R::fail(who + ": " + *problem);
    auto session = std::make_shared<ActiveSession>();
    session->owner_uid = peer.uid;
    session->pid = *req.pid;
    session->duration_s = session_window_s(req, peer.uid);
    session->started = Clock::now();
    // A slot first: a session holds BPF maps, a ring buffer, its model (up to
    // its record budget) and then its outputs.  It is listed from now on.
    auto slot = take_slot(session, who);
    if (!slot) return R::fail(slot.error());
    struct SlotRelease {
        AttachSessions* s;
        uint64_t id;
        ~SlotRelease() { s->release_slot(id); }
    } release{this, *slot};
    auto opts = session_options(req, peer);
    opts.attach_to(*req.pid, req.follow);
    auto created = session::TraceSession::create(opts);
    if (!created) return R::fail(who + ": " + created.error());
    // Children forked during the window are traced as with --no-daemon;
    // never stopped at a loader change (its parent may be a shell).
    if (auto r = created.value()->add_process(*req.pid, req.follow, false); !r)
        return R::fail(who + ": " + r.error());
    set_state(*session, "tracing");
    trace_and_send(req, peer, client, *session, std::move(created.value()));
    return true;  // all sent, or the client is gone
}

void AttachSessions::trace_and_send(const protocol::Request& req, const protocol::PeerCred& peer, Connection& client,
                                    ActiveSession& session, std::unique_ptr<session::TraceSession> ts) {
    // First line: the session is running (the client may detach it by id)
    // and the most it runs.
    nlohmann::json first = {{"session", session.id},
                            {"state", "tracing"},
                            {"target", session::describe_pid(*req.pid)},
                            {"library_files", ts->attached_files().size()},
                            {"duration_s", session.duration_s}};
    if (session.duration_s != req.duration_s) first["window_limited_for_uid"] = peer.uid;
    if (!client.send(protocol::ok_response(std::move(first)))) return;
    // A client that hangs up ends its session too.
    auto stop = [&] { return session.stop || stopping_ || client.hung_up(); };
    const auto window_start = Clock::now();
    bool exited = run_attach_window(*ts, *req.pid, session.duration_s, stop);
    const double traced_s = std::chrono::duration<double>(Clock::now() - window_start).count();
    // Ended by the daemon's shutdown, not by the window, the process, a
    // detach or the client: the client must say so.
    const bool cut_short =
        stopping_ && !exited && !session.stop && (session.duration_s == 0 || traced_s < session.duration_s);
    set_state(session, "sending");
    session::SessionOutput out = render_session(
        *ts, req.noise_level, {.table_color = req.want_table_color, .json = req.want_json, .trace = req.want_trace});
    if (exited) out.messages.push_back("pid " + std::to_string(*req.pid) + " exited; report covers its life since attach");
    // The probes, maps and model go now: only the outputs are left to send.
    ts.reset();
    nlohmann::json last = {{"session", session.id}, {"state", "done"}, {"traced_s", traced_s}};
    if (cut_short) last["cut_short"] = "commdbgd is stopping";
    send_outputs(client, std::move(last), out);
}

void AttachSessions::send_outputs(Connection& client, nlohmann::json last, session::SessionOutput& out) {
    // The outputs follow the last line as raw bytes, in the order "payload"
    // lists them: as JSON strings they would be escaped into one more copy of
    // tens of MB each, and parsed back into another at the client.
    const auto parts = named_outputs(out);
    nlohmann::json payload = nlohmann::json::array();
    for (const auto& [name, text] : parts) payload.push_back({{"name", name}, {"bytes", text->size()}});
    last["messages"] = out.messages;
    last["payload"] = std::move(payload);
    // A send gives up when the client stops reading (Connection::send): a
    // client that stopped reading ends its session here and frees the slot.
    if (!client.send(protocol::ok_response(std::move(last)))) return;
    for (const auto& [name, text] : parts) {
        if (!client.send(*text)) break;
        std::string().swap(*text);
    }
}

}  // namespace commdbg::daemon
