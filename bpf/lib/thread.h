/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per thread (`threads`, key: tid; events.h, cd_thread): its open
 * return-probed calls, kept from entry to return, and its entry-only
 * frames, which tell where a call nests.
 */
#ifndef COMMDBG_LIB_THREAD_H
#define COMMDBG_LIB_THREAD_H

#include "lib/drops.h"
#include "lib/entry.h"
#include "lib/lookup_or_init.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_thread);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_thread);
} thread_zero SEC(".maps");

FUNC_INLINE struct cd_thread *thread_get(__u32 tid)
{
	return lookup_or_init(&threads, &tid, &thread_zero);
}

/* A thread's state: for records, to pair a call with its return, and for a
 * framework collective, whose frame tells the calls made inside it
 * (events.h, cd_count_val.nested).  A counted entry-only NCCL call (commdbgd
 * --no-count-errors) looks up nothing. */
FUNC_INLINE bool wants_thread(const struct entry *en)
{
	return wants_records(en) || CD_COOKIE_RET(en->cookie) || CD_COOKIE_FRAMEWORK_COLL(en->cookie);
}

/* ---- entry-only frames ---------------------------------------------------- */

/* Pops the frames that returned before an entry at `sp`; returns the depth
 * left, the parent level of the new call.  Inlined, its loop was verified
 * again on each of call_enter's paths, most of the program's load time. */
FUNC_GLOBAL __u32 pop_returned_frames(struct cd_thread *st, __u64 sp)
{
	__u32 n;

	if (!st)
		return 0;
	n = st->nframes;

	for (int i = 0; i < CD_MAX_FRAMES; i++) {
		struct cd_frame *f;
		__u64 cur = 0;

		if (n == 0 || n > CD_MAX_FRAMES)
			break;
		f = &st->frames[(n - 1) & (CD_MAX_FRAMES - 1)];
		if (f->sp > sp && bpf_probe_read_user(&cur, sizeof(cur), (void *)f->sp) == 0 &&
		    cur == f->ret)
			break; /* still open: below us, return address intact */
		n--;
	}
	st->nframes = n;
	st->coll_frames &= n < 32 ? (1u << n) - 1 : 0xffffffffu;
	return n;
}

FUNC_INLINE void push_frame(struct cd_thread *st, struct entry *en)
{
	__u32 n = st->nframes;
	struct cd_frame *f;

	if (n >= CD_MAX_FRAMES) {
		en->frame_depth = CD_DEPTH_UNKNOWN; /* too deep to track: sp rule */
		return;
	}
	f = &st->frames[n & (CD_MAX_FRAMES - 1)];
	f->sp = en->sp;
	if (bpf_probe_read_user(&f->ret, sizeof(f->ret), (void *)en->sp))
		f->ret = 0;
	if (CD_COOKIE_FRAMEWORK_COLL(en->cookie))
		st->coll_frames |= 1u << (n & (CD_MAX_FRAMES - 1));
	st->nframes = n + 1;
}

/* Frames: for records (group and frame depth: where a call nests), and for
 * every collective of a thread whose state is there (is a framework
 * collective open?); a library call of a thread that never entered one
 * finds no frame and reads nothing. */
FUNC_INLINE bool wants_frames(const struct entry *en)
{
	return wants_records(en) || en->role == CD_ROLE_COLLECTIVE;
}

FUNC_INLINE void track_frames(struct cd_thread *st, struct entry *en)
{
	bool group = en->role == CD_ROLE_GROUP_START || en->role == CD_ROLE_GROUP_END;

	if (en->role == CD_ROLE_GROUP_START)
		st->group_depth++;
	else if (en->role == CD_ROLE_GROUP_END && st->group_depth > 0)
		st->group_depth--;
	en->group_depth = st->group_depth;
	en->frame_depth = pop_returned_frames(st, en->sp);
	en->nested = en->role == CD_ROLE_COLLECTIVE && st->coll_frames != 0;
	/* A module entry is a point in time, not a frame anything nests in (its
	 * probe may sit past the entry, where [sp] is no return address); so
	 * are autograd nodes made and run (torch/autograd.h). */
	if (!CD_COOKIE_RET(en->cookie) && !group && en->role != CD_ROLE_MODULE_ENTER &&
	    en->role != CD_ROLE_GRAD_FN && en->role != CD_ROLE_AUTOGRAD_NODE)
		push_frame(st, en);
}

/* ---- open return-probed calls --------------------------------------------- */

/* Keeps what the return needs; false when the thread is nested too deep. */
FUNC_INLINE bool push_inflight(struct cd_thread *st, const struct entry *en, const struct cd_count_key *key,
			       __u32 counted, bool entry_sent, __u64 flight_seq)
{
	__u32 d = st->depth;
	struct cd_inflight *call;

	if (d >= CD_MAX_INFLIGHT) {
		count_drop(CD_DROP_INFLIGHT_DEEP);
		return false;
	}
	call = &st->inflight[d & (CD_MAX_INFLIGHT - 1)];
	call->cookie = en->cookie;
	call->ts = en->ts;
	call->out_ptr = slot_arg(en->args, CD_COOKIE_OUT(en->cookie));
	call->ip = en->ip;
	call->sp = en->sp;
	call->flight_seq = flight_seq;
	__builtin_memcpy(call->args, en->args, sizeof(call->args));
	call->ckey = *key;
	call->group_depth = en->group_depth;
	call->frame_depth = en->frame_depth;
	call->counted = counted;
	call->flags = en->flags;
	call->entry_sent = entry_sent;
	call->entry_flags = en->entry_flags;
	st->depth = d + 1;
	if (CD_COOKIE_TAIL(en->cookie) == CD_TAIL_UNIQUE_ID &&
	    bpf_probe_read_user(st->unique_id, CD_UNIQUE_ID_BYTES, (void *)(en->sp + CD_STACK_ARGS_OFFSET)))
		count_drop(CD_DROP_READ_FAULT);
	return true;
}

/* The innermost open return-probed call of this thread, popped; 0 if none.
 * Only a traced process's entries leave a thread in-flight calls. */
FUNC_INLINE struct cd_inflight *pop_inflight(struct cd_thread *st)
{
	__u32 d;

	if (!st || st->depth == 0 || st->depth > CD_MAX_INFLIGHT)
		return 0;
	d = st->depth - 1;
	st->depth = d;
	return &st->inflight[d & (CD_MAX_INFLIGHT - 1)];
}

#endif /* COMMDBG_LIB_THREAD_H */
