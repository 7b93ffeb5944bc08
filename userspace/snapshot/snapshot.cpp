// SPDX-License-Identifier: Apache-2.0
#include "snapshot.hpp"

#include <algorithm>

#include "comm_registry.hpp"
#include "nccl.hpp"

namespace commdbg::snapshot {

std::string_view to_string(CommOrigin o) {
    switch (o) {
    case CommOrigin::InitRank: return "init_rank";
    case CommOrigin::Split: return "split";
    case CommOrigin::InitAll: return "init_all";
    case CommOrigin::BeforeAttach: return "before_attach";
    case CommOrigin::Unknown: return "unknown";
    }
    return "unknown";
}

void join_kernel_state(uint32_t pid, const capture::CounterSnapshot& counters,
                       const std::vector<capture::CommEntry>& comms, ProcessSnapshot& r) {
    join_kernel_state(pid, counters.entries, counters.loss, comms, r);
}

void join_kernel_state(uint32_t pid, const std::vector<capture::CounterEntry>& counters,
                       const std::map<uint32_t, capture::CounterLoss>& losses,
                       const std::vector<capture::CommEntry>& comms, ProcessSnapshot& r) {
    for (const auto& c : counters) {
        if (c.key.tgid != pid) continue;
        auto same = std::find_if(r.counters.begin(), r.counters.end(), [&](const CounterRow& row) {
            return c.coarse && row.sym == c.key.sym && row.comm == c.key.comm && row.dtype == c.key.dtype;
        });
        if (same == r.counters.end()) {
            r.counters.push_back({c.key.sym, c.key.comm, c.key.dtype, c.val.calls, c.val.elements, c.val.bytes,
                                  c.val.errors, c.val.nested, c.val.nested_bytes});
        } else {
            same->calls += c.val.calls, same->elements += c.val.elements;
            same->bytes += c.val.bytes, same->errors += c.val.errors;
            same->nested += c.val.nested, same->nested_bytes += c.val.nested_bytes;
        }
    }
    if (auto loss = losses.find(pid); loss != losses.end()) {
        r.counter_breakdown_lost = loss->second.breakdown_lost;
        if (loss->second.uncounted)
            r.notes.push_back(std::to_string(loss->second.uncounted) + " calls of pid " + std::to_string(pid) +
                              " that are not collectives were not counted: the kernel's counter keys ran out "
                              "(collectives are still counted exactly)");
    }
    r.comms = communicators_of(pid, comms, counters);
}

std::map<std::string, CollSummary> coll_summary(const std::vector<CounterRow>& counters,
                                                const capture::SymbolTable& syms) {
    std::map<std::string, CollSummary> out;
    for (const CounterRow& c : counters) {
        const capture::SymbolInfo* s = syms.find(c.sym);
        if (!s || s->role != CD_ROLE_COLLECTIVE) continue;
        // The kernel's nesting is "inside a framework collective": for one
        // of those that is its own layer's outer call.  A kind only ever
        // called inside another (gloo's allreduce under a reduce-scatter) was
        // not issued: no key.
        const bool framework = CD_COOKIE_FRAMEWORK_COLL(make_cookie(c.sym, *s));
        if (framework && c.nested >= c.calls) continue;
        CollSummary& sum = out[model::coll_key(s->layer, s->coll)];
        sum.calls += framework ? c.calls - std::min(c.nested, c.calls) : c.calls;
        sum.bytes += framework ? c.bytes - std::min(c.nested_bytes, c.bytes) : c.bytes;
        sum.errors += c.errors;
    }
    return out;
}

std::map<std::string, CollSummary> coll_summary(const ProcessSnapshot& p, const capture::SymbolTable& syms) {
    return coll_summary(p.counters, syms);
}

std::map<std::string, uint64_t> comm_counts(const ProcessSnapshot& p, const capture::SymbolTable& syms) {
    std::map<std::string, uint64_t> out;
    for (const auto& [k, sum] : coll_summary(p, syms)) out[k] = sum.calls;
    return out;
}

std::map<std::string, uint64_t> comm_bytes(const ProcessSnapshot& p, const capture::SymbolTable& syms) {
    std::map<std::string, uint64_t> out;
    for (const auto& [k, sum] : coll_summary(p, syms)) out[k] = sum.bytes;
    return out;
}

uint64_t total_counts(const ProcessSnapshot& p, const capture::SymbolTable& syms) {
    uint64_t calls = 0, nested = 0;
    for (const CounterRow& c : p.counters) {
        const capture::SymbolInfo* s = syms.find(c.sym);
        if (!s || s->role != CD_ROLE_COLLECTIVE) continue;
        calls += c.calls;
        nested += c.nested;
    }
    if (p.tree) nested = std::max(nested, p.tree->nested_collectives());
    return calls > nested ? calls - nested : 0;
}

std::map<std::string, model::ProcessTree::ModuleCommCounts> module_comm_counts(const ProcessSnapshot& p) {
    return p.tree ? p.tree->module_comm_counts() : std::map<std::string, model::ProcessTree::ModuleCommCounts>{};
}

const CommInfo* find_comm(const ProcessSnapshot& p, uint64_t ptr) {
    for (auto it = p.comms.rbegin(); it != p.comms.rend(); ++it)
        if (it->ptr == ptr) return &*it;
    return nullptr;
}

}  // namespace commdbg::snapshot
