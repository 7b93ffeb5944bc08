// SPDX-License-Identifier: Apache-2.0
#include "hang.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <thread>

#include "procfs.hpp"
#include "py_objects.hpp"
#include "py_threads.hpp"
#include "python_runtime.hpp"

namespace commdbg::hang {

namespace {

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}


// A process that can run collectives: it maps torch's CPU library or NCCL.
bool loads_collectives(int pid, const std::string& proc_root) {
    auto maps = host::read_maps(pid, proc_root);
    if (!maps) return false;
    return std::any_of(maps->begin(), maps->end(), [](const host::MapEntry& m) {
        std::string_view base = host::basename_of(m.path);
        return base.rfind("libtorch_cpu.so", 0) == 0 || host::is_libnccl_path(m.path);
    });
}

// "train.py:42"
std::string location(const Frame& f) {
    return (f.file.empty() ? std::string("?") : f.file) + (f.line ? ":" + std::to_string(f.line) : std::string());
}

// "step at train.py:42"
std::string frame_text(const Frame& f) { return f.function + " at " + location(f); }

// The innermost frame of `stack` from `from` outward that is the job's own
// (not the interpreter's, torch's or an installed package's), else stack[from].
Frame callers_frame(const std::vector<Frame>& stack, size_t from) {
    for (size_t i = from; i < stack.size(); ++i)
        if (!stack[i].library) return stack[i];
    return stack[from];
}

// The parts of a signature a rank's recorder may have left unread: a c10d
// call made before commdbgd could read its process's tensors and options
// has a kind only.
constexpr size_t kSignatureParts = 4;  // count, dtype, op, root

std::optional<std::string> part(const Issued& e, size_t i) {
    switch (i) {
    case 0: return e.count ? std::optional(std::to_string(*e.count)) : std::nullopt;
    case 1: return e.dtype.empty() ? std::nullopt : std::optional(e.dtype);
    case 2: return e.op.empty() ? std::nullopt : std::optional(e.op);
    default: return e.root < 0 ? std::nullopt : std::optional(std::to_string(e.root));
    }
}

void forget_part(Issued& e, size_t i) {
    switch (i) {
    case 0: e.count.reset(); break;
    case 1: e.dtype.clear(); break;
    case 2: e.op.clear(); break;
    default: e.root = -1;
    }
}

// What the ranks' calls of one kind at one number hold in each part: the
// values read, and whether some rank left it unread.
struct PartsSeen {
    std::array<std::set<std::string>, kSignatureParts> values;
    std::array<bool, kSignatureParts> unread{};
    void add(const Issued& e) {
        for (size_t i = 0; i < kSignatureParts; ++i)
            if (auto v = part(e, i)) values[i].insert(*v);
            else unread[i] = true;
    }
    // A part some rank left unread and the others agree on: no rank's
    // signature shows it.
    bool forgotten(size_t i) const { return unread[i] && values[i].size() == 1; }
    // A rank that left unread a part the others differ in: it cannot be
    // said to be the odd one.
    bool undecided(const Issued& e) const {
        for (size_t i = 0; i < kSignatureParts; ++i)
            if (!part(e, i) && values[i].size() > 1) return true;
        return false;
    }
};

}  // namespace

std::string Issued::signature() const {
    return collective + (count ? " count " + std::to_string(*count) : "") + (dtype.empty() ? "" : " " + dtype) +
           (op.empty() ? "" : " " + op) + (root < 0 ? "" : " root " + std::to_string(root));
}

bool Issued::failed() const { return !status.empty() && !in_call() && status != "ncclSuccess"; }

nlohmann::json Issued::to_json() const {
    nlohmann::json j = {{"seq", seq}, {"collective", collective}};
    if (count) j["count"] = *count;
    if (!dtype.empty()) j["dtype"] = dtype;
    if (!op.empty()) j["op"] = op;
    if (root >= 0) j["root"] = root;
    if (!status.empty()) j["status"] = status;
    return j;
}

Issued Issued::from_json(const nlohmann::json& e) {
    if (!e.is_object()) return {};
    std::optional<uint64_t> count;
    if (e.contains("count") && e["count"].is_number_unsigned()) count = e["count"].get<uint64_t>();
    return {e.value("seq", uint64_t{0}), e.value("collective", ""), count,
            e.value("dtype", ""),        e.value("op", ""),         e.value("root", int64_t{-1}),
            e.value("status", "")};
}

std::vector<Divergence> divergences(const std::vector<RankIssued>& ranks) {
    // A part one rank's recorder could not read differs from none: it is
    // compared among the ranks that read it (a kind that differs still differs).
    std::map<std::pair<uint64_t, std::string>, PartsSeen> seen;  // (seq, kind) -> its parts
    for (const RankIssued& r : ranks)
        for (const Issued& e : *r.last) seen[{e.seq, e.collective}].add(e);
    std::map<uint64_t, std::map<std::string, std::vector<int>>> at;  // seq -> signature -> who
    std::map<uint64_t, std::set<int>> undecided;                      // seq -> who
    for (const RankIssued& r : ranks)
        for (const Issued& e : *r.last) {
            const PartsSeen& parts = seen[{e.seq, e.collective}];
            Issued x = e;
            for (size_t i = 0; i < kSignatureParts; ++i)
                if (parts.forgotten(i)) forget_part(x, i);
            at[e.seq][x.signature()].push_back(r.who);
            if (parts.undecided(e)) undecided[e.seq].insert(r.who);
        }
    std::vector<Divergence> out;
    for (const auto& [seq, sigs] : at) {
        if (sigs.size() < 2) continue;
        Divergence d{seq, {}, {}};
        // The signature most ranks that read every differing part issued.
        const std::set<int>& unsure = undecided[seq];
        auto decided = [&](const std::vector<int>& who) {
            return std::count_if(who.begin(), who.end(), [&](int pid) { return !unsure.count(pid); });
        };
        auto most = std::max_element(sigs.begin(), sigs.end(),
                                     [&](const auto& a, const auto& b) { return decided(a.second) < decided(b.second); });
        for (const auto& [sig, who] : sigs) {
            d.signatures.emplace_back(sig, who);
            if (sig == most->first) continue;
            for (int pid : who)
                if (!unsure.count(pid)) d.odd.push_back(pid);
        }
        // The most ranks' signature first: the odd ones read against it.
        std::stable_sort(d.signatures.begin(), d.signatures.end(),
                         [&](const auto& a, const auto& b) { return decided(a.second) > decided(b.second); });
        out.push_back(std::move(d));
    }
    return out;
}

std::string RankSample::name() const {
    if (!rank.empty()) return "rank " + rank + " (pid " + std::to_string(pid) + ")";
    return "pid " + std::to_string(pid);
}

std::string_view to_string(Verdict::Kind k) {
    switch (k) {
    case Verdict::Kind::missing: return "missing_ranks";
    case Verdict::Kind::mismatch: return "collective_mismatch";
    case Verdict::Kind::failed: return "collective_error";
    case Verdict::Kind::below_host: return "below_host";
    case Verdict::Kind::progressing: return "progressing";
    case Verdict::Kind::stuck: return "stuck";
    }
    return "?";
}

int Verdict::exit_code() const {
    switch (kind) {
    case Kind::missing:
    case Kind::mismatch:
    case Kind::failed: return 3;
    case Kind::progressing: return 0;
    default: return 1;
    }
}

std::optional<std::string> collective_of_api(std::string_view f) {
    // torch/distributed/distributed_c10d.py's collectives (torch 1.13 .. 2.6).
    static const std::map<std::string_view, std::string_view> kApi = {
        {"all_reduce", "all_reduce"},
        {"all_reduce_coalesced", "all_reduce"},
        {"all_reduce_multigpu", "all_reduce"},
        {"all_gather", "all_gather"},
        {"all_gather_into_tensor", "all_gather"},
        {"_all_gather_base", "all_gather"},
        {"all_gather_coalesced", "all_gather"},
        {"all_gather_object", "all_gather"},
        {"all_gather_multigpu", "all_gather"},
        {"reduce_scatter", "reduce_scatter"},
        {"reduce_scatter_tensor", "reduce_scatter"},
        {"_reduce_scatter_base", "reduce_scatter"},
        {"reduce_scatter_multigpu", "reduce_scatter"},
        {"broadcast", "broadcast"},
        {"broadcast_object_list", "broadcast"},
        {"broadcast_multigpu", "broadcast"},
        {"reduce", "reduce"},
        {"reduce_multigpu", "reduce"},
        {"all_to_all", "all_to_all"},
        {"all_to_all_single", "all_to_all"},
        {"gather", "gather"},
        {"gather_object", "gather"},
        {"scatter", "scatter"},
        {"scatter_object_list", "scatter"},
        {"barrier", "barrier"},
        {"monitored_barrier", "barrier"},
        {"send", "send"},
        {"recv", "recv"},
        {"isend", "send"},
        {"irecv", "recv"},
        {"batch_isend_irecv", "send_recv"},
    };
    auto it = kApi.find(f);
    if (it == kApi.end()) return std::nullopt;
    return std::string(it->second);
}

Result<std::vector<int>> find_ranks(const std::vector<int>& pids, const std::string& proc_root) {
    using R = Result<std::vector<int>>;
    std::map<int, std::vector<int>> children;
    for (int p : host::numeric_entries(proc_root)) {
        auto st = host::read_stat(p, proc_root);
        if (st && !st->kernel_thread()) children[st->ppid].push_back(p);
    }
    std::set<int> out;
    for (int pid : pids) {
        if (auto st = host::read_stat(pid, proc_root); !st) return R::fail(std::to_string(pid) + ": " + st.error());
        // Depth first; a process is a rank when it loads the libraries and
        // no process below it does.
        std::set<int> found;
        std::function<bool(int, int)> visit = [&](int p, int depth) {
            bool below = false;
            if (depth < 64)
                for (int c : children[p]) below |= visit(c, depth + 1);
            if (below) return true;
            if (loads_collectives(p, proc_root)) {
                found.insert(p);
                return true;
            }
            return false;
        };
        visit(pid, 0);
        if (found.empty())
            return R::fail(std::to_string(pid) + ": neither it nor a process it started loads libtorch_cpu or "
                                                 "libnccl — give the pids of the job's ranks, or of their launcher");
        out.insert(found.begin(), found.end());
    }
    return std::vector<int>(out.begin(), out.end());
}

RankSample sample_rank(int pid, const std::string& proc_root) {
    RankSample r;
    r.pid = pid;
    auto info = host::read_process(pid, proc_root);
    if (!info || info->state == 'Z') {
        r.exited = true;
        r.python_note = info ? "the process has exited (a zombie)" : info.error();
        return r;
    }
    r.command = info->cmdline;
    auto env = host::read_environ(pid, {"RANK", "LOCAL_RANK"}, proc_root);
    if (auto it = env.find("RANK"); it != env.end()) r.rank = it->second;
    if (auto it = env.find("LOCAL_RANK"); it != env.end()) r.local_rank = it->second;

    std::map<uint32_t, ThreadSample> threads;
    for (int tid : host::numeric_entries(proc_root + "/" + std::to_string(pid) + "/task")) {
        ThreadSample t;
        t.tid = static_cast<uint32_t>(tid);
        t.name = host::read_thread_name(pid, tid, proc_root);
        // The thread's own: /proc/PID/stat sums every thread's times.
        if (auto st = host::read_stat(tid, proc_root + "/" + std::to_string(pid) + "/task"))
            t.state = st->state, t.cpu_ticks = st->cpu_ticks;
        threads.emplace(t.tid, std::move(t));
    }

    python::PyDiscovery d = python::discover_python(pid, proc_root);
    if (!d.ok()) {
        r.python_note = d.reason.empty() ? "no CPython found in the process" : d.reason;
    } else {
        // One resolver per look: code objects are named from this process now.
        python::LivePyResolver res(proc_root);
        res.adopt(static_cast<uint32_t>(pid), d);
        host::ProcessMemory mem(pid);
        auto stacks = python::read_thread_stacks(mem, d.layout);
        if (!stacks) {
            r.python_note = stacks.error();
        } else {
            uint32_t unnamed = 0;
            for (const python::PyThreadStack& s : *stacks) {
                // A thread state with no kernel thread id (3.10) is shown apart.
                uint32_t tid = s.native_tid ? s.native_tid : 0x80000000u + unnamed++;
                ThreadSample& t = threads[tid];
                t.tid = s.native_tid;
                t.python = true;
                t.truncated = s.truncated, t.fault = s.fault;
                for (const cd_py_frame& f : s.frames) {
                    const python::PyFrameInfo& fi = res.frame(static_cast<uint32_t>(pid), f);
                    t.stack.push_back({fi.qualname, fi.file, fi.line, fi.library});
                    t.where.push_back(f.code);
                    t.where.push_back(f.instr);
                }
            }
        }
    }
    // The main thread first, then by thread id.
    if (auto it = threads.find(static_cast<uint32_t>(pid)); it != threads.end()) {
        r.threads.push_back(std::move(it->second));
        threads.erase(it);
    }
    for (auto& [tid, t] : threads) r.threads.push_back(std::move(t));

    for (const ThreadSample& t : r.threads) {
        for (size_t i = 0; i < t.stack.size() && !r.collective; ++i) {
            const Frame& f = t.stack[i];
            if (!ends_with(f.file, "torch/distributed/distributed_c10d.py")) continue;
            if (auto kind = collective_of_api(f.function))
                r.collective = InCollective{*kind, f.function, t.tid, callers_frame(t.stack, i)};
        }
        if (r.collective) break;
    }
    if (!r.threads.empty() && !r.threads.front().stack.empty())
        r.at = callers_frame(r.threads.front().stack, 0);
    return r;
}

std::map<int, std::vector<CommSeq>> comm_seqs(const nlohmann::json& j) {
    std::map<int, std::vector<CommSeq>> out;
    if (!j.is_object() || !j.contains("communicators") || !j["communicators"].is_array()) return out;
    for (const auto& c : j["communicators"]) {
        if (!c.is_object()) continue;
        const std::string id = c.value("comm_id", "");
        const int nranks = c.value("nranks", -1);
        const nlohmann::json ranks = c.value("ranks", nlohmann::json::array());
        for (const auto& r : ranks) {
            if (!r.is_object()) continue;
            // Issued: the recorder's number where it has one (collectives
            // only, not sends and receives), else the counted calls.
            const nlohmann::json fl = r.value("flight", nlohmann::json::object());
            CommSeq cs{id, r.value("rank", -1), nranks, fl.value("seq", r.value("calls", uint64_t{0})), {}};
            for (const auto& e : fl.value("last", nlohmann::json::array())) cs.last.push_back(Issued::from_json(e));
            out[r.value("pid", 0)].push_back(std::move(cs));
        }
    }
    return out;
}

bool rank_moved(const RankSample& was, const RankSample& now) {
    if (now.comms != was.comms || now.exited != was.exited) return true;
    // Without numbers, a Python thread that ran moved too: a loop in one
    // frame may show the same instruction twice, and a thread blocked in a
    // CPU collective (gloo) uses no CPU.
    const bool counted = !now.comms.empty();
    std::map<uint32_t, const ThreadSample*> before;
    for (const ThreadSample& t : was.threads) before[t.tid] = &t;
    for (const ThreadSample& t : now.threads) {
        if (!t.python) continue;
        auto it = before.find(t.tid);
        if (it == before.end() || it->second->where != t.where) return true;
        if (!counted && it->second->cpu_ticks != t.cpu_ticks) return true;
    }
    return false;
}

Report examine(const std::vector<int>& ranks, double interval_s, const CommCounts& counts,
               const std::string& proc_root) {
    Report rep;
    rep.interval_s = interval_s;
    auto daemon = [&] {
        std::optional<nlohmann::json> j = counts ? counts() : std::nullopt;
        return j ? comm_seqs(*j) : std::map<int, std::vector<CommSeq>>{};
    };
    std::vector<RankSample> first;
    for (int pid : ranks) first.push_back(sample_rank(pid, proc_root));
    auto comms_first = daemon();
    std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
    auto comms_now = daemon();
    for (size_t i = 0; i < ranks.size(); ++i) {
        RankSample now = sample_rank(ranks[i], proc_root);
        first[i].comms = comms_first[ranks[i]];
        now.comms = comms_now[ranks[i]];
        now.moved = rank_moved(first[i], now);
        rep.ranks.push_back(std::move(now));
    }
    decide(rep);
    return rep;
}

namespace {

using Ranks = std::vector<const RankSample*>;
using CommMembers = std::map<std::string, std::vector<std::pair<const RankSample*, const CommSeq*>>>;

std::string names(const Ranks& v) {
    std::string s;
    for (const RankSample* x : v) s += (s.empty() ? "" : ", ") + x->name();
    return s;
}

// Ranks grouped by where they are, the largest group first.
std::vector<Group> groups_of(const std::vector<RankSample>& ranks) {
    std::map<std::string, std::vector<int>> places;
    for (const RankSample& s : ranks) {
        std::string what;
        if (s.exited)
            what = "exited";
        else if (s.collective)
            what = s.collective->kind + " at " + location(s.collective->called_from) + " in " +
                   s.collective->called_from.function;
        else if (s.at)
            what = frame_text(*s.at);
        else
            what = "no Python stack" + (s.python_note.empty() ? std::string() : ": " + s.python_note);
        places[what].push_back(s.pid);
    }
    std::vector<Group> out;
    for (auto& [what, pids] : places) out.push_back({pids, what});
    std::stable_sort(out.begin(), out.end(), [](const Group& a, const Group& b) { return a.pids.size() > b.pids.size(); });
    return out;
}

// The flight recorder's signatures: the first collective number at which a
// communicator's ranks issued different things is where they diverged.
bool signature_mismatch(const CommMembers& comms, Verdict& v) {
    for (const auto& [id, members] : comms) {
        std::vector<RankIssued> ranks;
        for (const auto& [s, c] : members) ranks.push_back({s->pid, &c->last});
        const std::vector<Divergence> all = divergences(ranks);
        if (all.empty()) continue;
        const Divergence* d = &all.front();
        v.kind = Verdict::Kind::mismatch;
        v.comm_id = id;
        v.seq = d->seq;
        v.signatures = d->signatures;
        v.culprits = d->odd;
        v.message = "collective #" + std::to_string(d->seq) + " of communicator " + id + " differs between ranks:";
        for (const auto& [sig, pids] : d->signatures) {
            std::string who;
            for (int p : pids) who += (who.empty() ? "pid " : ", pid ") + std::to_string(p);
            v.message += " " + sig + " (" + who + ")";
        }
        return true;
    }
    return false;
}

// commdbgd's exact counts: a rank that issued fewer collectives on a
// communicator than the others, still there, never issued the next one.
bool counts_behind(const CommMembers& comms, const std::string& kind, Verdict& v) {
    for (const auto& [id, members] : comms) {
        if (members.size() < 2) continue;
        uint64_t most = 0, least = UINT64_MAX;
        for (const auto& [s, c] : members) most = std::max(most, c->issued), least = std::min(least, c->issued);
        if (most == least) continue;
        Ranks behind, ahead;
        for (const auto& [s, c] : members) (c->issued < most ? behind : ahead).push_back(s);
        // The ranks ahead wait for the others: still, or the job moves on.
        if (std::any_of(ahead.begin(), ahead.end(), [](const RankSample* s) { return s->moved; })) continue;
        v.kind = Verdict::Kind::missing;
        v.comm_id = id;
        v.seq = least + 1;
        v.collective = kind;
        v.message = names(behind) + " never issued collective #" + std::to_string(least + 1) + " of communicator " +
                    id + ", which " + names(ahead) + " issued (" + std::to_string(most) + " there)";
        for (const RankSample* s : behind) {
            v.culprits.push_back(s->pid);
            if (s->at) v.message += "; " + s->name() + " is in " + frame_text(*s->at);
        }
        return true;
    }
    return false;
}

// The flight recorder's returns: the first collective of a communicator that
// returned an error on some rank (ncclRemoteError when a peer died, ...) is
// why the others wait; the ranks it failed on are named.
bool collective_failed(const CommMembers& comms, Verdict& v) {
    for (const auto& [id, members] : comms) {
        const Issued* first = nullptr;
        for (const auto& [s, c] : members)
            for (const Issued& e : c->last)
                if (e.failed() && (!first || e.seq < first->seq)) first = &e;
        if (!first) continue;
        v.kind = Verdict::Kind::failed;
        v.comm_id = id;
        v.seq = first->seq;
        v.collective = first->collective;
        v.message = "collective #" + std::to_string(first->seq) + " of communicator " + id + " (" +
                    first->signature() + ") returned an error:";
        for (const auto& [s, c] : members)
            for (const Issued& e : c->last)
                if (e.seq == first->seq && e.failed()) {
                    v.culprits.push_back(s->pid);
                    v.message += " " + e.status + " on " + s->name() +
                                 (s->at ? " (now in " + frame_text(*s->at) + ")" : std::string());
                }
        return true;
    }
    return false;
}

// What the stacks say: ranks still in a collective, and the others.
struct StackView {
    std::map<std::string, Ranks> by_kind;
    Ranks outside, waiting;
    bool any_moved = false;
    bool all_still_in_collectives() const {
        size_t in = 0;
        for (const auto& [kind, ranks] : by_kind) in += ranks.size();
        return !by_kind.empty() && waiting.size() == in;
    }
};

void missing_from_stacks(const StackView& st, Verdict& v) {
    v.kind = Verdict::Kind::missing;
    v.collective = st.by_kind.begin()->first;
    v.message = names(st.outside) + " never issued " + v.collective + ", which " + names(st.waiting) + " wait" +
                (st.waiting.size() == 1 ? "s" : "") + " in";
    for (const RankSample* s : st.outside) {
        v.culprits.push_back(s->pid);
        v.message += "; " + s->name() + (s->exited ? " has exited" : s->at ? " is in " + frame_text(*s->at)
                                                                            : " shows no Python stack");
    }
}

void kinds_differ(const StackView& st, Verdict& v) {
    v.kind = Verdict::Kind::mismatch;
    // The most common kind is what the job meant; the others differ.
    auto most = std::max_element(st.by_kind.begin(), st.by_kind.end(),
                                 [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    v.collective = most->first;
    v.message = "ranks wait in different collectives:";
    for (const auto& [kind, ranks] : st.by_kind) {
        v.message += " " + kind + " (" + names(ranks) + ")";
        if (kind != most->first)
            for (const RankSample* s : ranks) v.culprits.push_back(s->pid);
    }
}

}  // namespace

void decide(Report& r) {
    Verdict& v = r.verdict;
    v = {};
    r.groups = groups_of(r.ranks);
    StackView st;
    CommMembers comms;
    for (const RankSample& s : r.ranks) {
        st.any_moved |= s.moved;
        if (s.collective) {
            st.by_kind[s.collective->kind].push_back(&s);
            if (!s.moved) st.waiting.push_back(&s);
        } else {
            st.outside.push_back(&s);
        }
        for (const CommSeq& c : s.comms) comms[c.comm_id].emplace_back(&s, &c);
    }
    // The exact evidence first (commdbgd's recorder and counts), then the stacks.
    if (signature_mismatch(comms, v)) return;
    if (counts_behind(comms, st.by_kind.size() == 1 ? st.by_kind.begin()->first : "", v)) return;
    if (collective_failed(comms, v)) return;
    const bool still = !st.waiting.empty() && st.all_still_in_collectives();
    if (still && st.by_kind.size() == 1 && !st.outside.empty()) {
        missing_from_stacks(st, v);
    } else if (still && st.by_kind.size() > 1) {
        kinds_differ(st, v);
    } else if (still && st.outside.empty()) {
        v.kind = Verdict::Kind::below_host;
        v.collective = st.by_kind.begin()->first;
        v.message = "every rank waits in " + v.collective +
                    " and none moved: no rank is missing and none issued another kind; the hang is below the "
                    "host (GPU, network), or in a difference of count or shape stacks do not show";
    } else if (!st.any_moved && !comms.empty()) {
        v.kind = Verdict::Kind::below_host;
        v.message = "every rank issued the same collectives as the others on each communicator and none moved: no "
                    "rank is missing; the hang is below the host (GPU, network)";
    } else if (st.any_moved) {
        v.kind = Verdict::Kind::progressing;
        v.message = "ranks are moving: their stacks changed within " + std::to_string(r.interval_s).substr(0, 4) + " s";
    } else {
        v.kind = Verdict::Kind::stuck;
        v.message = "no rank moved and none is in a collective";
    }
}

void render_table(const Report& r, std::ostream& out) {
    out << "commdbg hang: " << r.ranks.size() << " rank" << (r.ranks.size() == 1 ? "" : "s") << ", sampled twice "
        << r.interval_s << " s apart\n";
    out << "verdict (" << to_string(r.verdict.kind) << "): " << r.verdict.message << "\n\n";
    for (const Group& g : r.groups) {
        std::string who;
        for (int pid : g.pids) {
            auto it = std::find_if(r.ranks.begin(), r.ranks.end(), [&](const RankSample& s) { return s.pid == pid; });
            who += (who.empty() ? "" : ", ") + (it != r.ranks.end() ? it->name() : std::to_string(pid));
        }
        out << "  " << who << ": " << g.what << "\n";
    }
    for (const RankSample& s : r.ranks) {
        out << "\n" << s.name() << (s.local_rank.empty() ? "" : " LOCAL_RANK=" + s.local_rank)
            << (s.moved ? " (moving)" : " (still)") << ": " << s.command << "\n";
        if (!s.python_note.empty()) out << "  no Python stacks: " << s.python_note << "\n";
        for (const CommSeq& c : s.comms)
        {
            out << "  communicator " << c.comm_id << ": rank " << c.rank << " of " << c.nranks << ", " << c.issued
                << " collectives issued\n";
            // The last few the flight recorder kept (--json has them all).
            for (size_t i = c.last.size() > 4 ? c.last.size() - 4 : 0; i < c.last.size(); ++i) {
                const Issued& e = c.last[i];
                out << "    #" << e.seq << " " << e.signature()
                    << (e.in_call() ? " (still in the call)" : e.failed() ? " returned " + e.status : "")
                    << "\n";
            }
        }
        for (const ThreadSample& t : s.threads) {
            if (!t.python) continue;  // native threads: counted below
            out << "  thread " << t.tid << " " << t.name << " [" << t.state << "]"
                << (s.collective && s.collective->tid == t.tid ? " in " + s.collective->kind : "") << "\n";
            for (const Frame& f : t.stack) out << "    " << frame_text(f) << "\n";
            if (t.truncated) out << "    ... (more frames)\n";
            if (t.fault) out << "    ... (a frame could not be read)\n";
        }
        size_t native = std::count_if(s.threads.begin(), s.threads.end(), [](const ThreadSample& t) { return !t.python; });
        if (native) out << "  " << native << " thread" << (native == 1 ? "" : "s") << " without Python\n";
    }
}

namespace {

nlohmann::ordered_json frame_json(const Frame& f) {
    return {{"function", f.function}, {"file", f.file}, {"line", f.line}, {"library", f.library}};
}

Frame frame_from(const nlohmann::json& j) {
    return {j.value("function", ""), j.value("file", ""), j.value("line", 0u), j.value("library", false)};
}

}  // namespace

nlohmann::ordered_json to_json(const Report& r) {
    using J = nlohmann::ordered_json;
    J ranks = J::array();
    for (const RankSample& s : r.ranks) {
        J threads = J::array();
        for (const ThreadSample& t : s.threads) {
            J stack = J::array();
            for (const Frame& f : t.stack) stack.push_back(frame_json(f));
            J th = {{"tid", t.tid}, {"name", t.name}, {"state", std::string(1, t.state)}, {"python", t.python}};
            if (t.python) th["stack"] = stack;
            if (t.truncated) th["truncated"] = true;
            if (t.fault) th["fault"] = true;
            threads.push_back(th);
        }
        J rank = {{"pid", s.pid}, {"command", s.command}, {"moved", s.moved}, {"exited", s.exited}};
        if (!s.rank.empty()) rank["rank"] = s.rank;
        if (!s.local_rank.empty()) rank["local_rank"] = s.local_rank;
        if (!s.python_note.empty()) rank["python_note"] = s.python_note;
        if (s.at) rank["at"] = frame_json(*s.at);
        if (!s.comms.empty()) {
            J comms = J::array();
            for (const CommSeq& c : s.comms) {
                J last = J::array();
                for (const Issued& e : c.last) last.push_back(J(e.to_json()));
                comms.push_back({{"comm_id", c.comm_id}, {"rank", c.rank}, {"nranks", c.nranks}, {"issued", c.issued},
                                 {"last", last}});
            }
            rank["communicators"] = comms;
        }
        if (s.collective)
            rank["collective"] = {{"kind", s.collective->kind},
                                  {"function", s.collective->api},
                                  {"tid", s.collective->tid},
                                  {"called_from", frame_json(s.collective->called_from)}};
        rank["threads"] = threads;
        ranks.push_back(rank);
    }
    J groups = J::array();
    for (const Group& g : r.groups) groups.push_back({{"pids", g.pids}, {"what", g.what}});
    J verdict = {{"kind", std::string(to_string(r.verdict.kind))},
                 {"message", r.verdict.message},
                 {"culprits", r.verdict.culprits},
                 {"exit_code", r.verdict.exit_code()}};
    if (!r.verdict.collective.empty()) verdict["collective"] = r.verdict.collective;
    if (!r.verdict.comm_id.empty()) verdict["comm_id"] = r.verdict.comm_id, verdict["seq"] = r.verdict.seq;
    if (!r.verdict.signatures.empty()) {
        J sigs = J::array();
        for (const auto& [sig, pids] : r.verdict.signatures) sigs.push_back({{"signature", sig}, {"pids", pids}});
        verdict["signatures"] = sigs;
    }
    return J{{"interval_s", r.interval_s}, {"verdict", verdict}, {"groups", groups}, {"ranks", ranks}};
}

Result<Report> from_json(const nlohmann::json& j) {
    using R = Result<Report>;
    if (!j.is_object() || !j.contains("ranks") || !j["ranks"].is_array())
        return R::fail("not a report of commdbg hang --json (no \"ranks\" list)");
    Report r;
    r.interval_s = j.value("interval_s", 0.0);
    try {
        for (const auto& x : j["ranks"]) {
            RankSample s;
            s.pid = x.at("pid").get<int>();
            s.command = x.value("command", "");
            s.moved = x.value("moved", false);
            s.exited = x.value("exited", false);
            s.rank = x.value("rank", "");
            s.local_rank = x.value("local_rank", "");
            s.python_note = x.value("python_note", "");
            if (x.contains("at")) s.at = frame_from(x["at"]);
            for (const auto& c : x.value("communicators", nlohmann::json::array())) {
                CommSeq cs{c.value("comm_id", ""), c.value("rank", -1), c.value("nranks", -1),
                           c.value("issued", uint64_t{0}), {}};
                for (const auto& e : c.value("last", nlohmann::json::array())) cs.last.push_back(Issued::from_json(e));
                s.comms.push_back(std::move(cs));
            }
            if (x.contains("collective")) {
                const auto& c = x["collective"];
                s.collective = InCollective{c.value("kind", ""), c.value("function", ""), c.value("tid", 0u),
                                            frame_from(c.value("called_from", nlohmann::json::object()))};
            }
            for (const auto& t : x.value("threads", nlohmann::json::array())) {
                ThreadSample ts;
                ts.tid = t.value("tid", 0u);
                ts.name = t.value("name", "");
                std::string st = t.value("state", "?");
                ts.state = st.empty() ? '?' : st[0];
                ts.python = t.value("python", false);
                ts.truncated = t.value("truncated", false);
                ts.fault = t.value("fault", false);
                for (const auto& f : t.value("stack", nlohmann::json::array())) ts.stack.push_back(frame_from(f));
                s.threads.push_back(std::move(ts));
            }
            r.ranks.push_back(std::move(s));
        }
    } catch (const nlohmann::json::exception& e) {
        return R::fail(std::string("a rank is malformed: ") + e.what());
    }
    return r;
}

}  // namespace commdbg::hang
