/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A probed call's entry: read once (registers, the stack words its cookie's
 * slots need, its process's flags) into a `struct entry` that every later
 * step is given.  The cookie (events.h) says which symbol fired and which
 * argument slot holds what.
 */
#ifndef COMMDBG_LIB_ENTRY_H
#define COMMDBG_LIB_ENTRY_H

#include "lib/process.h"
#include "arch_x86.h"

struct entry {
	__u64 cookie;
	__u64 ts; /* 0 unless kept: records, communicator creation */
	__u64 ip;
	__u64 sp;
	__u64 args[CD_NUM_ARGS]; /* registers, then the stack words a slot needs */
	__u32 tgid;
	__u32 tid;
	__u32 flags; /* CD_TRACE_* */
	__u32 role;
	__u32 group_depth;
	__u32 frame_depth;
	__u32 nested; /* a collective inside an open collective of its thread (cd_count_val) */
	__u32 entry_flags; /* CD_ENTRY_* */
	__u32 gen;	   /* traced_gen when flags were read */
};

FUNC_INLINE bool wants_records(const struct entry *en)
{
	return en->flags & CD_TRACE_RECORDS;
}

FUNC_INLINE __u64 slot_arg(const __u64 *args, __u32 slot)
{
	return slot < CD_NUM_ARGS ? args[slot & 7] : 0;
}

/* Fills `en`; returns false when the call is neither counted nor recorded.
 * `st`: the thread's state where already looked up. */
FUNC_INLINE bool read_entry(struct pt_regs *ctx, struct entry *en, __u64 pid_tgid, __u64 cookie,
			    const struct cd_thread *st)
{
	bool stack;

	en->tgid = pid_tgid >> 32;
	en->tid = (__u32)pid_tgid;
	en->flags = entry_trace_flags(st, en->tgid, &en->gen);
	if (!en->flags)
		return false;
	en->cookie = cookie;
	en->role = CD_COOKIE_ROLE(en->cookie);
	en->frame_depth = CD_DEPTH_UNKNOWN;
	/* A time only where it is kept: records, and communicators' creation. */
	if (wants_records(en) || en->role == CD_ROLE_COMM_INIT || en->role == CD_ROLE_COMM_SPLIT)
		en->ts = bpf_ktime_get_ns();
	en->ip = PT_REGS_IP(ctx);
	en->sp = PT_REGS_SP(ctx);
	cd_read_reg_args(ctx, en->args);
	/* A user-memory read costs more than the rest of a recorded entry: only
	 * for a slot that is a stack word, and one only a record shows (NCCL's
	 * stream) only where the process asked for it. */
	stack = CD_COOKIE_STACK_COUNT(en->cookie) ||
		(wants_records(en) && (en->flags & CD_TRACE_STACK_ARGS) && CD_COOKIE_STACK_RECORD(en->cookie));
	if (stack && bpf_probe_read_user(&en->args[CD_REG_SLOTS], (CD_NUM_ARGS - CD_REG_SLOTS) * sizeof(__u64),
					 (void *)(en->sp + CD_STACK_ARGS_OFFSET)) == 0)
		en->entry_flags |= CD_ENTRY_STACK_ARGS;
	return true;
}

#endif /* COMMDBG_LIB_ENTRY_H */
