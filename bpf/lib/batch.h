/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A thread's call records without context, kept in its state
 * (cd_thread.batch) and sent up to CD_BATCH at a time as one ring-buffer
 * record (CD_EV_BATCH): a record's reservation and commit cost more than
 * the rest of it.  A batch goes out
 *   - when it is full;
 *   - before any other record of its thread, so that a thread's records
 *     keep their order;
 *   - when its thread leaves its CPU (on_switch: it sleeps, is preempted or
 *     migrates), and when it exits;
 * and at a window's end userspace reads what its threads still hold
 * (BpfSession::pending_batches).  Records are numbered per thread
 * (cd_call.batch_seq), so that one flushed while userspace reads it is taken
 * once.  Only where userspace asked for it (batch_records: a session with
 * records), from the first record a batch would have taken (batching).
 */
#ifndef COMMDBG_LIB_BATCH_H
#define COMMDBG_LIB_BATCH_H

#include "lib/drops.h"
#include "lib/records.h"
#include "lib/ringbuf.h"

const volatile __u32 batch_records = 0;
/* Set by userspace once on_switch is attached, at the first record it sees
 * that a batch would have taken (TraceSession::start_batching): until then
 * records go out one by one, so a session whose records all have context
 * (a Python job) never runs a program at every context switch. */
volatile __u32 batching = 0;

/* Per CPU: the thread whose batch waits there, 0 for none.  A thread that
 * adds to its batch runs on this CPU until it is switched out, and its
 * switch-out is on this CPU too: on_switch finds it here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} batch_cpu SEC(".maps");

/* The batch out now, if it holds any.  Its records are one process's: a
 * ring buffer that is full loses them all, each counted. */
FUNC_INLINE void batch_flush(struct cd_thread *st, __u64 wakeup)
{
	struct cd_batch *b = &st->batch;
	__u32 n = b->n, tgid;

	if (n == 0 || b->busy)
		return;
	if (n > CD_BATCH)
		n = CD_BATCH;
	tgid = b->calls[0].h.tgid;
	fill_header(&b->h, CD_EV_BATCH, sizeof(b->h) + n * sizeof(struct cd_call), CD_TAIL_NONE, 0, tgid,
		    b->calls[0].h.tid, b->calls[n - 1].h.ts_ns);
	if (bpf_ringbuf_output(&events, &b->h, sizeof(b->h) + n * sizeof(struct cd_call), wakeup))
		for (__u32 i = 0; i < CD_BATCH && i < n; i++)
			count_ringbuf_drop(tgid);
	b->n = 0;
}

/* A call's one record into its thread's batch; false where batches are off
 * (then it goes out by itself). */
FUNC_INLINE bool batch_call(struct cd_thread *st, const struct cd_inflight *call, __u32 tid,
			    const struct ret_info *r)
{
	struct cd_batch *b = &st->batch;
	__u32 n = b->n, zero = 0, *here;

	if (!batch_records || !batching || n >= CD_BATCH)
		return false;
	/* on_switch may run in the middle of this (a preempted uprobe program):
	 * it leaves a batch being written alone. */
	b->busy = 1;
	barrier();
	fill_call(&b->calls[n & (CD_BATCH - 1)], call, tid, r, 0);
	b->calls[n & (CD_BATCH - 1)].batch_seq = ++b->seq;
	b->n = n + 1;
	barrier();
	b->busy = 0;
	if (n + 1 == CD_BATCH) {
		batch_flush(st, call_wakeup(st));
		return true;
	}
	here = bpf_map_lookup_elem(&batch_cpu, &zero);
	if (here)
		*here = tid;
	return true;
}

/* Before another record of the thread: what it batched goes first. */
FUNC_INLINE void batch_before(struct cd_thread *st)
{
	if (st && st->batch.n)
		batch_flush(st, BPF_RB_NO_WAKEUP);
}

#endif /* COMMDBG_LIB_BATCH_H */
