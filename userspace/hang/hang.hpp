// SPDX-License-Identifier: Apache-2.0
// `commdbg hang`: where each rank of a job is now, and which rank the others
// wait for — from outside, with nothing set at launch, never stopping or
// signalling the job.  Per rank every thread's Python stack is read from
// userspace (python/py_threads.hpp) twice, an interval apart; a rank blocked
// in a collective shows it as the frame of torch.distributed's own function
// (`all_reduce` in distributed_c10d.py) on its stack.  The verdict is the
// flight recorder analyzer's, on what stacks can tell: ranks that never
// issued the collective the others wait in (missing), ranks waiting in
// collectives of different kinds (mismatch), every rank waiting in the same
// one (the hang is below the host), or ranks still moving (progressing).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "result.hpp"

namespace commdbg::hang {

struct Frame {
    std::string function, file;  // co_qualname, co_filename
    uint32_t line = 0;           // 0: unknown
    bool library = false;        // the interpreter's or an installed package's file
    bool operator==(const Frame&) const = default;
};

struct ThreadSample {
    uint32_t tid = 0;
    std::string name;       // /proc/PID/task/TID/comm
    char state = '?';       // R, S, D, ... as the kernel says
    uint64_t cpu_ticks = 0; // user + system time so far
    bool python = false;    // a Python thread state names this thread
    std::vector<Frame> stack;  // innermost first
    std::vector<uint64_t> where;  // per frame: code object and instruction, to see it move
    bool truncated = false, fault = false;
};

// A collective a thread is inside: torch.distributed's function on its stack.
struct InCollective {
    std::string kind;  // as commdbg's other outputs name it: "all_reduce"
    std::string api;   // the function: "all_reduce", "all_gather_into_tensor"
    uint32_t tid = 0;
    Frame called_from;  // the innermost frame outside torch (the job's line)
};

// What commdbgd counted of a rank on one communicator: its collectives
// issued there so far, i.e. the sequence number of its last one.
// One collective as the flight recorder kept it.
struct Issued {
    uint64_t seq = 0;        // its number on the communicator, from 1
    std::string collective;  // "all_reduce"
    std::optional<uint64_t> count;  // the count argument (elements; c10d: its first tensor's); none: unknown
    std::string dtype;       // "float32"; empty: not an NCCL call
    std::string op;          // the reduce op ("sum"); empty: the call has none
    int64_t root = -1;       // broadcast's and reduce's root; -1: none
    // Where the call is, for the calls whose return is probed (NCCL's C API):
    // kInCall (entered, not returned: still inside NCCL, or its thread died
    // there), or what it returned ("ncclSuccess", "ncclRemoteError"; NCCL
    // returns once the collective is enqueued).  Empty: its return is not probed.
    std::string status;
    static constexpr std::string_view kInCall = "in_call";
    bool in_call() const { return status == kInCall; }
    bool failed() const;  // it returned something other than success
    bool operator==(const Issued&) const = default;
    std::string signature() const;  // "all_reduce count 1024 float32 sum", "broadcast count 8 float32 root 0"
    nlohmann::json to_json() const;  // {"seq", "collective", "count", "dtype", "op", "root", "status"}, the empty ones left out
    static Issued from_json(const nlohmann::json& e);
};

// One rank's recorded collectives on a communicator, oldest first.
struct RankIssued {
    int who = 0;  // pid
    const std::vector<Issued>* last = nullptr;
};
// Where the ranks of one communicator diverged: the first collective number
// two of them recorded with different signatures — the flight recorder
// analyzer's mismatch (`commdbg hang`, and commdbgd as collectives arrive).
struct Divergence {
    uint64_t seq = 0;
    // Each signature and who issued it, most ranks first; a part some rank
    // left unread is left out where the ranks that read it agree.
    std::vector<std::pair<std::string, std::vector<int>>> signatures;
    // Who issued another than the most common one, counting only the ranks
    // that read every part the signatures differ in; those that did not
    // are in no one's count and never odd.
    std::vector<int> odd;
};
// Every number at which two ranks recorded different signatures, in order.
std::vector<Divergence> divergences(const std::vector<RankIssued>& ranks);

struct CommSeq {
    std::string comm_id;  // NCCL's commHash (the same on every rank), as commdbg counts names it
    int rank = -1, nranks = -1;
    uint64_t issued = 0;
    std::vector<Issued> last;  // the flight recorder's last collectives there, oldest first
    bool operator==(const CommSeq&) const = default;
};

struct RankSample {
    int pid = 0;
    std::string rank, local_rank;  // RANK / LOCAL_RANK from its environment; empty: not set
    std::string command;
    std::string python_note;       // why there are no Python stacks (empty: there are)
    std::vector<ThreadSample> threads;  // the main thread first
    std::optional<InCollective> collective;
    std::vector<CommSeq> comms;    // from commdbgd, when it answers
    bool moved = false;            // a Python thread's stack changed or it ran, or it issued, between the samples
    bool exited = false;
    // The main thread's place: the innermost frame outside torch and the
    // interpreter's own library, else its innermost frame.
    std::optional<Frame> at;
    std::string name() const;  // "rank 2 (pid 4242)" or "pid 4242"
};

struct Verdict {
    enum class Kind {
        missing,      // ranks never issued the collective the others wait in
        mismatch,     // ranks wait in collectives of different kinds
        failed,       // a rank's collective returned an error (the flight recorder)
        below_host,   // every rank waits in the same collective, none moves
        progressing,  // stacks move between the samples
        stuck,        // nothing moves and no rank is in a collective
    };
    Kind kind = Kind::progressing;
    std::string message;
    std::string comm_id;        // the communicator the verdict is about (from commdbgd's counts)
    uint64_t seq = 0;           // missing: the collective number the culprits never issued; mismatch: the first
                                // number whose signatures differ; failed: the first that returned an error
                                // (from the flight recorder)
    std::vector<std::pair<std::string, std::vector<int>>> signatures;  // mismatch: each signature and its pids
    std::vector<int> culprits;  // pids
    std::string collective;     // the one the others wait in (missing, below_host)
    int exit_code() const;      // 3: culprit named, 0: progressing, 1: stuck without a culprit
};
std::string_view to_string(Verdict::Kind k);

struct Group {
    std::vector<int> pids;
    std::string what;  // "all_reduce at train.py:42 in step", "fetch_shard at data.py:88"
};

struct Report {
    std::vector<RankSample> ranks;
    std::vector<Group> groups;  // ranks with the same place, largest first
    Verdict verdict;
    double interval_s = 0;
};

// The ranks under the given pids: each pid and its descendants that map
// libtorch_cpu or libnccl, keeping those with no such descendant (a
// launcher's workers, not the launcher).  Fails naming a pid that does not
// exist or has no such process under it.
Result<std::vector<int>> find_ranks(const std::vector<int>& pids, const std::string& proc_root = "/proc");

// The kind of collective a torch.distributed function issues ("all_reduce"
// for all_reduce, "all_gather" for all_gather_into_tensor, ...), or nullopt.
std::optional<std::string> collective_of_api(std::string_view function);

// commdbgd's `counts --by-comm` reply (nullopt: no daemon answered).
using CommCounts = std::function<std::optional<nlohmann::json>()>;
// Each rank's communicators in such a reply.
std::map<int, std::vector<CommSeq>> comm_seqs(const nlohmann::json& by_comm);

// One look at a rank, now.
RankSample sample_rank(int pid, const std::string& proc_root = "/proc");
// Whether a rank moved between two looks (`now.comms` and `was.comms` filled):
// its sequence numbers, its exit, or a Python thread's frames changed.  CPU
// time counts only for a rank commdbgd gave no numbers of: CUDA waits for the
// GPU spinning (a rank in torch.cuda.synchronize burns a CPU and never moves),
// while a rank's numbers are the exact evidence of its progress.
bool rank_moved(const RankSample& was, const RankSample& now);
// Two looks at each rank `interval_s` apart (and at commdbgd's counts, when
// `counts` is given and answers), and the verdict on the second.
Report examine(const std::vector<int>& ranks, double interval_s, const CommCounts& counts = {},
               const std::string& proc_root = "/proc");
// The verdict and groups of samples already taken (examine, or dumps merged).
void decide(Report& r);

void render_table(const Report& r, std::ostream& out);
nlohmann::ordered_json to_json(const Report& r);
// A report --json wrote; ranks of several merge in decide().
Result<Report> from_json(const nlohmann::json& j);

}  // namespace commdbg::hang
