/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which processes are traced, and how (`traced`: tgid -> CD_TRACE_*); each
 * traced process's own counters; the events that tell userspace a process
 * was seen, forked or exited.
 */
#ifndef COMMDBG_LIB_PROCESS_H
#define COMMDBG_LIB_PROCESS_H

#include "lib/config.h"
#include "lib/drops.h"
#include "lib/lookup_or_init.h"
#include "lib/ringbuf.h"

/* tgid -> CD_TRACE_* flags.  Only these processes are counted or recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} traced SEC(".maps");

/* Bumped by userspace after each change it makes to `traced`: a thread's
 * state keeps its process's flags with the generation they were read at, so
 * a return-probed call (the thread's state is looked up anyway) skips the
 * `traced` lookup.  The kernel only adds processes that have no thread state
 * yet (count-all, fork) and removes them with their threads.  Starts at 1: a
 * new thread state (generation 0) never matches. */
volatile __u32 traced_gen = 1;

/* tgid -> its own counters (events.h).  Created when the tgid enters
 * `traced` and removed by userspace once it has read them, so this map only
 * holds traced processes and exited ones not yet forgotten: twice `traced`. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_proc_counts);
} proc_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_proc_counts);
} proc_counts_zero SEC(".maps");

/* The process's own counters, created if missing (a process traced before
 * it was given them, or whose creation raced with another CPU). */
FUNC_INLINE struct cd_proc_counts *proc_counts_get(__u32 tgid)
{
	return lookup_or_init(&proc_counts, &tgid, &proc_counts_zero);
}

FUNC_INLINE void emit_proc(__u32 kind, __u32 tgid, __u32 parent, __s32 code)
{
	struct cd_proc *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_drop(CD_DROP_PROC_EVENT);
		return;
	}
	fill_header(&e->h, kind, sizeof(*e), CD_TAIL_NONE, 0, tgid, tgid, bpf_ktime_get_ns());
	e->parent_tgid = parent;
	e->exit_code = code;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* A thread that made probed calls is exiting: its name, which userspace
 * reads from /proc at its first record and cannot once it is gone. */
FUNC_INLINE void emit_thread_exit(__u32 tgid, __u32 tid)
{
	struct cd_thread_exit *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_drop(CD_DROP_PROC_EVENT);
		return;
	}
	fill_header(&e->h, CD_EV_THREAD_EXIT, sizeof(*e), CD_TAIL_NONE, 0, tgid, tid, bpf_ktime_get_ns());
	bpf_get_current_comm(e->name, sizeof(e->name));
	bpf_ringbuf_submit(e, 0);
}

/* CD_TRACE_* flags for `tgid`, 0 when it is not traced.  In count-all mode a
 * process's first probed call puts it in `traced` and tells userspace, which
 * reads its labels (RANK, ...) while it surely still runs. */
FUNC_INLINE __u32 trace_flags(__u32 tgid)
{
	__u32 *f = bpf_map_lookup_elem(&traced, &tgid);
	__u32 fl = count_all_flags;

	if (f)
		return *f;
	if (!count_all || !in_scope())
		return 0;
	if (bpf_map_update_elem(&traced, &tgid, &fl, BPF_NOEXIST) == 0) {
		proc_counts_get(tgid);
		emit_proc(CD_EV_PROC_SEEN, tgid, 0, 0);
	}
	return fl;
}

/* The process's flags: kept in the thread's state while `traced` is
 * unchanged, else read from it (the generation first: a change made after
 * the read bumps it). */
FUNC_INLINE __u32 entry_trace_flags(const struct cd_thread *st, __u32 tgid, __u32 *gen)
{
	*gen = traced_gen;
	if (st && st->flags_gen == *gen)
		return st->flags;
	return trace_flags(tgid);
}

/* Children of a followed process are traced from their first instruction;
 * those of a CD_TRACE_NOTE_FORK process are only reported. */
FUNC_INLINE void note_fork(__u32 ptgid, __u32 ctgid)
{
	__u32 *flags, f;

	if (ptgid == ctgid)
		return; /* a new thread */
	flags = bpf_map_lookup_elem(&traced, &ptgid);
	if (!flags || !(*flags & (CD_TRACE_FOLLOW | CD_TRACE_NOTE_FORK)))
		return;
	f = *flags;
	if (f & CD_TRACE_FOLLOW)
		bpf_map_update_elem(&traced, &ctgid, &f, BPF_ANY);
	emit_proc(CD_EV_PROC_FORK, ctgid, ptgid, 0);
}

/* A traced process leaves `traced` with its last thread.  `tgid` by
 * address, the map key: a copy of it cost the program an instruction. */
FUNC_INLINE void note_exit(const __u32 *tgid, struct task_struct *p)
{
	if (!bpf_map_lookup_elem(&traced, tgid))
		return;
	/* live drops to 0 when the last thread of the group exits */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return;
	bpf_map_delete_elem(&traced, tgid);
	emit_proc(CD_EV_PROC_EXIT, *tgid, 0, BPF_CORE_READ(p, exit_code));
}

#endif /* COMMDBG_LIB_PROCESS_H */
