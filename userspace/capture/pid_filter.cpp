// SPDX-License-Identifier: Apache-2.0
#include "pid_filter.hpp"

#include <unistd.h>

#include <cerrno>
#include <memory>
#include <thread>

#include <bpf/libbpf.h>

#include "bpf_session.hpp"
#include "pid_filter_check_bpf.skel.h"
#include "procfs.hpp"

// What the self-check probes: a function of commdbg's own file that the
// compiler keeps as one (the asm is a side effect it may not drop).
extern "C" __attribute__((noinline, used)) void commdbg_pid_filter_probe_point() {
    asm volatile("");
}

namespace commdbg::capture {
namespace {

struct SkelDeleter {
    void operator()(pid_filter_check_bpf* s) const { pid_filter_check_bpf__destroy(s); }
};

Result<bool> check() {
    using R = Result<bool>;
    // Where the function lies in its file: its address through our own maps.
    const auto addr = reinterpret_cast<uint64_t>(&commdbg_pid_filter_probe_point);
    auto maps = host::read_maps(getpid());
    if (!maps) return R::fail("checking the kernel's per-process uprobe filter: " + maps.error());
    const host::MapEntry* at = nullptr;
    for (const auto& m : *maps)
        if (addr >= m.start && addr < m.end && !m.path.empty() && m.path[0] == '/') at = &m;
    if (!at) return R::fail("checking the kernel's per-process uprobe filter: commdbg's own code is in no file");
    std::unique_ptr<pid_filter_check_bpf, SkelDeleter> skel(pid_filter_check_bpf__open_and_load());
    if (!skel) return R::fail(bpf_error_message("checking the kernel's per-process uprobe filter: loading", errno));
    unsigned long offset = addr - at->start + at->offset;
    LIBBPF_OPTS(bpf_uprobe_multi_opts, o, .offsets = &offset, .cnt = 1);
    LinkPtr link(
        bpf_program__attach_uprobe_multi(skel->progs.filter_hit, getpid(), at->path.c_str(), nullptr, &o));
    if (!link)
        return R::fail(bpf_error_message("checking the kernel's per-process uprobe filter: attaching", errno));
    std::thread([] { commdbg_pid_filter_probe_point(); }).join();
    const uint64_t hits = __atomic_load_n(&skel->bss->hits, __ATOMIC_RELAXED);
    if (hits != 1)
        return R::fail("the kernel's per-process uprobe filter ran the program " + std::to_string(hits) +
                       " times for 1 call from a second thread of the process: it filters by thread here");
    return true;
}

}  // namespace

Result<bool> pid_filter_covers_process() {
    static const Result<bool> answer = check();
    return answer;
}

}  // namespace commdbg::capture
