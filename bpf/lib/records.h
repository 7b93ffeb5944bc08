/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A call's records, filled in: an entry record (cd_call_enter) for a call
 * without a return probe, or whose entry must go out first; one record
 * (cd_call) at the return of the others.  Sending them is lib/emit.h's.
 */
#ifndef COMMDBG_LIB_RECORDS_H
#define COMMDBG_LIB_RECORDS_H

#include "lib/entry.h"
#include "lib/ringbuf.h"

/* A thread looks at the watermark once per this many of its records: a
 * helper call costs as much as the rest of a record's emission, and the
 * watermark leaves 7/8 of the buffer free (a few records late is nothing). */
#define CD_WAKE_CHECK_EVERY 16

/* A thread's first record wakes the consumer at once, batching or not:
 * userspace reads the thread's name when it first sees it, and a short-lived
 * worker would be gone by the time the watermark is reached. */
FUNC_INLINE __u64 call_wakeup(struct cd_thread *st)
{
	if (!st)
		return record_wakeup();
	if (!st->announced) {
		st->announced = 1;
		return BPF_RB_FORCE_WAKEUP;
	}
	if (++st->unchecked < CD_WAKE_CHECK_EVERY)
		return BPF_RB_NO_WAKEUP;
	st->unchecked = 0;
	return record_wakeup();
}

/* An entry record, for a call that has no return probe (or whose in-flight
 * state could not be kept, or whose thread exits first).  Records carry no
 * ncclUniqueId: communicators get theirs from the comms map, kept in the
 * kernel (a copy per record would be 128 bytes nobody reads). */
FUNC_INLINE void fill_enter(struct cd_call_enter *e, const struct entry *en, __u32 tail_len, __u32 tail_kind)
{
	fill_header(&e->h, CD_EV_CALL_ENTER, sizeof(*e) + tail_len, tail_len ? tail_kind : CD_TAIL_NONE, tail_len,
		    en->tgid, en->tid, en->ts);
	e->cookie = en->cookie;
	e->ip = en->ip;
	e->sp = en->sp;
	__builtin_memcpy(e->args, en->args, sizeof(e->args));
	e->group_depth = en->group_depth;
	e->entry_flags = en->entry_flags;
	e->frame_depth = en->frame_depth;
}

/* What a call returned, for its one record. */
struct ret_info {
	__s64 ret;
	__u64 out;
	__u32 depth;
};

FUNC_INLINE void fill_call(struct cd_call *e, const struct cd_inflight *call, __u32 tid, const struct ret_info *r,
			   __u32 tail_len)
{
	fill_header(&e->h, CD_EV_CALL, sizeof(*e) + tail_len, tail_len ? CD_TAIL_CONTEXT : CD_TAIL_NONE, tail_len,
		    call->ckey.tgid, tid, bpf_ktime_get_ns());
	e->cookie = call->cookie;
	e->ip = call->ip;
	e->sp = call->sp;
	__builtin_memcpy(e->args, call->args, sizeof(e->args));
	e->group_depth = call->group_depth;
	e->entry_flags = call->entry_flags;
	e->frame_depth = call->frame_depth;
	e->enter_ts_ns = call->ts;
	e->ret = r->ret;
	e->out_value = r->out;
	e->depth = r->depth;
	e->batch_seq = 0;
}

#endif /* COMMDBG_LIB_RECORDS_H */
