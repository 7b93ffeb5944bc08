/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A call's records sent: with their context where the call has one
 * (python/context.h), else the record alone.  Records may be dropped, each
 * drop counted (lib/drops.h); counters never depend on them.
 */
#ifndef COMMDBG_LIB_EMIT_H
#define COMMDBG_LIB_EMIT_H

#include "lib/batch.h"
#include "lib/drops.h"
#include "lib/records.h"
#include "lib/ringbuf.h"
#include "python/context.h"

/* An entry record without context. */
FUNC_INLINE void emit_enter(const struct entry *en, __u64 wakeup)
{
	struct cd_call_enter *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_ringbuf_drop(en->tgid);
		return;
	}
	fill_enter(e, en, 0, CD_TAIL_NONE);
	bpf_ringbuf_submit(e, wakeup);
}

/* The entry record of a call seen now. */
FUNC_INLINE void emit_entry_record(const struct entry *en, struct cd_thread *st)
{
	__u64 wakeup = call_wakeup(st);

	batch_before(st);

	if (!emit_enter_with_context(en, wakeup))
		emit_enter(en, wakeup);
}

/* The one record of a return-probed call, at its return.  Without context
 * it goes into its thread's batch (lib/batch.h), or else is built on the
 * stack and copied out: one helper call, not a reservation and a
 * submission. */
FUNC_INLINE void emit_call(const struct cd_inflight *call, struct cd_thread *st, __u32 tid,
			   const struct ret_info *r)
{
	__u64 wakeup;
	struct cd_call e;

	if (emit_call_with_context(call, st, tid, r))
		return;
	if (st && batch_call(st, call, tid, r))
		return;
	wakeup = call_wakeup(st);
	fill_call(&e, call, tid, r, 0);
	if (bpf_ringbuf_output(&events, &e, sizeof(e), wakeup))
		count_ringbuf_drop(call->ckey.tgid);
}

/* The return of a call whose entry went out as its own record. */
FUNC_INLINE void emit_exit(const struct cd_inflight *call, __u32 tid, const struct ret_info *r)
{
	struct cd_call_exit *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_drop(CD_DROP_EXIT_LOST);
		return;
	}
	fill_header(&e->h, CD_EV_CALL_EXIT, sizeof(*e), CD_TAIL_NONE, 0, call->ckey.tgid, tid, bpf_ktime_get_ns());
	e->cookie = call->cookie;
	e->enter_ts_ns = call->ts;
	e->ret = r->ret;
	e->out_value = r->out;
	e->depth = r->depth;
	e->pad = 0;
	bpf_ringbuf_submit(e, record_wakeup());
}

/* The entry of an in-flight call, as its entry record. */
FUNC_INLINE void emit_open_call(const struct cd_inflight *call, __u32 tid)
{
	struct entry en = {
		.cookie = call->cookie, .ts = call->ts, .ip = call->ip, .sp = call->sp, .tgid = call->ckey.tgid,
		.tid = tid, .flags = call->flags, .role = CD_COOKIE_ROLE(call->cookie),
		.group_depth = call->group_depth, .frame_depth = call->frame_depth,
		.entry_flags = call->entry_flags,
	};

	__builtin_memcpy(en.args, call->args, sizeof(en.args));
	emit_enter(&en, BPF_RB_FORCE_WAKEUP);
}

/* A thread exiting inside return-probed calls (killed in a collective): its
 * open calls are sent as entries, so the report shows where it was. */
FUNC_INLINE void emit_open_calls(struct cd_thread *st, __u32 tid)
{
	for (__u32 i = 0; i < CD_MAX_INFLIGHT; i++) {
		struct cd_inflight *call = &st->inflight[i & (CD_MAX_INFLIGHT - 1)];

		if (i >= st->depth)
			break;
		if ((call->flags & CD_TRACE_RECORDS) && !call->entry_sent)
			emit_open_call(call, tid);
	}
}

#endif /* COMMDBG_LIB_EMIT_H */
