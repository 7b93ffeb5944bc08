// SPDX-License-Identifier: Apache-2.0
// Throughput of decode + model on one core, and bytes per retained record.
// Ratios are against a loop that only decodes the same bytes, in the same run.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "events.hpp"
#include "model.hpp"
#include "render.hpp"

using namespace commdbg;

namespace {

struct Stream {
    std::vector<uint8_t> bytes;
    std::vector<std::pair<size_t, size_t>> records;  // offset, size

    template <typename T>
    void add(const T& rec) {
        records.push_back({bytes.size(), sizeof(T)});
        bytes.resize(bytes.size() + sizeof(T));
        std::memcpy(bytes.data() + records.back().first, &rec, sizeof(T));
    }
    std::span<const uint8_t> at(size_t i) const {
        return {bytes.data() + records[i].first, records[i].second};
    }
};

cd_header header(uint16_t kind, size_t size, uint32_t tid, uint64_t ts) {
    cd_header h{};
    h.kind = kind;
    h.size = static_cast<uint16_t>(size);
    h.tgid = 1000;
    h.tid = tid;
    h.ts_ns = ts;
    return h;
}

// Per iteration: an op frame, a nested op frame, an NCCL collective (enter +
// exit) inside it: 4 events, 3 records.  Two threads alternate in blocks.
Stream make_stream(const capture::SymbolTable& t, uint32_t op1, uint32_t op2, uint32_t nccl, size_t iters) {
    Stream s;
    uint64_t ts = 1'000'000;
    for (size_t i = 0; i < iters; ++i) {
        uint32_t tid = (i / 64) % 2 ? 1001 : 1002;
        uint64_t sp = tid == 1001 ? 0x7ff000 : 0x5ff000;
        cd_call_enter e{};
        e.h = header(CD_EV_CALL_ENTER, sizeof(e), tid, ts++);
        e.cookie = make_cookie(op1, *t.find(op1));
        e.sp = sp;
        s.add(e);
        e.h = header(CD_EV_CALL_ENTER, sizeof(e), tid, ts++);
        e.cookie = make_cookie(op2, *t.find(op2));
        e.sp = sp - 0x100;
        s.add(e);
        e.h = header(CD_EV_CALL_ENTER, sizeof(e), tid, ts++);
        e.cookie = make_cookie(nccl, *t.find(nccl));
        e.sp = sp - 0x200;
        e.args[0] = 0x7f0000200000 + 4096 * i;  // sendbuff
        e.args[1] = 0x7f0000400000 + 4096 * i;  // recvbuff
        e.args[2] = 1024 + i;
        e.args[3] = 7;
        e.args[5] = 0xc0ffee;
        e.args[6] = 0x5555a0000010;  // stream (first stack word)
        s.add(e);
        cd_call_exit x{};
        x.h = header(CD_EV_CALL_EXIT, sizeof(x), tid, ts++);
        x.cookie = e.cookie;
        x.enter_ts_ns = e.h.ts_ns;
        s.add(x);
    }
    return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
    capture::SymbolTable t;
    capture::SymbolInfo op;
    op.layer = "aten";
    op.role = CD_ROLE_OP;
    op.name = "aten::linear";
    uint32_t op1 = t.intern(op);
    op.name = "aten::addmm";
    uint32_t op2 = t.intern(op);
    capture::SymbolInfo nc;
    nc.name = "ncclAllReduce";
    nc.layer = "nccl";
    nc.role = CD_ROLE_COLLECTIVE;
    nc.coll = CD_COLL_ALL_REDUCE;
    nc.slots = {2, 3, 5, 4};
    nc.slots.sendbuf = 0;
    nc.slots.recvbuf = 1;
    nc.slots.stream = 6;
    nc.return_probe = true;
    uint32_t nccl = t.intern(nc);

    const size_t iters = 1 << 16;  // 256k events, replayed
    Stream s = make_stream(t, op1, op2, nccl, iters);
    const size_t n = s.records.size();
    const int rounds = 40;  // ~10M events
    const double total = static_cast<double>(n) * rounds;

    // Baseline: decode only.
    uint64_t sink = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < n; ++i) {
            auto d = capture::decode(s.at(i));
            sink += d.event ? d.event->index() : 1;
        }
    double base_s = seconds_since(t0);

    // decode + model, resetting the window whenever a process's budget fills
    // (so every event takes the retaining path, the expensive one).
    model::TraceModel m(t);
    t0 = std::chrono::steady_clock::now();
    size_t resets = 0;
    for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < n; ++i) {
            auto d = capture::decode(s.at(i));
            if (!d.event) continue;
            m.on_event(*d.event);
            if (i % 4096 == 0 && m.process(1000)->records().size() + 4096 > m.limits().max_records) {
                m.reset();
                ++resets;
            }
        }
    double model_s = seconds_since(t0);

    // Over budget: every record dropped, stack still maintained.
    model::TraceModel full(t, model::ModelLimits{.max_records = 0, .max_depth = 128});
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds / 4; ++r)
        for (size_t i = 0; i < n; ++i) {
            auto d = capture::decode(s.at(i));
            if (d.event) full.on_event(*d.event);
        }
    double full_s = seconds_since(t0);

    // Bytes per retained record at a full default budget.
    struct mallinfo2 before = mallinfo2();
    model::TraceModel mem(t);
    size_t i = 0;
    while (!mem.process(1000) || mem.process(1000)->records().size() < mem.limits().max_records) {
        auto d = capture::decode(s.at(i++ % n));
        mem.on_event(*d.event);
    }
    struct mallinfo2 after = mallinfo2();
    const model::ProcessTree* p = mem.process(1000);
    double per_rec = static_cast<double>(p->memory_bytes()) / static_cast<double>(p->records().size());
    // In-use heap plus mmapped chunks (large vectors are mmapped).
    auto in_use = [](const struct mallinfo2& mi) { return mi.uordblks + mi.hblkhd; };
    double per_rec_heap = static_cast<double>(in_use(after) - in_use(before)) /
                          static_cast<double>(p->records().size());

    // Rendering the full-budget window: the outputs as text, written a record
    // at a time, against building the json value and dumping it (the
    // baseline, in this run).  Heap held at the end of each, per record.
    snapshot::ProcessSnapshot rep;
    rep.pid = 1000;
    rep.tree = p;
    const std::vector<snapshot::ProcessSnapshot> reps{rep};
    const double recs = static_cast<double>(p->records().size());
    auto held_per_record = [&](const struct mallinfo2& b) {
        return static_cast<double>(in_use(mallinfo2()) - in_use(b)) / recs;
    };
    struct Render {
        double ns_per_record, held_per_record;
        size_t bytes;
    };
    auto measure = [&](auto&& build) {
        malloc_trim(0);
        struct mallinfo2 b = mallinfo2();
        auto r0 = std::chrono::steady_clock::now();
        auto held = build();
        Render r{seconds_since(r0) * 1e9 / recs, held_per_record(b), 0};
        if constexpr (std::is_same_v<std::decay_t<decltype(held)>, std::string>) r.bytes = held.size();
        return r;
    };
    Render json_value = measure([&] {
        auto j = output::to_json(reps, t, 1);
        return std::make_pair(j.dump(2), std::move(j));  // both alive at once, as before
    });
    Render json_text = measure([&] { return output::to_json_text(reps, t, 1); });
    Render trace_value = measure([&] {
        auto j = output::chrome_trace(reps, t);
        return std::make_pair(j.dump(), std::move(j));
    });
    Render trace_text = measure([&] { return output::chrome_trace_text(reps, t); });

    std::printf("events: %zu (4 per iteration: op > op > nccl enter+exit), rounds %d, resets %zu\n",
                n, rounds, resets);
    std::printf("decode only (baseline):   %8.2f M events/s\n", total / base_s / 1e6);
    std::printf("decode + model (retain):  %8.2f M events/s  (%.2fx baseline time; target >= 5)\n",
                total / model_s / 1e6, model_s / base_s);
    std::printf("decode + model (dropped): %8.2f M events/s  (%.2fx baseline time)\n",
                total / 4 / full_s / 1e6, full_s / (base_s / 4));
    std::printf("retained records: %zu, sizeof(Record) %zu\n", p->records().size(), sizeof(model::Record));
    std::printf("bytes per retained record: %.1f (model accounting), %.1f (malloc delta); target <= 150\n",
                per_rec, per_rec_heap);
    std::printf("render %zu records, --json: text %.0f ns and %.0f B held per record (%zu B of output); "
                "json value + dump %.0f ns and %.0f B held (%.2fx the memory)\n",
                p->records().size(), json_text.ns_per_record, json_text.held_per_record, json_text.bytes,
                json_value.ns_per_record, json_value.held_per_record,
                json_value.held_per_record / json_text.held_per_record);
    std::printf("render %zu records, --trace: text %.0f ns and %.0f B held per record (%zu B of output); "
                "json value + dump %.0f ns and %.0f B held (%.2fx the memory)\n",
                p->records().size(), trace_text.ns_per_record, trace_text.held_per_record, trace_text.bytes,
                trace_value.ns_per_record, trace_value.held_per_record,
                trace_value.held_per_record / trace_text.held_per_record);
    return sink == 42 ? 1 : 0;
}
