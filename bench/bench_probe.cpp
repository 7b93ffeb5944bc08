// SPDX-License-Identifier: Apache-2.0
// ns per NCCL call (stub libnccl) in one process, four ways:
//   unprobed | uprobe with an empty BPF program | commdbg counters only |
//   commdbg counters + records (entry and return probes, ring buffer drained)
// and the ratios against the unprobed call and the empty program; then the
// time to load (verify) commdbg's BPF programs against the empty program's,
// which every attach waits for, with the verifier's instruction counts; and
// an empty program's uprobe on a function's leading endbr64 (single-stepped
// by the kernel) against one on the push after it (emulated), where commdbg
// puts it (arch::single_trap_entry).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include <bpf/libbpf.h>

#include "bench_args.hpp"
#include "bpf_session.hpp"
#include "elf_symbols.hpp"
#include "empty_bpf.skel.h"
#include "probe_attach.hpp"

using namespace commdbg;
using AllReduceFn = int (*)(const void*, void*, size_t, int, int, void*, void*);

// endbr64, then an instruction the kernel emulates: where commdbg's probe goes.
__asm__(".text\n.globl cdbg_bench_cet\n.type cdbg_bench_cet,@function\ncdbg_bench_cet:\n"
        "  endbr64\n  push %rbx\n  lea 1(%rdi),%rax\n  pop %rbx\n  ret\n.size cdbg_bench_cet,.-cdbg_bench_cet\n");
extern "C" long cdbg_bench_cet(long);

namespace {

double ns_per_call(AllReduceFn fn, long n) {
    static float buf[4];
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) fn(buf, buf, 1, 7, 0, reinterpret_cast<void*>(0x1000), nullptr);
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

double best_of(AllReduceFn fn, long n) {
    double best = 1e18;
    for (int r = 0; r < 3; ++r) best = std::min(best, ns_per_call(fn, n));
    return best;
}

double traced(AllReduceFn fn, long n, uint32_t flags) {
    auto bpf = capture::BpfSession::open(capture::BpfOptions{});
    if (!bpf) {
        std::fprintf(stderr, "%s\n", bpf.error().c_str());
        return -1;
    }
    capture::SymbolTable syms;
    std::vector<std::string> errs;
    capture::ProbeAttacher attacher(**bpf, syms, capture::select_specs({"nccl"}, errs));
    if (auto r = (*bpf)->trace_process(static_cast<uint32_t>(getpid()), flags); !r) {
        std::fprintf(stderr, "%s\n", r.error().c_str());
        return -1;
    }
    auto scan = attacher.scan_process(getpid());
    if (!scan || scan->new_files == 0) {
        std::fprintf(stderr, "bench: could not attach to the stub\n");
        return -1;
    }
    (*bpf)->set_armed(true);  // as a session does once attached
    std::atomic<bool> stop{false};
    std::atomic<long> records{0};
    (*bpf)->set_event_handler([&](std::span<const uint8_t>) { records.fetch_add(1, std::memory_order_relaxed); });
    std::thread consumer([&] {
        while (!stop) (*bpf)->poll(10);
    });
    double ns = best_of(fn, n);
    stop = true;
    consumer.join();
    return ns;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Best of 3 loads of each; prints both and commdbg's per-program verifier work.
void print_load_times() {
    double empty = 1e18, full = 1e18;
    std::vector<std::pair<std::string, uint32_t>> insns;
    for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        if (auto* skel = empty_bpf__open_and_load()) {
            empty = std::min(empty, ms_since(t0));
            empty_bpf__destroy(skel);
        }
        t0 = std::chrono::steady_clock::now();
        if (auto bpf = capture::BpfSession::open(capture::BpfOptions{})) {
            full = std::min(full, ms_since(t0));
            insns = (*bpf)->verified_insns();
        }
    }
    std::printf("%-44s %10.1f ms      ratio 1.00\n", "load: empty BPF program", empty);
    std::printf("%-44s %10.1f ms      ratio %.1f vs empty\n", "load: commdbg's BPF programs", full, full / empty);
    for (const auto& [name, n] : insns) std::printf("  %-42s %10u instructions verified\n", name.c_str(), n);
}

// ns per call of cdbg_bench_cet with an empty program's uprobe at `at` past
// its entry (best of 3); -1 when it cannot attach.
double cet_ns(empty_bpf* skel, const host::ElfSymbol& sym, unsigned long at, long n) {
    unsigned long off = sym.file_offset + at;
    LIBBPF_OPTS(bpf_uprobe_multi_opts, o, .offsets = &off, .cnt = 1);
    bpf_link* l = bpf_program__attach_uprobe_multi(skel->progs.empty_enter, -1, "/proc/self/exe", nullptr, &o);
    if (!l) return -1;
    long (*volatile fn)(long) = cdbg_bench_cet;
    double best = 1e18;
    for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < n; ++i) fn(i);
        best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                                  static_cast<double>(n));
    }
    bpf_link__destroy(l);
    return best;
}

void print_endbr64_placement(long n) {
    auto elf = host::ElfSymbols::open("/proc/self/exe");
    const host::ElfSymbol* s = elf ? elf->find("cdbg_bench_cet") : nullptr;
    auto* skel = empty_bpf__open_and_load();
    if (!s || !skel) {
        std::printf("entry placement: skipped (no symbol or no BPF)\n");
        if (skel) empty_bpf__destroy(skel);
        return;
    }
    const double on = cet_ns(skel, *s, 0, n), past = cet_ns(skel, *s, 4, n);
    empty_bpf__destroy(skel);
    std::printf("%-44s %10.1f ns/call  ratio 1.00\n", "empty program on endbr64 (single-stepped)", on);
    std::printf("%-44s %10.1f ns/call  ratio %.2f vs on endbr64\n", "empty program on the push after (emulated)", past,
                past / on);
}

}  // namespace

int main(int argc, char** argv) {
    long n = bench::bench_args(argc, argv, {{"calls", 300000, 10}})[0];
    if (geteuid() != 0) {
        std::printf("bench_probe: skipped — needs root to attach uprobes\n");
        return 0;
    }
    void* h = dlopen(STUB_NCCL, RTLD_NOW);
    if (!h) {
        std::fprintf(stderr, "bench_probe: %s\n", dlerror());
        return 1;
    }
    auto fn = reinterpret_cast<AllReduceFn>(dlsym(h, "ncclAllReduce"));
    double base = best_of(fn, n);

    // Baseline 2: the same uprobe running a BPF program that does nothing.
    double empty = -1;
    if (auto* skel = empty_bpf__open_and_load()) {
        auto elf = host::ElfSymbols::open(STUB_NCCL);
        const host::ElfSymbol* s = elf ? elf->find("ncclAllReduce") : nullptr;
        unsigned long off = s ? s->file_offset : 0;
        LIBBPF_OPTS(bpf_uprobe_multi_opts, o, .offsets = &off, .cnt = 1);
        if (bpf_link* l = bpf_program__attach_uprobe_multi(skel->progs.empty_enter, -1, STUB_NCCL, nullptr, &o)) {
            empty = best_of(fn, n);
            bpf_link__destroy(l);
        }
        empty_bpf__destroy(skel);
    }
    double counts = traced(fn, n, CD_TRACE_COUNT);
    double full = traced(fn, n, CD_TRACE_COUNT | CD_TRACE_RECORDS);

    std::printf("calls per measurement: %ld (best of 3)\n", n);
    std::printf("%-44s %10.1f ns/call  ratio 1.00\n", "unprobed ncclAllReduce (stub)", base);
    std::printf("%-44s %10.1f ns/call  ratio %.2f vs unprobed\n", "uprobe + empty BPF program", empty, empty / base);
    std::printf("%-44s %10.1f ns/call  ratio %.2f vs unprobed, %.2f vs empty\n", "commdbg counters only (entry+return)",
                counts, counts / base, counts / empty);
    std::printf("%-44s %10.1f ns/call  ratio %.2f vs unprobed, %.2f vs empty\n", "commdbg counters + records", full,
                full / base, full / empty);
    print_load_times();
    print_endbr64_placement(n / 10);
    return 0;
}
